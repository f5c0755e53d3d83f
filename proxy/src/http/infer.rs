//! `POST` to a route (`/infer` by default): a request becomes one job (or, with
//! `x-corral-items: many`, one job per array element) that goes through the route's pipeline, and
//! the jobs' answers become the response.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corral_protocol::JobId;
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::error::ApiError;
use super::events::Framing;
use super::format::{self, Format};
use super::items;
use super::{shed_error, stream, App, Body, Route};
use crate::job::Outcome;

/// Header with which a client shortens its job's deadline.
pub const TIMEOUT_HEADER: &str = "x-corral-timeout-ms";
/// Header that marks a request carrying several items (`many`) or one (`one`, the default).
pub const ITEMS_HEADER: &str = "x-corral-items";

pub async fn handle(
    app: &App,
    route: &Route,
    id: JobId,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let headers = request.headers();
    let input = request_format(headers)?;
    let streamed = Framing::requested(headers.get(ACCEPT));
    let output = match streamed {
        // The output format is moot for a stream (events are JSON) but for its plain errors.
        Some(_) => Format::Json,
        None => {
            format::negotiate(headers.get(ACCEPT), input).ok_or_else(ApiError::not_acceptable)?
        }
    };
    let many = carries_many(headers)?;
    let Received { body, arrived, deadline } = receive(app, route, request).await?;
    // The raw body goes into the conversion and, for JSON, ends there: a queued request holds
    // one copy of its payload.
    let payload = format::to_msgpack(input, body).map_err(ApiError::bad_request)?;
    if let Some(framing) = streamed {
        if many {
            let message = "a request of several items (x-corral-items: many) cannot be streamed";
            return Err(ApiError::bad_request(message));
        }
        check_payload_size(app, route, &payload)?;
        return stream::answer(app, route, id, payload, arrived, deadline, framing).await;
    }
    if !many {
        check_payload_size(app, route, &payload)?;
        let outcome = run(app, route, vec![(id, payload)], arrived, deadline).await?;
        return match outcome.into_iter().next().expect("one job, one outcome") {
            Outcome::Done(data) => ok(output, data),
            other => Err(ApiError::from_outcome(other)),
        };
    }

    let elements = items::split(&payload).map_err(ApiError::bad_request)?;
    let outcomes = run_items(app, route, elements, arrived, deadline).await?;
    let data = items::assemble(outcomes)?;
    ok(output, data)
}

/// The format a request's `Content-Type` names; a client that names none almost always means
/// JSON.
pub fn request_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    match headers.get(CONTENT_TYPE) {
        None => Ok(Format::Json),
        Some(value) => {
            let media_type = value.to_str().unwrap_or("");
            Format::from_media_type(media_type)
                .ok_or_else(|| ApiError::unsupported_media_type(media_type))
        }
    }
}

/// A request's body, read whole, and the job clock it started: what every envelope (native or
/// a protocol's) gets before it parses the body its own way.
pub struct Received {
    pub body: Bytes,
    pub arrived: Instant,
    /// The route's timeout, shortened by `x-corral-timeout-ms` if the client sent one.
    pub deadline: Instant,
}

