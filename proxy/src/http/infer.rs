//! `POST /infer`: one request becomes one job, and the job's one answer becomes the response.

use std::time::Duration;

use bytes::Bytes;
use corral_protocol::JobId;
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::error::ApiError;
use super::format::{self, Format};
use super::App;
use crate::job::{Job, Outcome};
use crate::stage::Shed;

/// Header with which a client shortens its job's deadline.
pub const TIMEOUT_HEADER: &str = "x-corral-timeout-ms";

pub async fn handle(
    app: &App,
    id: JobId,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let arrived = Instant::now();
    let headers = request.headers();
    let input = match headers.get(CONTENT_TYPE) {
        // A client that names no type is most likely sending JSON (curl -d does not say).
        None => Format::Json,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(Format::from_media_type)
            .ok_or_else(ApiError::unsupported_media_type)?,
    };
    let output =
        format::negotiate(headers.get(ACCEPT), input).ok_or_else(ApiError::not_acceptable)?;
    let timeout = requested_timeout(headers)?.map_or(app.timeout, |t| t.min(app.timeout));
    check_declared_length(headers, app.max_body_bytes)?;

    let body = read_body(request.into_body(), app.max_body_bytes).await?;
    let payload = format::to_msgpack(input, &body).map_err(ApiError::bad_request)?;
    let batch_bytes = app.stage.settings().max_batch_bytes;
    if payload.len() > batch_bytes {
        let message =
            format!("the payload is larger than {batch_bytes} bytes once encoded as msgpack");
        return Err(ApiError {
            message,
            ..ApiError::body_too_large(app.max_body_bytes)
        });
    }

    let deadline = arrived + timeout;
    let (job, answer) = Job::new(id, payload, arrived, deadline);
    if let Err(Shed::QueueFull(_)) = app.stage.submit(job) {
        return Err(ApiError::queue_full());
    }
    // Waiting here until the deadline is what makes 408 hold wherever the job is: still queued
    // or inside a worker. If the client leaves, this future is dropped with the receiver, and the
    // queue skips the job.
    let outcome = match tokio::time::timeout_at(deadline, answer).await {
        Err(_elapsed) => Outcome::Expired,
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_dropped)) => {
            return Err(ApiError::internal(
                "internal",
                "the job was dropped without an answer",
            ))
        }
    };
    match outcome {
        Outcome::Done(data) => {
            let body = format::from_msgpack(output, data)
                .map_err(|e| ApiError::internal("unrepresentable_output", e))?;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(CONTENT_TYPE, output.content_type())
                .body(Full::new(body))
                .expect("static headers are valid"))
        }
        other => Err(ApiError::from_outcome(other)),
    }
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

/// Refuses a body whose declared length is over the limit before reading any of it.
fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => Err(ApiError::body_too_large(limit)),
        _ => Ok(()),
    }
}

/// Reads the body, stopping (413) as soon as it passes the limit rather than buffering it all.
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(ApiError::body_too_large(limit)),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the body: {e}"
        ))),
    }
}
