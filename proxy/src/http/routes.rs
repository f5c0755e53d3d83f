//! Routing: which handler answers which method and path (its head checked first, [`head`]),
//! and the headers every answer carries.

use bytes::Bytes;
use corral_protocol::JobId;
use http::header::{
    ACCEPT_ENCODING, ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING,
};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use tokio::time::Instant;
use tracing::{debug, debug_span, Instrument};

use super::error::ApiError;
use super::protocols::native;
use super::protocols::Endpoint;
use super::{body, get_only, head, openapi, App, Body};
use crate::metrics::metrics;
use crate::timing::{self, BATCH_SIZE_HEADER, SERVER_TIMING_HEADER};
use crate::trace;
use crate::traffic::Class;

/// Header carrying the request's (and its job's) id on every answer.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

// The names every request reads or writes, as names: a `&str` is parsed at every use.
static REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);
static SERVER_TIMING: HeaderName = HeaderName::from_static(SERVER_TIMING_HEADER);
static BATCH_SIZE: HeaderName = HeaderName::from_static(BATCH_SIZE_HEADER);

pub async fn route(app: &App, request: Request<Incoming>) -> Response<Body> {
    let arrived = Instant::now();
    // Every request gets an id, job or not, so every answer can be traced. Log lines about it
    // (debug level: none per request by default) carry that id, and the client's own
    // x-request-id if it sent one.
    let id = JobId::new();
    let client_id = request.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok());
    let span = debug_span!("request", request_id = %id, client_request_id = client_id);
    let trace = trace::request(request.headers(), request.method());
    let mut unanswered = Unanswered::new(request.method(), id, arrived, trace.clone());
    let handled = route_in(app, request, id, arrived, &unanswered);
    let (mut response, timing) = timing::scope(trace.clone(), handled).instrument(span).await;
    unanswered.answered = true;
    // A stream's total is its time to its first chunk, when its headers go.
    let total = arrived.elapsed();
    if let Some(route) = timing.route {
        app.routes[route].statistics.answered(response.status(), total, &timing);
    }
    // Written here, once, for every route and protocol.
    let headers = response.headers_mut();
    let server_timing = timing.header(total);
    headers.insert(
        SERVER_TIMING.clone(),
        HeaderValue::from_str(&server_timing).expect("digits and ASCII are a valid header value"),
    );
    if timing.batch_size > 0 {
        headers.insert(BATCH_SIZE.clone(), HeaderValue::from(timing.batch_size));
    }
    if let Some(cx) = trace {
        trace::end(&cx);
    }
    response
}

async fn route_in<'a>(
    app: &'a App,
    request: Request<Incoming>,
    id: JobId,
    arrived: Instant,
    unanswered: &Unanswered<'a>,
) -> Response<Body> {
    let method = request.method().clone();
    let unread = carries_body(&request);
    // The route label takes known paths only, so that a scan of random URLs cannot grow it.
    let path = request.uri().path();
    // A head refused unread ([`head::refusal`]), yet under its route's label and in its
    // protocol's error shape; each envelope names the fields it reads once.
    let (route, answer) = if let Some(route) = app.route(path) {
        let _ = unanswered.route.set(route.path.as_str());
        let refused = head::refusal(app, &request, &native::SINGLE_FIELDS);
        let answer = match refused.map_or_else(|| app.admit(&method, route), Err) {
            Ok(()) => native::handle(app, route, id, request).await,
            Err(error) => Err(error),
        };
        (route.path.as_str(), answer)
    } else if let Some(endpoint) = Endpoint::find(app, path) {
        let label = endpoint.label();
        let _ = unanswered.route.set(label);
        let response = match head::refusal(app, &request, endpoint.single_fields()) {
            Some(error) => endpoint.refuse(&error),
            // Boxed: a protocol's envelope is the largest future here (3.4 KiB), and every
            // request's future, native ones too, would otherwise be sized for it.
            None => Box::pin(endpoint.answer(app, &method, request)).await,
        };
        (label, Ok(response))
    } else if let Some(error) = head::refusal(app, &request, &[]) {
        (own_page(path).unwrap_or("other"), Err(error))
    } else if let Some(page) = own_page(path) {
        let answer = get_only(&method).and_then(|()| match page {
            "/healthz" => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)),
            "/readyz" => ready(app),
            "/metrics" => Ok(prometheus_text(app)),
            _ => Ok(json(StatusCode::OK, openapi::body(app))),
        });
        (page, answer)
    } else {
        ("other", Err(ApiError::not_found(path)))
    };
    let mut response = answer.unwrap_or_else(error_response);
    let id = id.to_string();
    let code = response.status();
    // These are answered before the body is read, on every route and protocol: the rest of the
    // body may still be on its way, so the connection cannot be reused (hyper closes it, and a
    // client that reused it at once saw it drop without an answer). See `body::before_body`.
    let refused = matches!(
        code,
        StatusCode::NOT_FOUND
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    // A GET (a page, a model's metadata) never reads a body either: one sent with it (which
    // HTTP allows) had left the connection open behind a 200, then dropped.
    if unread && (refused || method != http::Method::POST) {
        response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(cx) = timing::trace() {
        trace::answered(&cx, &method, route, code.as_u16(), &id);
    }
    let id = HeaderValue::from_str(&id).expect("a UUID is a valid header value");
    response.headers_mut().insert(REQUEST_ID.clone(), id);
    debug!(route, status = code.as_u16(), "answered");
    metrics().requests.with_label_values(&[route, code.as_str()]).inc();
    metrics().request_seconds.with_label_values(&[route]).observe(arrived.elapsed().as_secs_f64());
    response
}

/// A request until it is answered: one whose client leaves first (hyper drops the handler's
/// future) is counted, on drop, as 499 — nginx's "client closed request" — in the request
/// metrics, and its span ends named after its route with that status. Before, such a request
/// was in no request metric (only `corral_jobs_cancelled_total` moved), and its span was
/// exported as a bare `POST` with no route nor status.
struct Unanswered<'a> {
    /// The route label, once routing has found it ("other" before).
    route: std::sync::OnceLock<&'a str>,
    method: http::Method,
    id: JobId,
    arrived: Instant,
    trace: Option<opentelemetry::Context>,
    answered: bool,
}

