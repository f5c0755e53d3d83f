//! The one place that maps every failure to an HTTP answer: status, a stable code word, a
//! message for humans, and `Retry-After` for shed requests. Error bodies are always JSON
//! (`{"error": "...", "message": "..."}`), whatever the request's format, so that every client
//! can read them.

use std::time::Duration;

use http::StatusCode;

use crate::job::Outcome;

/// The error code (and shed reason, `corral_jobs_shed_total`) of a connection refused because
/// the server holds as many as it may; counted without a class, as no request was read.
pub const TOO_MANY_CONNECTIONS: &str = "too_many_connections";

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// A stable code word clients can match on.
    pub code: &'static str,
    pub message: String,
    /// Seconds, for 503 answers.
    pub retry_after: Option<u64>,
    /// The methods a route takes, for 405 answers.
    pub allow: Option<&'static str>,
    /// The failed elements of a multi-item request.
    pub items: Option<Vec<serde_json::Value>>,
    /// Whether the connection is closed after the answer (`Connection: close`).
    pub close: bool,
    /// The content codings Corral reads, for an answer refusing the body's
    /// (`Accept-Encoding`, RFC 9110 15.5.16).
    pub accept_encoding: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            status,
            code,
            message,
            retry_after: None,
            allow: None,
            items: None,
            close: false,
            accept_encoding: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(path: &str) -> Self {
        let message = match path {
            // An authority-form target (`CONNECT host:443`) has no path: "no route for " said
            // nothing.
            "" => "no route for a request without a path (Corral is no forward proxy)".into(),
            path => format!("no route for {path}"),
        };
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn method_not_allowed(method: &http::Method, allow: &'static str) -> Self {
        let message = format!("{method} is not allowed here; use {allow}");
        let mut error = Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message);
        error.allow = Some(allow);
        error
    }

    pub fn not_acceptable() -> Self {
        let message = "Accept must allow application/json or application/msgpack, or, for an \
                       output of raw bytes, application/octet-stream or the output's media type \
                       (or, for a streamed answer, text/event-stream or application/x-ndjson)";
        Self::new(StatusCode::NOT_ACCEPTABLE, "not_acceptable", message)
    }

    /// A body of a type Corral does not read. A form (what `curl -d` sends unless told
    /// otherwise) is almost always JSON sent without its header: the message says how to fix it.
    pub fn unsupported_media_type(media_type: &str) -> Self {
        let essence = media_type.split(';').next().unwrap_or("").trim();
        let message = if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            "Content-Type must be application/json or application/msgpack; this body is sent as \
             a form (curl -d does that unless told otherwise): add -H 'content-type: \
             application/json'"
        } else {
            "Content-Type must be application/json or application/msgpack"
        };
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
    }

    /// A JSON body a protocol could not read, answered `refused` (its own 400), but 415 where
    /// the body is not UTF-8 text ([`super::format::is_utf8_text`]) and its `Content-Type`'s
    /// `charset` names another encoding: the client's to fix by its encoding, on every protocol
    /// alike (native's alone had said so; KServe v1's and OpenAI's 400 named neither).
    pub fn or_charset(
        refused: Self,
        content_type: Option<&http::HeaderValue>,
        json: &[u8],
    ) -> Self {
        let charset = content_type
            .and_then(|value| value.to_str().ok())
            .and_then(super::format::charset_is_not_utf8);
        match charset {
            Some(charset) if !super::format::is_utf8_text(json) => Self::json_not_utf8(charset),
            _ => refused,
        }
    }

    /// A JSON body that is not UTF-8 text while its `charset` names another encoding: JSON is
    /// UTF-8 (RFC 8259), and that is what the body is read as.
    pub fn json_not_utf8(charset: &str) -> Self {
        let shown: String = charset.chars().take(40).collect();
        let message = format!(
            "Content-Type says charset={shown}, but JSON is UTF-8 (RFC 8259): send the body \
             in UTF-8, with charset=utf-8 or none"
        );
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
    }

    /// A native route's `Content-Type` that is no media type at all (raw bytes need one), or
    /// one longer than Corral passes on to a worker ([`super::format::MAX_MEDIA_TYPE`]).
    pub fn not_a_media_type(media_type: &str) -> Self {
        let shown: String = media_type.chars().take(100).collect();
        let most = super::format::MAX_MEDIA_TYPE;
        let message = if media_type.len() > most {
            // It may well be one (a long `filename` parameter): "not a media type" misled.
            format!(
                "Content-Type {shown:?}… is {} bytes, longer than the {most} a raw body's media \
                 type may have: send a shorter one (its parameters are what make it long)",
                media_type.len()
            )
        } else {
            format!(
                "Content-Type {shown:?} is not a media type: send application/json, \
                 application/msgpack, or raw bytes with their type (type/subtype, e.g. image/png \
                 or application/octet-stream)"
            )
        };
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
    }

    /// A request head over `--max-header-bytes` that hyper's read buffer (which grows in powers
    /// of two, from 8 KiB) still took in.
    pub fn head_too_large(size: usize, limit: usize) -> Self {
        let message = format!(
            "the request head (request line and headers) is {size} bytes, over the limit of {limit}"
        );
        let error = Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_head_too_large",
            message,
        );
        Self { close: true, ..error }
    }

    /// A request of more header fields than `--max-headers` (HTTP/2: hyper refuses an HTTP/1.1
    /// one itself).
    pub fn too_many_headers(count: usize, limit: usize) -> Self {
        let message = format!("the request has {count} header fields, over the limit of {limit}");
        let error = Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_head_too_large",
            message,
        );
        Self { close: true, ..error }
    }

    pub fn body_too_large(limit: usize) -> Self {
        let message = format!("the body is larger than {limit} bytes");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
    }

    pub fn too_many_items(items: usize, capacity: usize) -> Self {
        let message =
            format!("the request carries {items} items; the queue holds at most {capacity}");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_many_items", message)
    }

    /// A job not answered in time. Said so that it is true however the job ended: at its
    /// deadline, or skipped by a worker that found the deadline would pass before it could be
    /// done (`expired`; "the deadline passed" was then false, with seconds still left).
    pub fn deadline_exceeded() -> Self {
        let message = "the job could not be answered within its deadline";
        Self::new(StatusCode::REQUEST_TIMEOUT, "deadline_exceeded", message)
    }

    /// A stream that had begun ran past its stream timeout (`--stream-timeout-ms`): the same
    /// code as any deadline, a message that says which bound it was.
    pub fn stream_timeout(allowed: Duration) -> Self {
        let message =
            format!("the stream ran past its stream timeout of {} ms", allowed.as_millis());
        Self::new(StatusCode::REQUEST_TIMEOUT, "deadline_exceeded", message)
    }

    /// The body did not arrive within `--body-read-timeout-ms` (the client was slow).
    pub fn body_timeout(allowed: Duration) -> Self {
        Self::body_unread(format!("the body did not arrive within {} ms", allowed.as_millis()))
    }

    /// The job's deadline, sooner than `--body-read-timeout-ms`, passed before the body was
    /// read: said apart, since on a busy proxy a body sent at once may be read past a short
    /// deadline, and "did not arrive" blamed the client for the proxy's lateness.
    pub fn body_past_deadline(timeout: Duration) -> Self {
        let ms = timeout.as_millis();
        Self::body_unread(format!(
            "the request's deadline of {ms} ms passed before its body was read"
        ))
    }

    fn body_unread(message: String) -> Self {
        let mut error = Self::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", message);
        // What is left of the body may still be on its way: the connection cannot be reused.
        error.close = true;
        error
    }

    pub fn queue_full(retry_after_secs: u64) -> Self {
        let message = "the queue is full; retry later";
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message);
        error.retry_after = Some(retry_after_secs);
        error
    }

    /// A connection past `--max-connections` and its reserve, refused unread
    /// ([`super::server`]), or a request other than a probe on a reserve connection
    /// ([`super::reserve`]). The connection closes after the answer.
    pub fn too_many_connections() -> Self {
        let message = "the proxy holds its maximum of connections";
        let error = Self::new(StatusCode::SERVICE_UNAVAILABLE, TOO_MANY_CONNECTIONS, message);
        Self { retry_after: Some(1), close: true, ..error }
    }

    pub fn not_ready(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message)
    }

    /// Predicted past its deadline: at the current load, or (`alone`) even with nothing queued,
    /// by the request's own size at the learned cost.
    pub fn deadline_unreachable(retry_after_secs: u64, alone: bool) -> Self {
        let message = if alone {
            "the request alone is predicted to take longer than its deadline allows, even with \
             nothing queued: give it a longer deadline or fewer items (a deadline past the \
             route's timeout is cut to it)"
        } else {
            "the job cannot finish before its deadline at the current load; retry later"
        };
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "deadline_unreachable", message);
        error.retry_after = Some(retry_after_secs.max(1));
        error
    }

    /// A queued job was evicted to make room for a job of a higher priority class.
    pub fn preempted(retry_after_secs: u64) -> Self {
        let message = "the job was evicted from the queue to make room for higher-priority work; \
                       retry later";
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "preempted", message);
        error.retry_after = Some(retry_after_secs.max(1));
        error
    }

    /// The request's tenant holds its whole share of the queue (`--tenant-queue-share`).
    pub fn tenant_quota(retry_after_secs: u64) -> Self {
        let message = "this tenant already holds its share of the queue; retry later";
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "tenant_quota", message);
        error.retry_after = Some(retry_after_secs.max(1));
        error
    }

    /// A queued job's row was read against tensors a newcomer's replaced ([`Outcome::TensorsChanged`]).
    pub fn tensors_changed() -> Self {
        let message = "the model's tensors changed while the request was queued (a worker \
                       declaring other tensors, or none, replaced them): it was read against \
                       the old ones and was not run; send it again";
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "tensors_changed", message);
        error.retry_after = Some(1);
        error
    }

    pub fn shutting_down() -> Self {
        let message = "the proxy is shutting down; retry on another instance";
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message);
        error.retry_after = Some(1);
        error
    }

    /// A streaming client fell behind by more than `--stream-buffer-bytes`; its job was cancelled.
    pub fn slow_client() -> Self {
        let message = "the client read the stream too slowly; its job was cancelled";
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "slow_client", message)
    }

    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, message)
    }

    /// The HTTP answer for a job outcome that is not a result.
    pub fn from_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Done(..) => Self::internal("internal", "a result was treated as an error"),
            Outcome::Invalid(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
            }
            Outcome::Failed(message) => Self::internal("worker_error", message),
            Outcome::BadOutput(message) => Self::internal("bad_output", message),
            Outcome::WorkerLost(message) => Self::internal("worker_died", message),
            Outcome::Expired => Self::deadline_exceeded(),
            Outcome::Preempted { retry_after } => Self::preempted(retry_after.as_secs()),
            Outcome::ShuttingDown => Self::shutting_down(),
            Outcome::TensorsChanged => Self::tensors_changed(),
            Outcome::Ended => Self::internal("internal", "a stream's end was treated as an error"),
            Outcome::SlowClient => Self::slow_client(),
        }
    }

    pub fn body(&self) -> Vec<u8> {
        let mut body = serde_json::json!({ "error": self.code, "message": self.message });
        if let Some(items) = &self.items {
            body["items"] = serde_json::Value::Array(items.clone());
        }
        serde_json::to_vec(&body).expect("a JSON object of strings always serializes")
    }
}
