//! OpenAI's embeddings endpoint, `POST /v1/embeddings`, for the route that declares
//! `protocol = "openai-embeddings"` (at most one may; it keeps serving its own path too).
//!
//! `input` is a string or a list of strings; each string is a job whose payload is that string,
//! and the worker answers each with a list of numbers. The answer is OpenAI's:
//! `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`,
//! each embedding a list of floats or, with `encoding_format: "base64"`, the base64 of its
//! little-endian float32 bytes (what the `openai` package asks for by default, and decodes with
//! numpy's `frombuffer`). `model` is echoed back: the route serves one model, whatever it is
//! called. Token counts are the whitespace-separated words of the inputs: Corral has no tokenizer,
//! and clients read `usage` for accounting only.
//!
//! Errors are OpenAI's `{"error": {"message", "type", "code", "param"}}`, with the status a native
//! request would get; `code` is Corral's code word, `type` `invalid_request_error` for a 4xx and
//! `server_error` otherwise.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::format::Format;
use super::super::infer::{self, Received};
use super::super::routes::{error_response_with, json};
use super::super::{App, Body, Route};
use super::first_failure;
use crate::job::Outcome;

pub const EMBEDDINGS_PATH: &str = "/v1/embeddings";

/// The request as OpenAI documents it; fields Corral has no use for (`user`) are ignored.
#[derive(Deserialize)]
struct EmbeddingsRequest {
    input: Value,
    model: String,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<Value>,
}

pub async fn embeddings(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    if infer::request_format(request.headers()).map_err(infer::before_body)? != Format::Json {
        // A msgpack body: OpenAI's API is JSON only.
        let media_type = request.headers().get(http::header::CONTENT_TYPE);
        let media_type = media_type.and_then(|v| v.to_str().ok()).unwrap_or_default();
        return Err(infer::before_body(ApiError::unsupported_media_type(media_type)));
    }
    let Received { body, arrived, deadline, traffic } = infer::receive(app, route, request).await?;
    let request: EmbeddingsRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("the body is not an embeddings request: {e}"))
    })?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            let message = format!(r#"encoding_format must be "float" or "base64", not {other:?}"#);
            return Err(ApiError::bad_request(message));
        }
    };
    if request.dimensions.is_some() {
        return Err(ApiError::bad_request("dimensions is not supported: the worker decides"));
    }
    let inputs = strings(request.input)?;
    let tokens: usize = inputs.iter().map(|text| text.split_whitespace().count()).sum();
    let payloads = inputs.iter().map(|text| msgpack_str(text)).collect();
    let outcomes = infer::run_items(app, route, payloads, arrived, deadline, traffic).await?;
    first_failure(&outcomes, "input")?;
    let data = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| {
            let vector = vector(index, outcome)?;
            let embedding =
                if base64 { Value::String(encode_base64(&vector)) } else { json!(vector) };
            Ok(json!({"object": "embedding", "index": index, "embedding": embedding}))
        })
        .collect::<Result<Vec<Value>, ApiError>>()?;
    let answer = json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Ok(json(StatusCode::OK, answer.to_string()))
}

/// `input` as the strings it holds. Token arrays (lists of integers) would need the model's
/// tokenizer to mean anything to a worker that takes text: refused, with the reason.
fn strings(input: Value) -> Result<Vec<String>, ApiError> {
    let bad = |message: &str| ApiError::bad_request(message);
    let list = match input {
        Value::String(text) => vec![Value::String(text)],
        Value::Array(list) if list.is_empty() => return Err(bad("input must not be empty")),
        Value::Array(list) => list,
        _ => return Err(bad("input must be a string or a list of strings")),
    };
    list.into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::String(text) if text.is_empty() => {
                Err(bad(&format!("input {index} is an empty string")))
            }
            Value::String(text) => Ok(text),
            Value::Number(_) | Value::Array(_) => Err(bad(
                "token arrays are not supported: send the text as a string or a list of strings",
            )),
            _ => Err(bad(&format!("input {index} is not a string"))),
        })
        .collect()
}

fn msgpack_str(text: &str) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 5);
    rmp::encode::write_str(&mut out, text).expect("writing to a Vec cannot fail");
    Bytes::from(out)
}

/// A worker's answer for one input as float32s (OpenAI's embeddings are float32).
fn vector(index: usize, outcome: Outcome) -> Result<Vec<f32>, ApiError> {
    let Outcome::Done(data, _) = outcome else {
        unreachable!("first_failure let only results through")
    };
    rmp_serde::from_slice(&data).map_err(|_| {
        let message = format!("the worker's output for input {index} is not a list of numbers");
        ApiError::internal("bad_output", message)
    })
}

/// Standard base64 (with padding) of the vector's little-endian float32 bytes.
fn encode_base64(vector: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// OpenAI's error body.
pub fn error_response(error: &ApiError) -> Response<Body> {
    let kind =
        if error.status.is_client_error() { "invalid_request_error" } else { "server_error" };
    let body = json!({"error": {
        "message": error.message,
        "type": kind,
        "code": error.code,
        "param": null,
    }});
    error_response_with(error, body.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_standard_and_padded() {
        // 1.0f32 is 00 00 80 3f little-endian.
        assert_eq!(encode_base64(&[1.0]), "AACAPw==");
        assert_eq!(encode_base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(encode_base64(&[]), "");
    }

    #[test]
    fn token_arrays_are_refused_with_a_reason() {
        let error = strings(json!([[1, 2, 3]])).unwrap_err();
        assert!(error.message.contains("token arrays"), "{}", error.message);
        assert!(strings(json!([1, 2])).is_err());
        assert!(strings(json!([])).is_err());
        assert_eq!(strings(json!("a b")).unwrap(), ["a b"]);
    }
}