impl<'a> Unanswered<'a> {
    fn new(
        method: &http::Method,
        id: JobId,
        arrived: Instant,
        trace: Option<opentelemetry::Context>,
    ) -> Self {
        let route = std::sync::OnceLock::new();
        Self { route, method: method.clone(), id, arrived, trace, answered: false }
    }
}

/// The status a request whose client left is counted under (nginx's; HTTP has none).
const CLIENT_CLOSED: &str = "499";

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let route = self.route.get().copied().unwrap_or("other");
        // Outside the request's span (its future is gone): its id given here, as every line
        // of a request carries it.
        debug!(route, request_id = %self.id, "the client left before its answer");
        metrics().requests.with_label_values(&[route, CLIENT_CLOSED]).inc();
        let seconds = self.arrived.elapsed().as_secs_f64();
        metrics().request_seconds.with_label_values(&[route]).observe(seconds);
        if let Some(cx) = &self.trace {
            trace::answered(cx, &self.method, route, 499, &self.id.to_string());
            trace::end(cx);
        }
    }
}

/// Whether a request has a body to come: a `Content-Length` above 0, or a `Transfer-Encoding`.
fn carries_body(request: &Request<Incoming>) -> bool {
    let headers = request.headers();
    headers.contains_key(TRANSFER_ENCODING) || body::declared_length(headers).is_some_and(|n| n > 0)
}

/// The proxy's own GET pages, as the label of their requests (a `'static` one: a client's path
/// must not grow the label set).
pub(super) fn own_page(path: &str) -> Option<&'static str> {
    ["/healthz", "/readyz", "/metrics", "/openapi.json"].into_iter().find(|page| *page == path)
}

/// The metrics page; state gauges are read at scrape time.
fn prometheus_text(app: &App) -> Response<Body> {
    let m = metrics();
    crate::supervisor::output::count_dropped_log_lines();
    for stage in &app.stages {
        let label = [stage.name()];
        m.queue_depth.with_label_values(&label).set(stage.queued() as i64);
        let by_class = stage.queued_by_class();
        for (class, queued) in [Class::Low, Class::Normal, Class::High].into_iter().zip(by_class) {
            let labels = [stage.name(), class.label()];
            m.queue_depth_by_class.with_label_values(&labels).set(queued as i64);
        }
        m.workers_connected.with_label_values(&label).set(stage.workers() as i64);
        m.workers_busy.with_label_values(&label).set(stage.busy_workers() as i64);
        for (gpu, workers) in stage.workers_by_gpu() {
            let labels = [stage.name(), &gpu.to_string()];
            m.workers_by_gpu.with_label_values(&labels).set(workers as i64);
        }
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
        .body(Full::new(Bytes::from(m.render())).boxed_unsync())
        .expect("static headers are valid")
}

/// Ready once every stage has a connected worker: before that, some jobs would only queue.
/// The body has the totals and each stage's own figures.
fn ready(app: &App) -> Result<Response<Body>, ApiError> {
    if let Some(reason) = app.unready(app.stages.iter()) {
        return Err(ApiError::not_ready(reason));
    }
    let stages: serde_json::Map<String, serde_json::Value> = app
        .stages
        .iter()
        .map(|stage| {
            let mut figures =
                serde_json::json!({"workers": stage.workers(), "queued": stage.queued()});
            let gpus = stage.workers_by_gpu();
            if !gpus.is_empty() {
                let by_gpu: serde_json::Map<String, serde_json::Value> =
                    gpus.into_iter().map(|(gpu, n)| (gpu.to_string(), n.into())).collect();
                figures["gpus"] = by_gpu.into();
            }
            (stage.name().to_string(), figures)
        })
        .collect();
    let body = serde_json::json!({
        "status": "ready",
        "workers": app.stages.iter().map(|stage| stage.workers()).sum::<usize>(),
        "queued": app.stages.iter().map(|stage| stage.queued()).sum::<usize>(),
        "stages": stages,
    });
    Ok(json(StatusCode::OK, body.to_string()))
}

pub(super) fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body.into()).boxed_unsync())
        .expect("static headers are valid")
}

fn error_response(error: ApiError) -> Response<Body> {
    error_response_with(&error, error.body())
}

/// An error's answer with a body of the caller's shape (a protocol's), and the headers every
/// error answer carries.
pub(super) fn error_response_with(error: &ApiError, body: Vec<u8>) -> Response<Body> {
    let mut response = json(error.status, body);
    let headers = response.headers_mut();
    if let Some(seconds) = error.retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(allow) = error.allow {
        headers.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if let Some(codings) = error.accept_encoding {
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static(codings));
    }
    if error.close {
        // hyper closes an HTTP/1.1 connection after an answer that says so (HTTP/2 has no such
        // header; hyper drops it there, and the stream alone ends).
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