/// Reads the body within the request's deadline and `--body-read-timeout-ms`, stopping at
/// `--max-body-bytes` (413).
pub async fn receive(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Received, ApiError> {
    let arrived = Instant::now();
    let headers = request.headers();
    let timeout = requested_timeout(headers)?.map_or(route.timeout, |t| t.min(route.timeout));
    let declared = declared_length(headers);
    let deadline = arrived + timeout;
    // No connection clock runs while a handler does (a slow body is not a slow head), so the
    // body gets its own, ending at the job's deadline at the latest.
    let read_by = deadline.min(arrived + app.body_read_timeout);
    let body = read_body(request.into_body(), app.max_body_bytes, declared, read_by)
        .await
        .map_err(|e| e.unwrap_or_else(|| ApiError::body_timeout(read_by - arrived)))?;
    Ok(Received { body, arrived, deadline })
}

/// Runs several payloads through the route as one request of several items: one job each,
/// admitted all or none, kept in one batch where they fit. Each payload must fit in a batch
/// frame and the lot in the smallest queue on the way (413 otherwise); a refusal at admission
/// is its 503. The outcomes come back in the payloads' order.
pub async fn run_items(
    app: &App,
    route: &Route,
    payloads: Vec<Bytes>,
    arrived: Instant,
    deadline: Instant,
) -> Result<Vec<Outcome>, ApiError> {
    for payload in &payloads {
        check_payload_size(app, route, payload)?;
    }
    let capacity = route.pipeline.capacity();
    if payloads.len() > capacity {
        return Err(ApiError::too_many_items(payloads.len(), capacity));
    }
    let jobs = payloads.into_iter().map(|payload| (JobId::new(), payload)).collect();
    run(app, route, jobs, arrived, deadline).await
}

/// Runs the jobs through the route's pipeline; a refusal at admission becomes its 503.
async fn run(
    app: &App,
    route: &Route,
    jobs: Vec<(JobId, Bytes)>,
    arrived: Instant,
    deadline: Instant,
) -> Result<Vec<Outcome>, ApiError> {
    route.pipeline.run(jobs, arrived, deadline, app.retries).await.map_err(shed_error)
}

fn ok(output: Format, data: Bytes) -> Result<Response<Body>, ApiError> {
    let body = format::from_msgpack(output, data)
        .map_err(|e| ApiError::internal("unrepresentable_output", e))?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, output.content_type())
        .body(Full::new(body).boxed_unsync())
        .expect("static headers are valid"))
}

/// A single payload must fit in one batch frame.
fn check_payload_size(app: &App, route: &Route, payload: &Bytes) -> Result<(), ApiError> {
    let limit = route.pipeline.first().settings().max_batch_bytes;
    if payload.len() <= limit {
        return Ok(());
    }
    let message = format!("an item is larger than {limit} bytes once encoded as msgpack");
    Err(ApiError { message, ..ApiError::body_too_large(app.max_body_bytes) })
}

fn requested_timeout(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let ms = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{TIMEOUT_HEADER} must be a positive whole number of milliseconds"
            ))
        })?;
    Ok(Some(Duration::from_millis(ms)))
}

fn carries_many(headers: &HeaderMap) -> Result<bool, ApiError> {
    match headers.get(ITEMS_HEADER).map(|v| v.to_str().map(str::trim)) {
        None => Ok(false),
        Some(Ok(v)) if v.eq_ignore_ascii_case("one") => Ok(false),
        Some(Ok(v)) if v.eq_ignore_ascii_case("many") => Ok(true),
        Some(_) => {
            Err(ApiError::bad_request(format!("{ITEMS_HEADER} must be \"one\" or \"many\"")))
        }
    }
}

/// The body's length as its `Content-Length` declares it, if it does.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// After a 413 the rest of the body is read and thrown away, up to this much, so that a client
/// still sending gets to read the answer instead of a connection reset. Beyond it, the connection
/// is simply closed.
const DRAIN_BYTES: usize = 4 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads the body by `read_by` (`Err(None)` after it), stopping (413) as soon as it passes the
/// limit rather than buffering it all. The buffer is sized once from a declared length; an undeclared one (chunked) grows by
/// doubling and is trimmed at the end if much of it is slack, since a queued job keeps the whole
/// allocation alive.
async fn read_body(
    mut body: Incoming,
    limit: usize,
    declared: Option<u64>,
    read_by: Instant,
) -> Result<Bytes, Option<ApiError>> {
    let too_large = Some(ApiError::body_too_large(limit));
    if declared.is_some_and(|length| length > limit as u64) {
        drain(body).await;
        return Err(too_large);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) =
        tokio::time::timeout_at(read_by, body.frame()).await.map_err(|_| None)?
    {
        let frame = frame
            .map_err(|e| Some(ApiError::bad_request(format!("could not read the body: {e}"))))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                drain(body).await;
                return Err(too_large);
            }
            buf.extend_from_slice(&data);
        }
    }
    if buf.capacity() - buf.len() > buf.len() / 8 {
        return Ok(Bytes::copy_from_slice(&buf));
    }
    Ok(buf.freeze())
}

async fn drain(mut body: Incoming) {
    let discard = async {
        let mut seen = 0;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
}
