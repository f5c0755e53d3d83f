//! KServe's v1 prediction protocol, served for every route under its model name (the route's
//! name in the config file, `default` for the default route):
//!
//! - `POST /v1/models/{name}:predict` with `{"instances": [...]}` answers `{"predictions": [...]}`,
//!   each instance a job (as the elements of a native request of several items are);
//! - `GET /v1/models/{name}` answers `{"name", "ready"}`: 200 once every stage of the route has a
//!   connected worker, else 503;
//! - `GET /v1/models` lists them: `{"models": [...]}`.
//!
//! Errors are `{"error": "<message>"}` with the status a native request would get; a failed
//! instance fails the request (v1 has no per-instance errors) and the message names its index.
//!
//! To a route whose first stage's workers declared input tensors, each instance goes as the row
//! a v2 request would make (a map from each input's name to its tensor value), so that a worker
//! reads its inputs alike whichever of the two a client spoke: with one input declared, the
//! instance is its value (or a map naming it); with several, a map naming each — v1's row
//! format, as TensorFlow Serving reads it, `{"b64": …}` objects in a `BYTES` input's value
//! included ([`b64`]). Predictions are written in the same format: where the last stage's
//! workers declared one output, each is that output's value; with several, a map naming each.

mod b64;

use bytes::Bytes;
use corral_protocol::TensorSpec;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::super::body::{self, Received};
use super::super::error::ApiError;
use super::super::format::{self, Format};
use super::super::infer;
use super::super::routes::json;
use super::super::{get_only, items, App, Body, Route};
use super::v2::tensor::{self, DataType};
use super::{
    declarations_unknown, first_failure, model_readiness, not_ready_yet, plain_error_response,
    unknown_model,
};
use crate::job::Outcome;
use crate::msgpack;

pub const PREFIX: &str = "/v1/models/";
/// KServe v1's list of the models served.
pub const MODELS_PATH: &str = "/v1/models";
const PREDICT: &str = ":predict";

pub struct Endpoint<'a> {
    /// The model as the path names it.
    name: String,
    /// The route of that name, if there is one (404 otherwise).
    route: Option<&'a Route>,
    predict: bool,
}

impl<'a> Endpoint<'a> {
    pub fn find(app: &'a App, path: &str) -> Option<Endpoint<'a>> {
        let rest = path.strip_prefix(PREFIX)?;
        let (name, predict) = match rest.strip_suffix(PREDICT) {
            Some(name) => (name, true),
            None => (rest, false),
        };
        if name.is_empty() || name.contains(['/', ':']) {
            return None;
        }
        let name = super::model_name(name);
        let route = app.model(&name);
        Some(Endpoint { name, route, predict })
    }

    /// The route label its metrics go under.
    pub fn label(&self) -> &'static str {
        if self.predict {
            "/v1/models/{name}:predict"
        } else {
            "/v1/models/{name}"
        }
    }

    pub async fn answer(
        self,
        app: &App,
        method: &Method,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let answer = match self.route {
            None => Err(unknown_model(&self.name)),
            Some(route) if self.predict => match app.admit(method, route) {
                Ok(()) => predict(app, route, request).await,
                Err(error) => Err(error),
            },
            Some(route) => get_only(method).map(|()| model_readiness(app, route)),
        };
        answer.unwrap_or_else(|error| plain_error_response(&error))
    }
}

// (A msgpack body's map is its object: the words fit both.)
const NO_INSTANCES: &str = r#"the body must be an object with an "instances" array"#;

