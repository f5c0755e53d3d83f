//! OpenAI's embeddings endpoint, `POST /v1/embeddings`, for the route that declares
//! `protocol = "openai-embeddings"` (at most one may; it keeps serving its own path too).
//!
//! `input` is a string or a list of strings; each string is a job whose payload is that string,
//! and the worker answers each with a list of numbers (to a worker that declares tensors, the
//! string and the numbers go as tensors: [`declared`]). The answer is OpenAI's:
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

use std::cell::Cell;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;

use super::super::body::{self, Received};
use super::super::error::ApiError;
use super::super::format::{self, Format};
use super::super::infer;
use super::super::routes::{error_response_with, json};
use super::super::{App, Body, Route};
use super::v2::result_row::{self, Found, ResultRow};
use super::v2::tensor;
use super::{declarations_unknown, first_failure, not_ready_yet};
use crate::job::Outcome;
use corral_protocol::TensorSpec;

mod declared;

pub const EMBEDDINGS_PATH: &str = "/v1/embeddings";

/// The request as OpenAI documents it; fields Corral has no use for (`user`) are checked as
/// OpenAI checks them, and ignored.
#[derive(Deserialize)]
struct EmbeddingsRequest<'a> {
    /// Read on its own, with a bound on its length ([`bounded`]).
    #[serde(borrow)]
    input: &'a RawValue,
    model: String,
    #[serde(default)]
    encoding_format: Option<String>,
    /// Refused when given; read past, not built.
    #[serde(default)]
    dimensions: Option<IgnoredAny>,
    /// A string (or null), as OpenAI's API refuses another value; not kept.
    #[serde(default, rename = "user")]
    _user: Option<User>,
}

/// `user`'s value, read as a string and not kept.
struct User;

