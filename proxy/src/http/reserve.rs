//! The connection reserve: a few connections let in past `--max-connections`, on which only the
//! proxy's own pages and health probes are answered. A client holding every connection (idle
//! keep-alives, a flood) once had the liveness and readiness probes answered 503 with the rest:
//! some 30 s of that and the kubelet restarted the pod, and `/metrics`, which would have shown
//! why, could not be scraped.
//!
//! A connection takes a reserve permit only when the main cap has none left. It carries one
//! HTTP/1.1 request and is closed after the answer (no keep-alive: a probe opens a connection per
//! check, and a client must not keep a reserve slot by reusing it); it must begin that request
//! within the header deadline. A request for any other path is answered 503 `too_many_connections`,
//! as a connection past the cap is, before its body is read, and counted in the same shed metric;
//! its body is then read and dropped for a moment ([`LINGER`]), so that the client reads its 503
//! rather than a reset. Past the reserve, a connection is answered the same 503 without its request
//! being read, and what it sends is then dropped as here ([`super::server`]). The reserve's
//! descriptors are counted under the open-file limit ([`crate::open_files`]).

use std::sync::Arc;
use std::time::Duration;

use http::header::CONNECTION;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::protocols::Endpoint;
use super::routes::{self, REQUEST_ID_HEADER};
use super::{App, Body};
use crate::metrics::metrics;
use corral_protocol::JobId;

/// Connections let in past `--max-connections`. A pod's kubelet has at most three probes
/// (startup, liveness, readiness) and one check of each in flight, and Prometheus scrapes once
/// per server (twice in an HA pair): 16 leaves room for those to overlap, be retried while
/// earlier reserve connections close, and for an operator's curl, at 16 descriptors.
pub const CONNECTIONS: usize = 16;

/// How long a refused request's body is read (and dropped) after its 503, here and past the
/// reserve ([`super::server`]): a socket closed with bytes unread is reset, and a client still
/// sending its body when its 503 came (urllib writes the body after the head) got that reset,
/// `EPIPE`, instead of the answer waiting for it.
pub const LINGER: Duration = Duration::from_secs(1);

/// The most of a refused request that is read (and dropped) before its connection is closed.
pub const LINGER_BYTES: usize = 1 << 20;

/// The health probes of Open Inference Protocol v2, answered on the reserve as `/healthz` and
/// `/readyz` are: a Triton- or KServe-style deployment points its liveness and readiness probes
/// at them, and they fail a pod just the same. The per-model `/v2/models/{name}/ready` and the
/// metadata endpoints are client calls, not the pod's probes: refused like other requests.
const V2_PROBES: [&str; 2] = ["/v2/health/live", "/v2/health/ready"];

/// Whether a request on a reserve connection is answered: the proxy's own pages (`/healthz`,
/// `/readyz`, `/metrics`, `/openapi.json`) and v2's health probes. None takes a job or reads a
/// body.
pub fn answers(path: &str) -> bool {
    routes::own_page(path).is_some() || V2_PROBES.contains(&path)
}

/// The two caps a new connection may be let in under: `--max-connections`, then the reserve.
pub struct Caps {
    main: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
}

/// A connection's place under the caps, held for as long as it is open.
pub struct Permit {
    _permit: OwnedSemaphorePermit,
    /// Taken from the reserve: the main cap was exhausted.
    pub reserve: bool,
}

impl Caps {
    pub fn new(max_connections: usize) -> Self {
        Self {
            main: Arc::new(Semaphore::new(max_connections)),
            reserve: Arc::new(Semaphore::new(CONNECTIONS)),
        }
    }

    /// A permit for a new connection: the main cap's while it has one, else the reserve's; None
    /// when both are held (the connection is refused unread).
    pub fn admit(&self) -> Option<Permit> {
        if let Ok(permit) = self.main.clone().try_acquire_owned() {
            return Some(Permit { _permit: permit, reserve: false });
        }
        let permit = self.reserve.clone().try_acquire_owned().ok()?;
        Some(Permit { _permit: permit, reserve: true })
    }
}

/// The answer to a request on a reserve connection: a page [`answers`] takes as on any
/// connection, anything else 503 `too_many_connections` without reading its body. Every answer
/// says the connection closes (hyper then closes it, its keep-alive being off as well).
pub async fn answer(app: &App, request: Request<Incoming>) -> Response<Body> {
    let mut response = if answers(request.uri().path()) {
        routes::route(app, request).await
    } else {
        let refused = refuse(app, request.uri().path());
        // hyper goes on reading the body while a task holds it, and closes the connection (its
        // keep-alive off) once it has ended or been dropped. At most [`CONNECTIONS`] of these.
        tokio::spawn(linger(request.into_body()));
        refused
    };
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 503 `too_many_connections`, counted as a connection past the cap is: a shed with no class,
/// in no `corral_requests_total` (it is no route's request). Its request, body unread, is
/// dropped here. A client protocol's path is answered in that protocol's error shape, as its
/// other errors are (OpenAI's clients lost the message in Corral's).
fn refuse(app: &App, path: &str) -> Response<Body> {
    metrics().shed.with_label_values(&[super::error::TOO_MANY_CONNECTIONS, ""]).inc();
    let error = ApiError::too_many_connections();
    let mut response = match Endpoint::find(app, path) {
        Some(endpoint) => endpoint.refuse(&error),
        None => routes::error_response_with(&error, error.body()),
    };
    let id = HeaderValue::from_str(&JobId::new().to_string()).expect("a UUID is a valid value");
    response.headers_mut().insert(HeaderName::from_static(REQUEST_ID_HEADER), id);
    response
}

/// Reads a refused request's body and drops it, for [`LINGER`] and [`LINGER_BYTES`] at most.
async fn linger(mut body: Incoming) {
    let _ = tokio::time::timeout(LINGER, async {
        let mut read = 0;
        while read < LINGER_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |data| data.len()),
                _ => break,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_answers_probes_and_own_pages_only() {
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json", "/v2/health/ready"] {
            assert!(answers(path), "{path}");
        }
        for path in ["/infer", "/v2/models/default/infer", "/v2/models/default/ready", "/v2"] {
            assert!(!answers(path), "{path}");
        }
    }

    #[test]
    fn the_reserve_is_taken_only_once_the_main_cap_is_held() {
        let caps = Caps::new(2);
        let main: Vec<_> = (0..2).map(|_| caps.admit().expect("main")).collect();
        assert!(main.iter().all(|permit| !permit.reserve));
        let reserve: Vec<_> = (0..CONNECTIONS).map(|_| caps.admit().expect("reserve")).collect();
        assert!(reserve.iter().all(|permit| permit.reserve));
        assert!(caps.admit().is_none(), "past the reserve: refused");
        drop(main);
        assert!(!caps.admit().expect("a main slot freed").reserve, "the main cap first again");
    }
}