async fn predict(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let input = body::request_format(request.headers()).map_err(body::before_body)?;
    body::check_encoding(request.headers()).map_err(body::before_body)?;
    // What an instance is depends on the first stage's declarations: before any worker has
    // connected they are not known, and a plain list queued now would reach a worker that
    // declares tensors as a list (every instance 500). Not ready yet, as v2 says then too. A
    // worker that connected without declarations takes plain values (restarting, too).
    if declarations_unknown(route) {
        return Err(body::before_body(not_ready_yet(format!(
            "model {:?} has no worker yet: what its instances are is known once one connects",
            route.model
        ))));
    }
    let content_type = request.headers().get(http::header::CONTENT_TYPE).cloned();
    let Received { body, deadline, mut traffic, .. } = body::receive(app, route, request).await?;
    // Its instances are read against the tensors declared once its body is in (read before its
    // upload, a change during a slow one gave a needless 503 `tensors_changed`), or as plain
    // values.
    let ends = route.pipeline.declared_ends();
    traffic.tensors = Some(ends.epoch);
    let body_len = body.len();
    let refused = |problem: format::Unreadable, body: &[u8]| {
        ApiError::or_charset(ApiError::bad_request(problem), content_type.as_ref(), body)
    };
    // Every number of an instance for a worker that declares tensors becomes an element of
    // its input's datatype: an integer past 64 bits is a float there (an FP64 input takes
    // 1e20), as in v2's JSON.
    let tensors = !ends.inputs().is_empty();
    let payload = {
        // The body, read again on the error path alone (for its `charset`'s 415); dropped once
        // transcoded, as the body itself is.
        let sent = (input == Format::Json).then(|| body.clone());
        format::to_msgpack_with(input, body, !tensors)
            .map_err(|problem| refused(problem, sent.as_deref().unwrap_or_default()))?
    };
    let instances = match items::field(&payload, "instances") {
        Ok(Some(instances)) => instances,
        // TF Serving's columnar form: the 400 had said only that `instances` was missing.
        Ok(None) if items::field(&payload, "inputs").is_ok_and(|inputs| inputs.is_some()) => {
            let message = format!(
                "{NO_INSTANCES}: the columnar \"inputs\" form is not taken; send one element of \
                 \"instances\" per row"
            );
            return Err(ApiError::bad_request(message));
        }
        Ok(None) => return Err(ApiError::bad_request(NO_INSTANCES)),
        // A body that is no object at all: the words above say it (the reader's own, "the
        // body must be an object", had followed them in brackets).
        Err(_) if rmp::decode::read_map_len(&mut &payload[..]).is_err() => {
            return Err(ApiError::bad_request(NO_INSTANCES))
        }
        Err(why) => return Err(ApiError::bad_request(format!("{NO_INSTANCES} ({why})"))),
    };
    if let Some(count) = items::declared_len(&instances) {
        infer::check_item_count(route, count)?;
    }
    let rows = items::split(&instances).map_err(|_| ApiError::bad_request(NO_INSTANCES))?;
    if rows.is_empty() {
        return Err(ApiError::bad_request(r#""instances" is empty"#));
    }
    let rows = match ends.inputs() {
        [] => rows,
        inputs => as_tensors(app, rows, inputs, body_len)?,
    };
    let mut outcomes = infer::run_items(app, route, rows, deadline, traffic).await?;
    // Held to the outputs the last stage's workers declared, as a v2 answer is: one that is
    // not them is the worker's fault, not a prediction.
    // (Read as the request came, with its inputs, as v2's and OpenAI's are.)
    if let Some(declared) = ends.last.filter(|d| !d.outputs.is_empty()) {
        check_outputs(&declared.outputs, &outcomes)?;
        if let [lone] = &declared.outputs[..] {
            outcomes =
                outcomes.into_iter().map(|outcome| lone_value(outcome, &lone.name)).collect();
        }
    }
    Ok(json(StatusCode::OK, predictions(outcomes)?))
}

/// The instances as rows of the declared `inputs` (see the module's head); 400 naming the first
/// that is not one, 413 if packed they would take more than 4x the body plus 1 MiB (a one-byte
/// msgpack integer is eight bytes of FP64), as a v2 request's rows may.
fn as_tensors(
    app: &App,
    instances: Vec<Bytes>,
    inputs: &[TensorSpec],
    body_len: usize,
) -> Result<Vec<Bytes>, ApiError> {
    let allowed = 4 * body_len as u128 + super::v2::MIN_ROWS_ALLOWANCE;
    let mut taken = 0u128;
    let mut rows = Vec::with_capacity(instances.len());
    for (index, instance) in instances.iter().enumerate() {
        let row = as_row(instance, inputs)
            .map_err(|e| ApiError::bad_request(format!("instance {index}: {e}")))?;
        taken += row.len() as u128;
        if taken > allowed {
            let message = format!(
                "as tensors, the instances would take more than 4x the body plus 1 MiB \
                 ({allowed} bytes): send fewer instances"
            );
            return Err(ApiError { message, ..ApiError::body_too_large(app.max_body_bytes) });
        }
        rows.push(row);
    }
    Ok(rows)
}

/// One instance as `{name: tensor value}` for each of `inputs`.
fn as_row(instance: &[u8], inputs: &[TensorSpec]) -> Result<Bytes, String> {
    let names = || inputs.iter().map(|s| format!("{:?}", s.name)).collect::<Vec<_>>().join(", ");
    let mut map = instance;
    // A lone input's value may itself be an object: TensorFlow Serving's `{"b64": …}`.
    let lone_b64 = inputs.len() == 1 && inputs[0].name != "b64" && b64::is_b64(instance);
    let values: Vec<&[u8]> = match rmp::decode::read_map_len(&mut map) {
        _ if lone_b64 => vec![instance],
        Err(_) if inputs.len() == 1 => vec![instance],
        Err(_) => return Err(format!("must be an object naming the model's inputs, {}", names())),
        Ok(len) => {
            let mut seen: Vec<&str> = Vec::with_capacity(inputs.len());
            for _ in 0..len {
                let name = rmp::decode::read_str_from_slice(map)
                    .map(|(name, _)| name)
                    .map_err(|_| "a key that is not a string".to_string())?;
                if !inputs.iter().any(|s| s.name == name) {
                    return Err(format!("unknown input {name:?}; the model takes {}", names()));
                }
                // As a v2 request's: the first would be taken, the second dropped unseen.
                if seen.contains(&name) {
                    return Err(format!("input {name:?} appears twice"));
                }
                seen.push(name);
                msgpack::skip(&mut map)?;
                msgpack::skip(&mut map)?;
            }
            let mut values = Vec::with_capacity(inputs.len());
            for spec in inputs {
                let Some(at) = msgpack::after_key(instance, &spec.name)? else {
                    return Err(format!("missing input {:?}", spec.name));
                };
                let mut rest = at;
                msgpack::skip(&mut rest)?;
                values.push(&at[..at.len() - rest.len()]);
            }
            values
        }
    };
    let mut out = Vec::with_capacity(instance.len() * 2);
    let len = u32::try_from(inputs.len()).map_err(|_| "too many inputs".to_string())?;
    rmp::encode::write_map_len(&mut out, len).expect("writing to a Vec cannot fail");
    for (spec, value) in inputs.iter().zip(values) {
        let at = |e: String| format!("input {:?}: {e}", spec.name);
        let datatype = DataType::parse(&spec.datatype).map_err(at)?;
        let value = match datatype {
            DataType::Bytes => b64::decoded(value).map_err(at)?,
            _ => std::borrow::Cow::Borrowed(value),
        };
        let row = tensor::row(&value, Some(datatype)).map_err(at)?;
        if !tensor::fits(&row.shape, &spec.shape) {
            let shape = tensor::shown(&row.shape);
            return Err(at(format!("has shape {shape}; the model takes {:?}", spec.shape)));
        }
        rmp::encode::write_str(&mut out, &spec.name).expect("writing to a Vec cannot fail");
        tensor::write_tensor(&mut out, datatype, &row.shape, &row.data);
    }
    Ok(Bytes::from(out))
}

/// 500 `bad_output` naming the first instance whose result is not the declared `outputs`; an
/// instance that failed before it is left to [`predictions`], which answers the first failure.
fn check_outputs(outputs: &[TensorSpec], outcomes: &[Outcome]) -> Result<(), ApiError> {
    for (index, outcome) in outcomes.iter().enumerate() {
        let Outcome::Done(data, _) = outcome else { break };
        super::v2::response::check_row(outputs, data)
            .map_err(|e| ApiError::internal("bad_output", format!("instance {index}: {e}")))?;
    }
    Ok(())
}

/// The error of a request's items as v1's shape can carry it: its first failed item, named by
/// its index (v1's body is a message alone; "1 of 1 items failed" had said nothing of why).
fn first_item(error: ApiError) -> ApiError {
    let first = error.items.as_ref().and_then(|items| items.first());
    let Some((index, message)) =
        first.and_then(|item| Some((item["index"].as_u64()?, item["message"].as_str()?)))
    else {
        return error;
    };
    ApiError { message: format!("instance {index}: {message}"), items: None, ..error }
}

/// A result of a model with one declared output as TensorFlow Serving's row format writes it:
/// the output's value, its name left out (with several, each prediction names them), as a lone
/// input's instance may be its value ([`as_row`]). A TFS client reading `predictions[i]` as the
/// vector had got `{"Y": [...]}`. The value is a slice of the result, not a copy; a result
/// [`check_outputs`] passed holds it.
fn lone_value(outcome: Outcome, name: &str) -> Outcome {
    let Outcome::Done(data, media_type) = outcome else { return outcome };
    let value = msgpack::after_key(&data, name).ok().flatten().and_then(|at| {
        let mut rest = at;
        msgpack::skip(&mut rest).ok()?;
        Some(data.slice_ref(&at[..at.len() - rest.len()]))
    });
    Outcome::Done(value.unwrap_or(data), media_type)
}

/// The instances' outcomes as v1's JSON answer, `{"predictions": [...]}`, or the first failure.
pub(crate) fn predictions(outcomes: Vec<Outcome>) -> Result<Bytes, ApiError> {
    first_failure(&outcomes, "instance")?;
    // Around each result: the predictions' array, the answer's map, and a `{"b64": …}` map
    // where a `bin` is.
    let mut predictions = items::as_sent(outcomes, 3).map_err(first_item)?;
    // Bytes as TensorFlow Serving writes them (`b64`), tensors' `BYTES` elements that are not
    // UTF-8 included (expanded first: they are `bin`s then). Rewritten only where a walk finds
    // one: most answers hold none, and a copy of each (4 MB ones) would be for nothing.
    let mut found = msgpack::scan(&predictions);
    if found.ext {
        let plain = tensor::expand(&predictions).map_err(|e| {
            let why =
                format!("the worker's output has a tensor value that is not well formed: {e}");
            ApiError::internal("bad_output", why)
        })?;
        predictions = Bytes::from(plain);
        found = msgpack::scan(&predictions);
    }
    if found.bin {
        let encoded =
            b64::encoded(&predictions).map_err(|e| ApiError::internal("bad_output", e))?;
        predictions = Bytes::from(encoded);
    }
    // A one-entry map around the results' array, which is copied once, into the JSON.
    let mut data = Vec::with_capacity(16);
    rmp::encode::write_map_len(&mut data, 1).expect("writing to a Vec cannot fail");
    rmp::encode::write_str(&mut data, "predictions").expect("writing to a Vec cannot fail");
    let data = Bytes::from([&data[..], &predictions[..]].concat());
    format::from_msgpack(Format::Json, data).map_err(|e| {
        // One conversion for the whole answer; only when it fails are the instances looked at
        // one by one, for the message to name the first that JSON cannot carry (v1 answers in
        // JSON whatever the client accepts: no other format to offer).
        let bad = |row: Bytes| format::from_msgpack(Format::Json, row).is_err();
        let index = items::split(&predictions).ok().and_then(|rows| rows.into_iter().position(bad));
        let message = match index {
            Some(index) => format!("instance {index}: {e}"),
            None => e.to_string(),
        };
        e.into_error_saying(message)
    })
}

/// `{"models": [...]}`: the model names, one per route, as KServe v1's list answers them.
pub fn models(app: &App) -> Response<Body> {
    let names: Vec<&str> = app.routes.iter().map(|route| route.model.as_str()).collect();
    json(StatusCode::OK, serde_json::json!({ "models": names }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_whose_result_cannot_be_a_prediction_is_named_with_why() {
        // 128 levels, one more inside the predictions' array: it said "1 of 2 items failed".
        let deep = Bytes::from([&vec![0x91; msgpack::MAX_DEPTH][..], &[0xc0]].concat());
        let fine = Bytes::from_static(&[0x01]);
        let outcomes = vec![Outcome::Done(fine, None), Outcome::Done(deep, None)];
        let error = predictions(outcomes).unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (500, "unrepresentable_output"));
        assert!(
            error.message.starts_with("instance 1: the worker's output is nested"),
            "{}",
            error.message
        );
        assert!(error.items.is_none());
        // Two levels less is still past, inside the answer's map and a `b64` map: it had
        // passed, and the whole answer was refused naming no instance.
        let deep = Bytes::from([&vec![0x91; msgpack::MAX_DEPTH - 2][..], &[0xc0]].concat());
        let error = predictions(vec![Outcome::Done(deep, None)]).unwrap_err();
        let named = "instance 0: the worker's output is nested 126 levels deep";
        assert!(error.message.starts_with(named), "{}", error.message);
        let shallow = Bytes::from([&vec![0x91; msgpack::MAX_DEPTH - 3][..], &[0xc0]].concat());
        assert!(predictions(vec![Outcome::Done(shallow, None)]).is_ok());
    }
}