impl<'de> Deserialize<'de> for User {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<User, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = User;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<User, E> {
                Ok(User)
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// Whether a field's value is of its type.
type Fits = fn(&RawValue) -> bool;

/// The request's fields as OpenAI names them, each with whether `value` is of its type: what
/// [`not_a_request`] names when serde could not read the body.
const FIELDS: [(&str, Fits); 5] = [
    ("input", |_| true),
    ("model", |v| serde_json::from_str::<String>(v.get()).is_ok()),
    ("encoding_format", |v| serde_json::from_str::<Option<String>>(v.get()).is_ok()),
    ("dimensions", |_| true),
    ("user", |v| serde_json::from_str::<Option<User>>(v.get()).is_ok()),
];

/// The 400 for a body (a JSON object) serde could not read as an [`EmbeddingsRequest`], its
/// message starting with the field it is about, where it is about one, for `param` ([`param`]):
/// serde names a missing or repeated field in its message, but not one of the wrong type, and
/// both had come with `param: null`. Only on this error path is the body read a second time.
fn not_a_request(body: &[u8], e: serde_json::Error) -> ApiError {
    let said = e.to_string();
    let named = FIELDS.iter().find(|(name, _)| said.contains(&format!("field `{name}`")));
    let field = named.map(|(name, _)| *name).or_else(|| {
        let fields: std::collections::HashMap<String, &RawValue> =
            serde_json::from_slice(body).ok()?;
        let wrong =
            |(name, fits): &(&str, Fits)| fields.get(*name).is_some_and(|value| !fits(value));
        FIELDS.iter().find(|field| wrong(field)).map(|(name, _)| *name)
    });
    let missing = said.starts_with("missing field");
    let message = match field {
        Some(field) if missing => format!("{field} is required: {e}"),
        Some(field) => format!("{field} is not valid: {e}"),
        None => format!("the body is not an embeddings request: {e}"),
    };
    ApiError::bad_request(message)
}

pub async fn embeddings(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    if body::request_format(request.headers()).ok() != Some(Format::Json) {
        // A msgpack body, or any other: OpenAI's API is JSON only (the shared refusal offered
        // msgpack, which this endpoint then refused).
        let message = "Content-Type must be application/json: OpenAI's API is JSON only";
        let error = ApiError { message: message.into(), ..ApiError::unsupported_media_type("") };
        return Err(body::before_body(error));
    }
    // What a string becomes depends on the first stage's declarations, and where its embedding
    // is on the last's: before their workers have connected they are not known (a bare string
    // queued then reached a worker that declares tensors, every input 500; an embedding was
    // read as the whole result). Not ready yet, as KServe v1's predict says then.
    if declarations_unknown(route) {
        return Err(body::before_body(not_ready_yet(format!(
            "model {:?} has no worker yet: what its inputs are is known once one connects",
            route.model
        ))));
    }
    let content_type = request.headers().get(http::header::CONTENT_TYPE).cloned();
    let Received { body, deadline, mut traffic, .. } = body::receive(app, route, request).await?;
    // Its strings are read against the tensors declared once its body is in (read before its
    // upload, a change during a slow one gave a needless 503 `tensors_changed`), or as plain
    // values.
    let ends = route.pipeline.declared_ends();
    let input = declared::Input::of(ends.first.as_deref())?;
    let output = declared::output(ends.last.as_deref());
    traffic.tensors = Some(ends.epoch);
    // Every byte, not only those of the fields serde reads (it skips unknown ones unchecked):
    // serde's "invalid unicode code point" had said nothing of why, and an unknown field took
    // any bytes. 415 for a body in another encoding its `charset` names, as on every route.
    if format::begins_with_bom(&body) {
        return Err(ApiError::bad_request(format::BOM));
    }
    let text = match format::utf8_text(&body) {
        Ok(text) => text,
        Err(detail) => {
            let error = ApiError::bad_request(format::Unreadable::NotUtf8(detail));
            return Err(ApiError::or_charset(error, content_type.as_ref(), &body));
        }
    };
    // serde takes a struct from an array of its fields too (`["text", "model"]`): only an
    // object is an embeddings request.
    if body.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        let error = ApiError::bad_request("the body must be a JSON object: an embeddings request");
        return Err(error);
    }
    let request: EmbeddingsRequest<'_> =
        serde_json::from_str(text).map_err(|e| not_a_request(&body, e))?;
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
    let inputs = strings(request.input, route.pipeline.capacity())?;
    let tokens: usize = inputs.iter().map(|text| text.split_whitespace().count()).sum();
    let payloads = (inputs.iter().enumerate())
        .map(|(index, text)| input.payload(index, text))
        .collect::<Result<Vec<Bytes>, ApiError>>()?;
    let outcomes = infer::run_items(app, route, payloads, deadline, traffic).await?;
    first_failure(&outcomes, "input")?;
    let data = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| embedding(index, outcome, output.as_ref(), base64))
        .collect::<Result<Vec<Embedding>, ApiError>>()?;
    let usage = Usage { prompt_tokens: tokens, total_tokens: tokens };
    let answer = Answer { object: "list", data, model: &request.model, usage };
    let body = serde_json::to_vec(&answer).expect("an answer of strings and finite numbers");
    Ok(json(StatusCode::OK, body))
}

/// The answer, in OpenAI's key order, written straight into its body: as a `serde_json::Value`
/// tree (every float a `Number`, printed through `Display`) it was half the proxy's time on
/// this path.
#[derive(Serialize)]
struct Answer<'a> {
    object: &'static str,
    data: Vec<Embedding>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// One input's entry of `data`.
#[derive(Serialize)]
pub(crate) struct Embedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

/// An embedding as the client asked: float32s, written as float32 (shortest form that reads
/// back to the same float32, as OpenAI and TEI write them; widened to f64 they took 1.75 times
/// the text and twice the time), or the base64 of their bytes.
#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

