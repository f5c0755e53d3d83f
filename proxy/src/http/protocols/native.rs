//! Corral's own protocol, on every route (`POST /infer` by default): a request becomes one job
//! (or, with `x-corral-items: many`, one job per array element) that goes through the route's
//! pipeline, and the jobs' answers become the response, in the format the client accepts; with
//! `Accept: text/event-stream` or `application/x-ndjson`, the one job's answer is streamed
//! ([`super::super::stream`]).
//!
//! A body that is neither JSON nor msgpack (nor a form, which is almost always JSON sent without
//! its header: 415 with the fix) is raw bytes: one job whose payload is one msgpack `bin` holding
//! the body, read in place behind a reserved header ([`format::BIN32_HEADER`]), and whose
//! `content_type` is the request's. An output that is one msgpack `bin` goes back raw to a
//! client that accepts it ([`Negotiation`]).

use bytes::Bytes;
use corral_protocol::JobId;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::super::body::{self, before_body, Received};
use super::super::error::ApiError;
use super::super::events::Framing;
use super::super::format::{self, Answer, Format, Negotiation, Unreadable};
use super::super::infer::{check_item_count, check_payload_size, run, run_items};
use super::super::{items, stream, App, Body, Route};
use crate::job::Outcome;
use crate::msgpack;
use crate::pipeline::Input;

pub use super::super::deadline::TIMEOUT_HEADER;
/// Header that marks a request carrying several items (`many`) or one (`one`, the default).
pub const ITEMS_HEADER: &str = "x-corral-items";

/// The fields a native route reads once ([`super::super::head::refusal`]): what its body is,
/// and how many items it holds.
pub static SINGLE_FIELDS: [HeaderName; 2] = [CONTENT_TYPE, HeaderName::from_static(ITEMS_HEADER)];

pub async fn handle(
    app: &App,
    route: &Route,
    id: JobId,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let headers = request.headers();
    let kind = body_kind(headers.get(CONTENT_TYPE)).map_err(before_body)?;
    // Kept past the body's read for an unreadable body's message (a reference count, not a copy
    // of the bytes: the head's buffer is shared).
    let content_type = headers.get(CONTENT_TYPE).cloned();
    let accept = format::accept(headers);
    let streamed = Framing::requested(accept.as_ref());
    // A raw request's non-raw answers are JSON unless the client asks for msgpack.
    let format = match kind {
        BodyKind::Format(format) => format,
        BodyKind::Raw(_) => Format::Json,
    };
    let raw = matches!(kind, BodyKind::Raw(_));
    let negotiation = Negotiation::new(accept.as_ref(), format, raw);
    // The output format is moot for a stream (events are JSON) but for its plain errors.
    if streamed.is_none() && !negotiation.satisfiable() {
        return Err(before_body(ApiError::not_acceptable()));
    }
    let many = carries_many(headers).map_err(before_body)?;
    if many && raw {
        let message = "a body of raw bytes is one item: x-corral-items: many takes a JSON or \
                       msgpack array";
        return Err(before_body(ApiError::bad_request(message)));
    }
    let front = if raw { format::BIN32_HEADER } else { 0 };
    let (Received { body, arrived, deadline, traffic }, _) =
        body::receive_with(app, route, request, front, None).await?;
    // The raw body goes into the conversion and, for JSON, ends there: a queued request holds
    // one copy of its payload. Raw bytes are one msgpack value already, header and all.
    let input = match kind {
        BodyKind::Format(format) => {
            let payload = format::to_msgpack(format, body)
                .map_err(|problem| unreadable(content_type.as_ref(), problem))?;
            Input::new(id, payload)
        }
        BodyKind::Raw(content_type) => {
            Input { id, payload: body.into(), content_type: Some(content_type) }
        }
    };
    if let Some(framing) = streamed {
        if many {
            let message = "a request of several items (x-corral-items: many) cannot be streamed";
            return Err(ApiError::bad_request(message));
        }
        check_payload_size(app, route, input.size())?;
        return stream::answer(app, route, input, arrived, deadline, traffic, framing).await;
    }
    if !many {
        check_payload_size(app, route, input.size())?;
        let outcome = run(app, route, vec![input], deadline, traffic).await?;
        return match outcome.into_iter().next().expect("one job, one outcome") {
            Outcome::Done(data, content_type) => answer(&negotiation, data, content_type),
            other => Err(ApiError::from_outcome(other)),
        };
    }

    // The answer is an array, never raw bytes: its format is known before any job runs, and a
    // client that accepts neither JSON nor msgpack (`Accept: image/png`) is refused now, not
    // after its items ran for nothing.
    let format = negotiation.structured().ok_or_else(ApiError::not_acceptable)?;
    // A request of several items was read whole: its payload is one buffer, shared.
    let array = input.payload.to_bytes();
    if let Some(count) = items::declared_len(&array) {
        check_item_count(route, count)?;
    }
    let elements = items::split(&array).map_err(ApiError::bad_request)?;
    let outcomes = run_items(app, route, elements, deadline, traffic).await?;
    Ok(respond(format, items::assemble(outcomes, format)?))
}

