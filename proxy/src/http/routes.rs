//! Routing: which handler answers which method and path, and the headers every answer carries.

use bytes::Bytes;
use corral_protocol::JobId;
use http::header::{ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use tokio::time::Instant;
use tracing::{debug, debug_span, Instrument};

use super::error::ApiError;
use super::protocols::native;
use super::protocols::Endpoint;
use super::{body, format, get_only, openapi, App, Body};
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
    // Written here, once, for every route and protocol: a stream's total is its time to its
    // first chunk, when its headers go.
    let headers = response.headers_mut();
    let server_timing = timing.header(arrived.elapsed());
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
    let head = head_size(&request);
    // Refused unread, yet under its route's label and in its protocol's error shape.
    // The count too: hyper bounds an HTTP/1.1 head's, but not an HTTP/2 one's (14 headers
    // past a bound of 10 had been served).
    // An HTTP/2 client may split its `cookie` into crumbs, one field each (RFC 9113 8.2.3):
    // they count as the one field HTTP/1.1 sends.
    let crumbs = request.headers().get_all(http::header::COOKIE).iter().count();
    let fields = request.headers().len() - crumbs.saturating_sub(1);
    let too_large = if head > app.max_header_bytes {
        Some(ApiError::head_too_large(head, app.max_header_bytes))
    } else if fields > app.max_headers {
        Some(ApiError::too_many_headers(fields, app.max_headers))
    } else {
        // Said before the body is read: the connection closes after it.
        let misaddressed = without_one_host(&request);
        misaddressed.or_else(|| conflicting(request.headers())).map(body::before_body)
    };
    let (route, answer) = if let Some(route) = app.route(path) {
        let _ = unanswered.route.set(route.path.as_str());
        let answer = match too_large.map_or_else(|| app.admit(&method), Err) {
            Ok(()) => native::handle(app, route, id, request).await,
            Err(error) => Err(error),
        };
        (route.path.as_str(), answer)
    } else if let Some(endpoint) = Endpoint::find(app, path) {
        let label = endpoint.label();
        let _ = unanswered.route.set(label);
        let response = match too_large {
            Some(error) => endpoint.refuse(&error),
            // Boxed: a protocol's envelope is the largest future here (3.4 KiB), and every
            // request's future, native ones too, would otherwise be sized for it.
            None => Box::pin(endpoint.answer(app, &method, request)).await,
        };
        (label, Ok(response))
    } else if let Some(error) = too_large {
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
        debug!(route, "the client left before its answer");
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

/// An HTTP/1.1 request without exactly one `Host` field: a 400, as RFC 9112 3.2 says a server
/// must answer (it had been served; a request smuggled past a gateway often lacks one, or has
/// two). HTTP/1.0 may leave it out; HTTP/2 names the authority otherwise.
fn without_one_host<B>(request: &Request<B>) -> Option<ApiError> {
    if request.version() != http::Version::HTTP_11 {
        return None;
    }
    let hosts = request.headers().get_all(http::header::HOST).iter().count();
    (hosts != 1).then(|| {
        let message = format!("an HTTP/1.1 request has one Host field; this one has {hosts}");
        ApiError::bad_request(message)
    })
}

/// Fields a request gives once, given more than once with values that differ: a 400, in the
/// protocol's own shape. `Content-Type` is one value (RFC 9110), and so is how many items a
/// native body holds or how long a v2 binary request's JSON header is. Only the first had been
/// read: behind a gateway that adds its own field beside the client's, the body was read as the
/// other form, or as one item where the client sent many. Values that read alike are one value:
/// letter case and spaces aside, and for `Content-Type` its media type without parameters
/// (`application/json` beside `application/json; charset=utf-8`, as gateways add it).
fn conflicting(headers: &http::HeaderMap) -> Option<ApiError> {
    static ONCE: [HeaderName; 3] = [
        CONTENT_TYPE,
        HeaderName::from_static(native::ITEMS_HEADER),
        HeaderName::from_static(super::protocols::v2::HEADER_LENGTH),
    ];
    ONCE.iter().find_map(|name| {
        let mut fields = headers.get_all(name).iter().peekable();
        let first = fields.next()?;
        // One field, the usual case: nothing to compare, nothing read.
        fields.peek()?;
        let read = |value: &HeaderValue| {
            let text = String::from_utf8_lossy(value.as_bytes());
            let text = if *name == CONTENT_TYPE { format::essence(&text) } else { text.trim() };
            text.to_ascii_lowercase()
        };
        let first = read(first);
        fields.any(|other| read(other) != first).then(|| {
            ApiError::bad_request(format!("{name} is given more than once, with different values"))
        })
    })
}

/// A request's head in bytes, in the shortest form HTTP/1.1 writes it: the request line (its
/// target as sent: a path, or an absolute URL), each header as `name:value` and its line end,
/// and the empty line. hyper bounds the head only by its read buffer, which grows in powers of
/// two from 8 KiB (`--max-header-bytes 20000` took 32 KB heads): this holds the bound to the
/// byte for a client that writes no optional space, and never refuses a head the client kept
/// within it. An HTTP/2 request counts its path and headers the same way (hyper's own h2 list
/// limit, which adds 32 bytes a header, is the stricter there).
pub fn head_size<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let path = uri.path_and_query().map_or(1, |p| p.as_str().len());
    let target = match (request.version(), uri.scheme_str(), uri.authority()) {
        (http::Version::HTTP_2, ..) | (_, None, _) | (_, _, None) => path,
        // `http://host` comes back with the path `/` it did not send: count none then.
        (_, Some(scheme), Some(authority)) => {
            let path = if uri.path() == "/" && uri.query().is_none() { 0 } else { path };
            scheme.len() + 3 + authority.as_str().len() + path
        }
    };
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 1 + value.len() + 2)
        .sum();
    line + headers + 2
}

/// The proxy's own GET pages, as the label of their requests (a `'static` one: a client's path
/// must not grow the label set).
pub(super) fn own_page(path: &str) -> Option<&'static str> {
    ["/healthz", "/readyz", "/metrics", "/openapi.json"].into_iter().find(|page| *page == path)
}

/// The metrics page; state gauges are read at scrape time.
fn prometheus_text(app: &App) -> Response<Body> {
    let m = metrics();
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
    if error.close {
        // hyper closes an HTTP/1.1 connection after an answer that says so (HTTP/2 has no such
        // header; hyper drops it there, and the stream alone ends).
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_counted_as_its_shortest_http1_form() {
        let request = Request::get("/healthz").header("host", "x").header("x-pad", "aaa");
        let request = request.body(()).unwrap();
        let wire = "GET /healthz HTTP/1.1\r\nhost:x\r\nx-pad:aaa\r\n\r\n";
        assert_eq!(head_size(&request), wire.len());
        let absolute = Request::get("http://example.com:8000/infer?a=1").body(()).unwrap();
        let wire = "GET http://example.com:8000/infer?a=1 HTTP/1.1\r\n\r\n";
        assert_eq!(head_size(&absolute), wire.len());
        let bare = Request::get("http://example.com").body(()).unwrap();
        assert_eq!(head_size(&bare), "GET http://example.com HTTP/1.1\r\n\r\n".len());
        let mut h2 = Request::get("http://example.com/infer").body(()).unwrap();
        *h2.version_mut() = http::Version::HTTP_2;
        assert_eq!(head_size(&h2), "GET /infer HTTP/1.1\r\n\r\n".len(), "h2: its :path");
    }
}