/// One element of `input` as read: only a string is kept; anything else is read past, not built
/// (a list of 7.5M numbers as a `serde_json::Value` took 500 MiB for its 400).
enum Item {
    Text(String),
    /// A whole number or a list of them: a token array's element (or a token array).
    Token,
    Other,
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(reader: D) -> Result<Self, D::Error> {
        struct Read;
        impl<'de> Visitor<'de> for Read {
            type Value = Item;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an input")
            }
            fn visit_str<E>(self, text: &str) -> Result<Item, E> {
                Ok(Item::Text(text.to_string()))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Item, E> {
                Ok(Item::Token)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Item, E> {
                Ok(Item::Token)
            }
            // A token is a whole number: a float is no token ("token arrays are not
            // supported" had been said of `[1.5]`), only not a string.
            fn visit_f64<E>(self, _: f64) -> Result<Item, E> {
                Ok(Item::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Item, A::Error> {
                // A token array holds numbers; a list of strings (or of lists) in a list is
                // no input at all (it had been told token arrays are not supported).
                let mut numbers = true;
                while let Some(number) = items.next_element::<Number>()? {
                    numbers &= number.0;
                }
                Ok(if numbers { Item::Token } else { Item::Other })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Item, A::Error> {
                while entries.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Item::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Item, E> {
                Ok(Item::Other)
            }
            fn visit_unit<E>(self) -> Result<Item, E> {
                Ok(Item::Other)
            }
        }
        reader.deserialize_any(Read)
    }
}

/// Whether a value is a whole number (a token); anything else is read past.
struct Number(bool);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(reader: D) -> Result<Self, D::Error> {
        struct Read;
        impl<'de> Visitor<'de> for Read {
            type Value = Number;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a token")
            }
            fn visit_u64<E>(self, _: u64) -> Result<Number, E> {
                Ok(Number(true))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Number, E> {
                Ok(Number(true))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Number, E> {
                Ok(Number(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<Number, E> {
                Ok(Number(false))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Number, E> {
                Ok(Number(false))
            }
            fn visit_unit<E>(self) -> Result<Number, E> {
                Ok(Number(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Number, A::Error> {
                while items.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Number(false))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Number, A::Error> {
                while entries.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Number(false))
            }
        }
        reader.deserialize_any(Read)
    }
}

/// `input` as the strings it holds. A list of more elements than the route's queue holds is
/// refused (413) as soon as its first one too many is read: read whole first, 4M one-character
/// strings took 780 MiB before their 413. Token arrays (lists of integers) would need the
/// model's tokenizer to mean anything to a worker that takes text: refused, with the reason.
fn strings(input: &RawValue, max: usize) -> Result<Vec<String>, ApiError> {
    struct Bounded<'a> {
        max: usize,
        over: &'a Cell<bool>,
    }
    impl<'de> Visitor<'de> for Bounded<'_> {
        type Value = Vec<Item>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Item>, A::Error> {
            let mut list = Vec::new();
            while let Some(item) = seq.next_element::<Item>()? {
                if list.len() == self.max {
                    self.over.set(true);
                    return Err(serde::de::Error::custom("too many inputs"));
                }
                list.push(item);
            }
            Ok(list)
        }
    }
    let bad = |message: &str| ApiError::bad_request(message);
    let read = |e: serde_json::Error| ApiError::bad_request(format!("input is not JSON: {e}"));
    let list = if input.get().starts_with('[') {
        let over = Cell::new(false);
        let mut reader = serde_json::Deserializer::from_str(input.get());
        match serde::Deserializer::deserialize_seq(&mut reader, Bounded { max, over: &over }) {
            Ok(list) => list,
            Err(_) if over.get() => {
                // Starting with the field's name, as every error that names one (`param`).
                let message = format!("input holds more than {max} items; the queue holds {max}");
                return Err(ApiError { message, ..ApiError::too_many_items(max + 1, max) });
            }
            Err(e) => return Err(read(e)),
        }
    } else {
        match serde_json::from_str::<Item>(input.get()).map_err(read)? {
            Item::Text(text) => vec![Item::Text(text)],
            _ => return Err(bad("input must be a string or a list of strings")),
        }
    };
    if list.is_empty() {
        return Err(bad("input must not be empty"));
    }
    // A list of numbers, or of lists, is OpenAI's token arrays; a number among strings is not.
    if list.iter().all(|item| matches!(item, Item::Token)) {
        return Err(bad(
            "token arrays are not supported: send the text as a string or a list of strings",
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Item::Text(text) if text.is_empty() => {
                Err(bad(&format!("input {index} is an empty string")))
            }
            Item::Text(text) => Ok(text),
            _ => Err(bad(&format!("input {index} is not a string"))),
        })
        .collect()
}

/// One input's entry of `data`: its vector (the result, or its `output` where the workers
/// declare outputs) as JSON numbers or as base64.
pub(crate) fn embedding(
    index: usize,
    outcome: Outcome,
    output: Option<&TensorSpec>,
    base64: bool,
) -> Result<Embedding, ApiError> {
    let vector = vector(index, outcome, output)?;
    if !base64 && vector.iter().any(|x| !x.is_finite()) {
        // serde_json would write `null`s: a client would read no number, or NaN.
        let message = format!(
            "the worker's output for input {index} holds NaN or infinity, which JSON cannot \
             carry: ask for encoding_format \"base64\""
        );
        return Err(ApiError::internal("unrepresentable_output", message));
    }
    let embedding =
        if base64 { Vector::Base64(encode_base64(&vector)) } else { Vector::Floats(vector) };
    Ok(Embedding { object: "embedding", index, embedding })
}

/// A worker's answer for one input as float32s (OpenAI's embeddings are float32): numbers in
/// an array (or nested arrays), or a tensor value of them, their elements in order whatever the
/// shape; with `output` declared, that key of the result, held to its declared datatype and
/// shape as a v2 answer is (an INT8 output of 300 is the worker's fault, not an embedding).
fn vector(
    index: usize,
    outcome: Outcome,
    output: Option<&TensorSpec>,
) -> Result<Vec<f32>, ApiError> {
    let Outcome::Done(data, _) = outcome else {
        unreachable!("first_failure let only results through")
    };
    let bad = |message: String| ApiError::internal("bad_output", message);
    let not_numbers =
        || bad(format!("the worker's output for input {index} is not a list of numbers"));
    // Looked up as a v2 answer looks a row's output up: a result that names it twice (a
    // msgpack map may) is the worker's fault too, not its first value.
    let entries;
    let value = match output {
        None => &data[..],
        Some(spec) => {
            let name = &spec.name;
            let whose = format!("the worker's output for input {index}");
            entries = result_row::entries(&data)
                .ok_or_else(|| bad(format!("{whose} is not a map of its outputs")))?;
            match ResultRow::new(&entries).get(name) {
                Found::Once(value) => value,
                Found::Missing => return Err(bad(format!("{whose} has no {name:?}"))),
                Found::Twice => return Err(bad(format!("{whose} names {name:?} twice"))),
            }
        }
    };
    // Read as a v2 output row is (a tensor value, or numbers in nested arrays), its elements
    // in order: a `bin` reads as BYTES and a lone number has no dimension, neither a list of
    // numbers (rmp_serde had read a worker's raw float32 bytes as an embedding of byte values).
    let datatype = output.and_then(|spec| tensor::DataType::parse(&spec.datatype).ok());
    let row = tensor::row(value, datatype).map_err(|e| match output {
        Some(spec) => bad(format!("the worker's output {:?} for input {index}: {e}", spec.name)),
        None => not_numbers(),
    })?;
    if let Some(spec) = output.filter(|spec| !tensor::fits(&row.shape, &spec.shape)) {
        return Err(bad(format!(
            "the worker's output {:?} for input {index} has shape {}; {:?} is declared",
            spec.name,
            tensor::shown(&row.shape),
            spec.shape
        )));
    }
    if row.shape.is_empty() {
        return Err(not_numbers());
    }
    tensor::floats(row.datatype, &row.shape, &row.data).map_err(|why| match why {
        tensor::NotFloats::NotNumbers => not_numbers(),
        tensor::NotFloats::PastRange(wide) => bad(format!(
            "the worker's output for input {index} holds {wide:?}, past float32's range \
             (OpenAI's embeddings are float32)"
        )),
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
        "param": param(error),
    }});
    let mut response = error_response_with(error, body.to_string().into_bytes());
    if !worth_retrying(error) {
        response.headers_mut().insert("x-should-retry", http::HeaderValue::from_static("false"));
    }
    response
}

/// Whether the same request sent again could fare otherwise. The `openai` package retries a
/// 408, a 429 and every 5xx twice unless told `x-should-retry: false` (its own header, which it
/// obeys before the status): an output JSON cannot carry ran the work three times. Said only of
/// the answers the same input gets again whatever the load and the batch: an output of the
/// worker's that is no embedding or cannot be written, a model that cannot serve the route, and
/// Corral's own fault. Not of a 408 (a request admitted while no worker was connected, during a
/// restart, ends so, and its retry succeeds), nor of a `worker_error` (a batch-mate's input, or
/// the batch's size, may be what failed it), nor of a worker that died or a 503.
fn worth_retrying(error: &ApiError) -> bool {
    !matches!(
        error.code,
        "bad_output" | "unrepresentable_output" | "unsupported_model" | "internal"
    )
}

/// The request field a client error is about, for `param`: each message of this module about a
/// field starts with its name (a worker's refusal of one input, `input 1: …`, included).
fn param(error: &ApiError) -> Option<&'static str> {
    // A 408 is about time, not a field, though its message may name the input it was for.
    if !error.status.is_client_error() || error.status == http::StatusCode::REQUEST_TIMEOUT {
        return None;
    }
    if error.message.starts_with("token arrays") {
        return Some("input");
    }
    FIELDS
        .iter()
        .map(|(name, _)| *name)
        .find(|field| error.message.starts_with(&format!("{field} ")))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::Value;

    use super::*;

    #[test]
    fn answers_the_same_input_gets_again_say_not_to_retry() {
        let told = |error: ApiError| {
            let response = error_response(&error);
            response.headers().get("x-should-retry").map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(told(ApiError::internal("bad_output", "no")), Some("false".into()));
        assert_eq!(told(ApiError::internal("unrepresentable_output", "no")), Some("false".into()));
        // A 408, a worker's failure of a batch, a worker that died, and a shed (its
        // Retry-After read by the package), may fare otherwise: left to the package's own rule.
        assert_eq!(told(ApiError::from_outcome(crate::job::Outcome::Expired)), None);
        assert_eq!(told(ApiError::internal("worker_error", "no")), None);
        assert_eq!(told(ApiError::internal("worker_died", "gone")), None);
        assert_eq!(told(ApiError::shutting_down()), None);
    }

    #[test]
    fn base64_is_standard_and_padded() {
        // 1.0f32 is 00 00 80 3f little-endian.
        assert_eq!(encode_base64(&[1.0]), "AACAPw==");
        assert_eq!(encode_base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(encode_base64(&[]), "");
    }

    #[test]
    fn token_arrays_are_refused_with_a_reason() {
        let strings = |input: Value| strings(&serde_json::value::to_raw_value(&input).unwrap(), 4);
        let error = strings(json!([[1, 2, 3]])).unwrap_err();
        assert!(error.message.contains("token arrays"), "{}", error.message);
        assert!(strings(json!([1, 2])).is_err());
        assert!(strings(json!([])).is_err());
        assert_eq!(strings(json!("a b")).unwrap(), ["a b"]);
        let mixed = strings(json!(["a", 1])).unwrap_err();
        assert_eq!(mixed.message, "input 1 is not a string", "not a token array");
        assert_eq!(
            strings(json!(["a", {"b": [1]}])).unwrap_err().message,
            "input 1 is not a string"
        );
        assert_eq!(strings(json!(["a", ""])).unwrap_err().message, "input 1 is an empty string");
        let number = strings(json!(7)).unwrap_err();
        assert_eq!(number.message, "input must be a string or a list of strings");
        // Lists of strings in a list are no token arrays: said to be no strings.
        let nested = strings(json!([["a", "b"]])).unwrap_err();
        assert_eq!(nested.message, "input 0 is not a string");
        assert_eq!(strings(json!([[[1]]])).unwrap_err().message, "input 0 is not a string");
        // Past the queue's room (here 4), refused as soon as the fifth is read.
        let over = strings(json!(["a", "b", "c", "d", "e"])).unwrap_err();
        assert_eq!((over.status.as_u16(), over.code), (413, "too_many_items"));
        assert_eq!(param(&over), Some("input"), "{}", over.message);
        // A 408 is about time, whatever input its message names.
        let late = ApiError {
            message: "input 0: deadline passed".into(),
            ..ApiError::deadline_exceeded()
        };
        assert_eq!(param(&late), None);
    }

    fn done(value: &impl serde::Serialize) -> Outcome {
        Outcome::Done(Bytes::from(rmp_serde::to_vec(value).unwrap()), None)
    }

    #[test]
    fn an_embedding_is_a_list_of_numbers_not_bytes() {
        assert_eq!(vector(0, done(&[1.5, -2.0]), None).unwrap(), [1.5, -2.0]);
        let mut bin = Vec::new();
        rmp::encode::write_bin(&mut bin, &[0, 0, 128, 63]).unwrap();
        let raw = Outcome::Done(Bytes::from(bin), None);
        let error = vector(3, raw, None).unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            ("bad_output", "the worker's output for input 3 is not a list of numbers")
        );
        assert!(vector(0, done(&"text"), None).is_err());
        let mut value = Vec::new();
        let data: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
        tensor::write_tensor(&mut value, tensor::DataType::F32, &[2], &data);
        assert_eq!(vector(0, Outcome::Done(Bytes::from(value), None), None).unwrap(), [0.5, 2.0]);
        // Whatever its shape, as a tensor value or nested arrays, its elements in order; a lone
        // number is no list.
        assert_eq!(vector(0, done(&[[1.0, 2.0]]), None).unwrap(), [1.0, 2.0]);
        assert_eq!(vector(0, done(&[[1], [2]]), None).unwrap(), [1.0, 2.0]);
        assert!(vector(0, done(&1.5), None).is_err());
        assert!(vector(0, done(&[true]), None).is_err());
        // A declared output is read from its key.
        let mut map = std::collections::BTreeMap::new();
        map.insert("TOKENS", vec![3.0]);
        map.insert("EMBEDDING", vec![0.25, 0.5]);
        let spec = |name: &str, datatype: &str, shape: &[i64]| TensorSpec {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
        };
        let embedding = spec("EMBEDDING", "FP32", &[2]);
        assert_eq!(vector(0, done(&map), Some(&embedding)).unwrap(), [0.25, 0.5]);
        let error = vector(4, done(&map), Some(&spec("E", "FP32", &[2]))).unwrap_err();
        assert_eq!(error.message, r#"the worker's output for input 4 has no "E""#);
        // Held to its declaration: a shape or a value it does not take is the worker's fault.
        let error = vector(1, done(&map), Some(&spec("EMBEDDING", "FP32", &[3]))).unwrap_err();
        assert_eq!(
            error.message,
            r#"the worker's output "EMBEDDING" for input 1 has shape [2]; [3] is declared"#
        );
        let mut integers = std::collections::BTreeMap::new();
        integers.insert("EMBEDDING", vec![300, 1]);
        let int8 = spec("EMBEDDING", "INT8", &[2]);
        let error = vector(0, done(&integers), Some(&int8)).unwrap_err();
        assert!(error.message.contains("does not fit in INT8"), "{}", error.message);
        integers.insert("EMBEDDING", vec![3, 1]);
        assert_eq!(vector(0, done(&integers), Some(&int8)).unwrap(), [3.0, 1.0]);
        // Named twice (a msgpack map may), as a v2 answer reads it: the worker's fault.
        let mut twice = Vec::new();
        rmp::encode::write_map_len(&mut twice, 2).unwrap();
        for value in [1.0, 2.0] {
            rmp::encode::write_str(&mut twice, "EMBEDDING").unwrap();
            rmp::encode::write_array_len(&mut twice, 1).unwrap();
            rmp::encode::write_f64(&mut twice, value).unwrap();
        }
        let twice = Outcome::Done(Bytes::from(twice), None);
        let error = vector(2, twice, Some(&spec("EMBEDDING", "FP32", &[1]))).unwrap_err();
        assert_eq!(error.message, r#"the worker's output for input 2 names "EMBEDDING" twice"#);
    }
}
