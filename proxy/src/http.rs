//! The HTTP edge: the server loop, the routes, and everything between a request and its job.

pub mod body;
pub mod deadline;
pub mod error;
pub mod events;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod head;
pub mod infer;
pub mod items;
pub mod openapi;
pub mod protocols;
pub mod reserve;
pub mod routes;
pub mod server;
pub mod stream;
pub mod timeouts;
pub mod traffic;
pub mod validate;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;

pub use crate::config::topology::Protocol;
use crate::metrics::metrics;
use crate::pipeline::Pipeline;
use crate::stage::{Shed, Stage};
use crate::traffic::Class;

/// Every answer's body: whole (most answers) or streamed ([`stream`]).
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// What every request handler needs.
pub struct App {
    /// The routes jobs are posted to, each with its pipeline.
    pub routes: Vec<Route>,
    /// Every stage, once, whichever routes share it.
    pub stages: Vec<Arc<Stage>>,
    pub max_body_bytes: usize,
    /// Largest request head, counted in its shortest HTTP/1.1 form ([`head::head_size`]).
    pub max_header_bytes: usize,
    /// Most header fields in a request (`--max-headers`): hyper bounds an HTTP/1.1 head itself,
    /// not an HTTP/2 one ([`routes`] does).
    pub max_headers: usize,
    /// Longest a request's body may take to arrive, from the request's start.
    pub body_read_timeout: Duration,
    /// Times a job may be retried on another worker when its worker dies with it.
    pub retries: u32,
    /// Most bytes of chunks a streaming client may fall behind by before its job is cancelled.
    pub stream_buffer_bytes: usize,
    /// How long a Server-Sent Events stream may go without an event before a comment line
    /// keeps it alive (None: never).
    pub stream_keepalive: Option<Duration>,
    /// Set when shutdown begins: new jobs are answered 503 and readiness fails.
    pub draining: AtomicBool,
    /// Cancelled when the grace period runs out: what is left is answered 503, a body still
    /// arriving included.
    pub grace_over: tokio_util::sync::CancellationToken,
    /// The header that names a request's tenant (`--tenant-header`).
    pub tenant_header: http::HeaderName,
    /// Where large bodies are read to (`--shared-memory-bytes`), if anywhere.
    pub shared_memory: Option<Arc<crate::shared_memory::SharedMemory>>,
    /// `/openapi.json` as last built ([`openapi::body`]).
    pub openapi: std::sync::Mutex<Option<openapi::Built>>,
}

/// A path that takes jobs (`POST /infer` by default).
pub struct Route {
    /// The route's name in the config file, its operation id in `/openapi.json`.
    pub name: String,
    /// Its name in the model-serving protocols (`default` for the default route).
    pub model: String,
    /// As the config file wrote it (the `route` label, OpenAPI's path).
    pub path: String,
    /// `path` percent-decoded, what requests are matched against: `/%C3%BC` and `/%c3%bc` are
    /// one path (RFC 3986: hex digits' case means nothing), and `/ü` too.
    pub plain: String,
    pub pipeline: Pipeline,
    /// Default and longest deadline of a job.
    pub timeout: Duration,
    /// The class of its requests that send no `x-corral-priority`.
    pub priority: Class,
    /// The client protocol it speaks besides Corral's own (and KServe v1, which all speak).
    pub protocol: Option<Protocol>,
    /// Its requests as Triton's statistics extension counts a model's.
    pub statistics: crate::statistics::RouteStatistics,
    /// Its place in `App::routes`: what a request's timing names it by
    /// ([`crate::timing::admitted`]), a `Copy` where the route is borrowed.
    pub index: usize,
}