/// What a native route's request body is.
enum BodyKind {
    /// JSON or msgpack.
    Format(Format),
    /// Raw bytes of this media type (the `Content-Type` value as sent).
    Raw(HeaderValue),
}

/// What a native route's `Content-Type` makes of its body: JSON (also when it names none: such a
/// client almost always means JSON), msgpack, or raw bytes of any other media type. A form is
/// refused (415, saying how to send JSON), and so is a value that is not a media type.
fn body_kind(content_type: Option<&HeaderValue>) -> Result<BodyKind, ApiError> {
    let Some(value) = content_type else {
        return Ok(BodyKind::Format(Format::Json));
    };
    let media_type = value.to_str().unwrap_or("");
    if let Some(format) = Format::of_body(media_type) {
        return Ok(BodyKind::Format(format));
    }
    if format::essence(media_type).eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(ApiError::unsupported_media_type(media_type));
    }
    format::media_type(media_type)
        .map(BodyKind::Raw)
        .ok_or_else(|| ApiError::not_a_media_type(&String::from_utf8_lossy(value.as_bytes())))
}

/// The answer to a body that is not what it was read as, in the client's terms where the
/// reader's alone would leave it guessing (serde's "expected value at line 1 column 1"): JSON
/// read from a body sent with no `Content-Type` (`requests.post(url, data=png)`), and a body
/// that is not UTF-8 whose `charset` names another encoding (415; one that reads as UTF-8 is
/// served whatever its `charset`, and one that is UTF-8 but no JSON is a 400 saying so). A byte
/// order mark is JSON meant as JSON, whatever its `Content-Type`: its message says all.
fn unreadable(content_type: Option<&HeaderValue>, problem: Unreadable) -> ApiError {
    let charset =
        content_type.and_then(|value| value.to_str().ok()).and_then(format::charset_is_not_utf8);
    match (&problem, content_type, charset) {
        (Unreadable::NotUtf8(_) | Unreadable::NotJson(_), None, _) => {
            ApiError::bad_request(format!(
            "{problem} (the request has no Content-Type, so its body was read as JSON; send raw \
             bytes with their media type, e.g. image/png)"
        ))
        }
        (Unreadable::NotUtf8(_), Some(_), Some(charset)) => ApiError::json_not_utf8(charset),
        _ => ApiError::bad_request(problem),
    }
}

/// The 200 for an output, in the form the client's `Accept` and the output allow (406 if none):
/// the bytes of a raw output as they are (a slice past the `bin` header, no copy), with the
/// worker's media type or `application/octet-stream`; otherwise JSON or msgpack.
fn answer(
    negotiation: &Negotiation,
    data: Bytes,
    content_type: Option<HeaderValue>,
) -> Result<Response<Body>, ApiError> {
    match negotiation.choose(&data, content_type.as_ref()) {
        None => Err(ApiError::not_acceptable()),
        Some(Answer::Format(format)) => ok(format, data),
        Some(Answer::Raw) => {
            let bytes = msgpack::bin_contents(&data)
                .ok_or_else(|| ApiError::internal("internal", "raw answer for a non-raw output"))?;
            let content_type =
                content_type.unwrap_or(HeaderValue::from_static(format::OCTET_STREAM));
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(CONTENT_TYPE, content_type)
                .body(Full::new(bytes).boxed_unsync())
                .expect("a checked media type is a valid header"))
        }
    }
}

fn ok(output: Format, data: Bytes) -> Result<Response<Body>, ApiError> {
    let body = format::from_msgpack(output, data).map_err(format::unrepresentable_for_native)?;
    Ok(respond(output, body))
}

/// A 200 whose body is written in `format` already.
fn respond(format: Format, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, format.content_type())
        .body(Full::new(body).boxed_unsync())
        .expect("static headers are valid")
}

fn carries_many(headers: &HeaderMap) -> Result<bool, ApiError> {
    // Looked up by name: a `&str` is parsed into a name at every lookup.
    static ITEMS: HeaderName = HeaderName::from_static(ITEMS_HEADER);
    match headers.get(&ITEMS).map(|v| v.to_str().map(str::trim)) {
        None => Ok(false),
        Some(Ok(v)) if v.eq_ignore_ascii_case("one") => Ok(false),
        Some(Ok(v)) if v.eq_ignore_ascii_case("many") => Ok(true),
        Some(_) => {
            Err(ApiError::bad_request(format!("{ITEMS_HEADER} must be \"one\" or \"many\"")))
        }
    }
}