/// The answer to a request refused at admission; counted, not logged: shedding must stay cheap
/// under overload.
pub fn shed_error(shed: Shed, class: Class) -> error::ApiError {
    let error = match shed {
        Shed::QueueFull { retry_after } => error::ApiError::queue_full(retry_after.as_secs()),
        Shed::DeadlineUnreachable { retry_after, alone } => {
            error::ApiError::deadline_unreachable(retry_after.as_secs(), alone)
        }
        Shed::TenantQuota { retry_after } => error::ApiError::tenant_quota(retry_after.as_secs()),
        Shed::ShuttingDown => error::ApiError::shutting_down(),
    };
    metrics().shed.with_label_values(&[error.code, class.label()]).inc();
    error
}

impl App {
    /// The route at `path`, as sent or percent-decoded, against the route's path decoded
    /// ([`Route::plain`]): a client encodes a path that is not ASCII (`/résumé` goes as
    /// `/r%C3%A9sum%C3%A9`), in either case of hex digits. (A path sent as the file wrote it
    /// decodes to `plain` too: one compare a route.)
    pub fn route(&self, path: &str) -> Option<&Route> {
        let found = self.routes.iter().find(|route| route.plain == path);
        if found.is_some() || !path.contains('%') {
            return found;
        }
        let decoded = percent_decoded(path)?;
        self.routes.iter().find(|route| route.plain == decoded)
    }

    /// The route a model-serving protocol names by its model name.
    pub fn model(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|route| route.model == name)
    }

    /// Why jobs for `stages` could not all run now, if they could not: shutdown has begun, or a
    /// stage has no connected worker (its jobs would only queue). What `/readyz` and every
    /// protocol's readiness answer from.
    pub fn unready<'a>(&self, mut stages: impl Iterator<Item = &'a Arc<Stage>>) -> Option<String> {
        if self.draining.load(Ordering::Relaxed) {
            return Some("shutting down".into());
        }
        let idle = stages.find(|stage| stage.workers() == 0)?;
        Some(format!("stage {:?} has no connected worker{}", idle.name(), idle.exits_said()))
    }

    /// What every job-taking endpoint checks first, native or a protocol's: `POST` only, and no
    /// new jobs once shutdown has begun (a shed, counted). Admitted, the request is `route`'s:
    /// its statistics count it when the edge answers, whatever becomes of it.
    pub fn admit(&self, method: &Method, route: &Route) -> Result<(), error::ApiError> {
        if method != Method::POST {
            return Err(error::ApiError::method_not_allowed(method, "POST"));
        }
        if self.draining.load(Ordering::Relaxed) {
            metrics().shed.with_label_values(&[Shed::ShuttingDown.code(), ""]).inc();
            return Err(error::ApiError::shutting_down());
        }
        // The route's request from here, whatever becomes of it (its statistics).
        crate::timing::admitted(route.index);
        Ok(())
    }
}

/// A path, or a path segment, as clients percent-encode it (a path that is not ASCII, a model
/// name tritonclient quotes), decoded; None where it does not decode to UTF-8.
pub fn percent_decoded(text: &str) -> Option<std::borrow::Cow<'_, str>> {
    percent_encoding::percent_decode_str(text).decode_utf8().ok()
}

/// The check of every endpoint that only answers `GET` (and `HEAD`, which hyper answers from it).
pub fn get_only(method: &Method) -> Result<(), error::ApiError> {
    match *method {
        Method::GET | Method::HEAD => Ok(()),
        _ => Err(error::ApiError::method_not_allowed(method, "GET, HEAD")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_answers_with_its_own_code_word() {
        let later = Duration::from_secs(3);
        for shed in [
            Shed::QueueFull { retry_after: later },
            Shed::DeadlineUnreachable { retry_after: later, alone: false },
            Shed::TenantQuota { retry_after: later },
            Shed::ShuttingDown,
        ] {
            let code = shed.code();
            let said = !matches!(shed, Shed::ShuttingDown);
            let error = shed_error(shed, Class::Normal);
            assert_eq!(error.code, code);
            assert_eq!(error.status, http::StatusCode::SERVICE_UNAVAILABLE);
            assert!(error.retry_after.is_some(), "{code} says when to retry");
            if said {
                assert_eq!(error.retry_after, Some(3), "{code} says what admission said");
            }
        }
    }
}
