//! Where ended spans go: a bounded queue that one thread of its own drains in batches into
//! OTLP/HTTP requests to the collector ([`Queue`]), over a small HTTP/1.1 client on the proxy's
//! own hyper and runtime ([`Collector`]). A span that finds the queue full is dropped, and so
//! are the spans of an export that failed, both counted in `corral_spans_dropped_total`.

use std::sync::mpsc::{self, SyncSender};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::otlp;
use crate::metrics::metrics;

/// Most ended spans waiting for export; past it, spans are dropped (and counted).
pub const QUEUE_SPANS: usize = 16384;
/// Most spans in one export request.
const BATCH_SPANS: usize = 2048;
/// Longest a span waits for batch-mates before its batch is exported.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Longest one export may take (connect, send, answer).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a flush waits for what was queued before it to be exported (at the proxy's exit
/// too).
pub const FLUSH_WAIT: Duration = Duration::from_secs(5);
/// Most bytes of a collector's answer read, dropped as they come ([`Collector::send`]).
const ANSWER_READ: usize = 64 * 1024;

/// What [`Queue::start`] would refuse of the endpoint, checked before anything starts: it must
/// be an http:// URL.
pub fn check(endpoint: &str) -> Result<(), String> {
    endpoint_uri(endpoint).map(drop)
}

/// What [`Queue::start`] would refuse of `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`, checked before
/// anything starts: apart from the endpoint, whose source its error is said with (a bad header
/// had been said to be the endpoint variables' fault).
pub fn check_headers() -> Result<(), String> {
    export_headers().map(drop)
}

/// The export headers to send: those of the request's own ([`OWN_HEADERS`]) are left out, each
/// with a warning (a pod-wide list may well hold `content-type=application/x-protobuf`).
fn sent_headers() -> Result<Vec<(http::HeaderName, http::HeaderValue)>, String> {
    let mut headers = export_headers()?;
    headers.retain(|(name, _)| {
        let own = OWN_HEADERS.contains(name);
        if own {
            warn!(
                header = %name,
                "ignoring an OTLP export header that the export request writes itself"
            );
        }
        !own
    });
    Ok(headers)
}

/// Whether an endpoint can be exported to: plain `http://` with a host (no TLS). Configuration
/// asks it too, to leave any other as written for the check's message to name.
pub fn is_collector_url(uri: &Uri) -> bool {
    uri.scheme_str() == Some("http") && uri.host().is_some()
}

fn endpoint_uri(endpoint: &str) -> Result<Uri, String> {
    let uri = endpoint.parse::<Uri>();
    match uri {
        // Sent as the Host header (not a valid one) and logged as it was: no place for them.
        Ok(uri) if uri.authority().is_some_and(|a| a.as_str().contains('@')) => {
            Err("the OTLP endpoint must not carry a user or password (they were sent as the Host \
             header, and logged): give the collector's credentials as a header in \
             OTEL_EXPORTER_OTLP_HEADERS"
                .into())
        }
        Ok(uri) if is_collector_url(&uri) => Ok(uri),
        // The parser's own words ("empty string", "invalid format") say less than this.
        _ => Err(format!(
            "the OTLP endpoint {endpoint:?} must be an http:// URL with a host (a collector or \
             agent beside the proxy; TLS is not supported)"
        )),
    }
}

/// Headers that say how the export request itself is framed and carried, left out of the
/// header list's ([`sent_headers`]): one given there had replaced Corral's own
/// (`content-length=5` sent 5 bytes of each batch's protobuf as the whole, the collector
/// answered 200, and the spans were lost without a word).
const OWN_HEADERS: [http::HeaderName; 11] = [
    http::header::HOST,
    http::header::CONTENT_LENGTH,
    http::header::CONTENT_TYPE,
    http::header::CONTENT_ENCODING,
    http::header::TRANSFER_ENCODING,
    http::header::CONNECTION,
    http::header::TE,
    http::header::TRAILER,
    http::header::UPGRADE,
    http::HeaderName::from_static("keep-alive"),
    http::HeaderName::from_static("proxy-connection"),
];

/// Headers every export carries (a collector's API key, say), from
/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`, as OpenTelemetry
/// defines them: `key=value` pairs joined by commas, values percent-encoded.
fn export_headers() -> Result<Vec<(http::HeaderName, http::HeaderValue)>, String> {
    let var = |name: &'static str| {
        let value = std::env::var(name).ok().filter(|v: &String| !v.trim().is_empty());
        value.map(|value| (name, value))
    };
    let Some((source, list)) =
        var("OTEL_EXPORTER_OTLP_TRACES_HEADERS").or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
    else {
        return Ok(Vec::new());
    };
    list.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            // Named by the variable it came from: nothing else names it ([`check_headers`]).
            let bad = |why: &str| format!("{source}'s OTLP export header {pair:?}: {why}");
            let (name, value) = pair.split_once('=').ok_or_else(|| bad("not key=value"))?;
            let name = http::HeaderName::try_from(name.trim()).map_err(|e| bad(&e.to_string()))?;
            let value: Vec<u8> = percent_encoding::percent_decode_str(value.trim()).collect();
            let value = http::HeaderValue::try_from(value).map_err(|e| bad(&e.to_string()))?;
            Ok((name, value))
        })
        .collect()
}

/// The bounded export queue: ended spans in, one thread exporting them in batches.
///
/// A span ends on the request path, so its way into the queue is one uncontended lock and a
/// push: no allocation, no wake-up. The export thread wakes on its own every [`BATCH_DELAY`], or
/// when a full batch is waiting, and takes everything queued at once. (A channel woke the thread
/// for every span: a third of tracing's cost on the request path, measured.)
#[derive(Debug)]
pub struct Queue {
    shared: std::sync::Arc<Shared>,
    thread: std::thread::Thread,
    /// Disconnected when the export thread has ended (taken by the one shutdown).
    ended: std::sync::Mutex<Option<mpsc::Receiver<()>>>,
}

#[derive(Debug, Default)]
struct Shared {
    spans: std::sync::Mutex<Vec<SpanData>>,
    /// Callers of `force_flush` waiting for everything queued before them to be exported.
    flushes: std::sync::Mutex<Vec<SyncSender<()>>>,
    /// Cancelled at shutdown, once the last flush has had its time: the export under way is
    /// given up and the thread ends, before the runtime its exports run on goes. (Left
    /// exporting to a collector that never answered, the thread's timer panicked on the runtime
    /// shutting down under it.)
    closing: CancellationToken,
}

impl Queue {
    /// Starts exporting to `endpoint` (the collector's traces URL) as `resource`; call from
    /// inside the runtime the exports should use.
    pub fn start(endpoint: &str, resource: Resource) -> Result<Self, String> {
        let collector = Collector {
            uri: endpoint_uri(endpoint)?,
            headers: sent_headers()?,
            resource,
            idle: tokio::sync::Mutex::default(),
        };
        Ok(Self::with(collector, tokio::runtime::Handle::current()))
    }

    fn with(collector: Collector, runtime: tokio::runtime::Handle) -> Self {
        let shared = std::sync::Arc::new(Shared {
            spans: std::sync::Mutex::new(Vec::with_capacity(2 * BATCH_SPANS)),
            flushes: std::sync::Mutex::default(),
            closing: CancellationToken::new(),
        });
        // Dropped by the thread as it ends: what shutdown waits for.
        let (ending, ended) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("corral-otlp".into())
            .spawn({
                let shared = shared.clone();
                move || {
                    export_loop(&collector, &shared, &runtime);
                    // All it held gone (its connection too) before shutdown is told it ended.
                    drop((collector, shared, runtime));
                    drop(ending);
                }
            })
            .expect("a thread starts")
            .thread()
            .clone();
        Self { shared, thread, ended: std::sync::Mutex::new(Some(ended)) }
    }

    /// Waits up to `wait` for everything queued before now to be exported.
    fn flush_within(&self, wait: Duration) {
        let (done, flushed) = mpsc::sync_channel(1);
        self.shared.flushes.lock().unwrap_or_else(|p| p.into_inner()).push(done);
        self.thread.unpark();
        let _ = flushed.recv_timeout(wait);
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let mut spans = self.shared.spans.lock().unwrap_or_else(|p| p.into_inner());
        // Past the stop nothing exports what is queued: counted dropped, not left uncounted.
        if spans.len() >= QUEUE_SPANS || self.shared.closing.is_cancelled() {
            drop(spans);
            metrics().spans_dropped.inc();
            return;
        }
        spans.push(span);
        if spans.len() == BATCH_SPANS {
            self.thread.unpark();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(FLUSH_WAIT);
        Ok(())
    }

    /// Flushes (up to `timeout`), then ends the export thread: an export still under way then
    /// (a collector that takes connections and never answers) is given up, its spans counted
    /// dropped. Call while the runtime still runs.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.flush_within(timeout);
        self.shared.closing.cancel();
        self.thread.unpark();
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Disconnected once the thread has ended; a second is ample for a cancelled wait.
        match ended.map(|ended| ended.recv_timeout(Duration::from_secs(1))) {
            Some(Err(mpsc::RecvTimeoutError::Timeout)) => {
                Err(OTelSdkError::Timeout(Duration::from_secs(1)))
            }
            _ => Ok(()),
        }
    }
}

/// How often failed exports are logged at most: a collector down (or a mistyped endpoint) once
/// dropped every span with nothing at the default log level, and logging each failure would
/// be a line per batch.
const FAILURES_LOGGED_EVERY: Duration = Duration::from_secs(60);

/// Failed exports since the last warning about them.
#[derive(Default)]
struct Failures {
    warned: Option<std::time::Instant>,
    exports: u64,
    spans: u64,
}

impl Failures {
    fn failed(&mut self, spans: usize, error: &Error) {
        self.exports += 1;
        self.spans += spans as u64;
        debug!(error = %error, spans, "an export of spans failed: dropped");
        let now = std::time::Instant::now();
        if self.warned.is_some_and(|at| now < at + FAILURES_LOGGED_EVERY) {
            return;
        }
        warn!(
            error = %error,
            exports = self.exports,
            spans = self.spans,
            "exports of spans to the OTLP endpoint failed: spans dropped (logged at most once a minute; corral_spans_dropped_total counts them)"
        );
        *self = Failures { warned: Some(now), exports: 0, spans: 0 };
    }

    /// At the stop: failures the once-a-minute rule held back are told now, or never would be.
    fn tell_the_rest(&self) {
        if self.exports > 0 {
            warn!(
                exports = self.exports,
                spans = self.spans,
                "exports of spans to the OTLP endpoint failed before the stop: spans dropped (corral_spans_dropped_total counts them)"
            );
        }
    }
}

fn export_loop(collector: &Collector, shared: &Shared, runtime: &tokio::runtime::Handle) {
    // Spans are large: the queue's buffers are sized once, so that pushing never moves them.
    let mut spare: Vec<SpanData> = Vec::with_capacity(2 * BATCH_SPANS);
    let mut failures = Failures::default();
    loop {
        std::thread::park_timeout(BATCH_DELAY);
        let flushed =
            std::mem::take(&mut *shared.flushes.lock().unwrap_or_else(|p| p.into_inner()));
        let mut spans = {
            let mut queued = shared.spans.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *queued, std::mem::take(&mut spare))
        };
        let closing = &shared.closing;
        for batch in spans.chunks(BATCH_SPANS) {
            let exported = match closing.is_cancelled() {
                true => Err("the proxy stopped before they were exported".into()),
                false => runtime.block_on(async {
                    tokio::select! {
                        exported = collector.export(batch) => exported,
                        () = closing.cancelled() => {
                            Err("the proxy stopped while they were being exported".into())
                        }
                    }
                }),
            };
            if let Err(e) = exported {
                metrics().spans_dropped.inc_by(batch.len() as u64);
                failures.failed(batch.len(), &e);
            }
        }
        spans.clear();
        spare = spans;
        spare.reserve(2 * BATCH_SPANS);
        flushed.into_iter().for_each(|done| {
            let _ = done.send(());
        });
        if closing.is_cancelled() {
            // Spans queued behind an export given up at the stop: dropped, so counted and told
            // (they had been in no count, the warning saying the one batch given up).
            let left = std::mem::take(&mut *shared.spans.lock().unwrap_or_else(|p| p.into_inner()));
            if !left.is_empty() {
                metrics().spans_dropped.inc_by(left.len() as u64);
                failures.failed(left.len(), &"the proxy stopped before they were exported".into());
            }
            failures.tell_the_rest();
            return;
        }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The collector spans go to, and a plain HTTP/1.1 client for it on the proxy's own hyper and
/// runtime (one kept-alive connection, reopened when it closes): fewer crates than an HTTP
/// client library.
#[derive(Debug)]
struct Collector {
    uri: Uri,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`, sent with every export.
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    resource: Resource,
    idle: tokio::sync::Mutex<Option<Link>>,
}

impl Collector {
    /// Exports `spans` in one OTLP/protobuf request; an answer other than 2xx is an error.
    async fn export(&self, spans: &[SpanData]) -> Result<(), Error> {
        self.export_body(otlp::encode(spans, &self.resource)).await
    }

    async fn export_body(&self, body: Vec<u8>) -> Result<(), Error> {
        tokio::time::timeout(EXPORT_TIMEOUT, self.post(body))
            .await
            .map_err(|_| "the OTLP export timed out")?
    }

    async fn post(&self, body: Vec<u8>) -> Result<(), Error> {
        let body = Bytes::from(body);
        let mut idle = self.idle.lock().await;
        let sent = match idle.take().filter(|link| !link.sender.is_closed()) {
            // A kept-alive connection the collector closed meanwhile (its idle timeout) fails
            // before the request goes out: once more on a fresh one. Dropped, such an export
            // lost the last spans of a burst (999 requests of 1,000 arrived).
            Some(kept) => match self.send(kept, body.clone()).await {
                Err(Failed::Unsent(_)) => self.send(connect(&self.uri).await?, body).await,
                sent => sent,
            },
            None => self.send(connect(&self.uri).await?, body).await,
        };
        let (link, status) = sent.map_err(Failed::into_error)?;
        *idle = link;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}").into())
        }
    }

    /// One export request on `link`; the connection back, to carry the next (None: the answer
    /// was too long to read to its end), with the answer's status.
    async fn send(
        &self,
        mut link: Link,
        body: Bytes,
    ) -> Result<(Option<Link>, StatusCode), Failed> {
        let sender = &mut link.sender;
        sender.ready().await.map_err(|e| Failed::Unsent(e.into()))?;
        // Origin form, with a Host header: what an HTTP/1.1 server expects from a client.
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = Request::post(path)
            .header(http::header::HOST, self.uri.authority().map_or("", |a| a.as_str()))
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| Failed::Sent(e.into()))?;
        for (name, value) in &self.headers {
            request.headers_mut().insert(name, value.clone());
        }
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            Err(e) if e.is_canceled() || e.is_closed() => return Err(Failed::Unsent(e.into())),
            Err(e) => return Err(Failed::Sent(e.into())),
        };
        let status = response.status();
        // Read to its end, so that the connection can carry the next export, but never kept,
        // and no further than ANSWER_READ: a collector's answer is a few bytes of status. Read
        // whole, an endpoint that answered with an endless body (a wrong service, a stream)
        // grew the proxy by gigabytes within the export's timeout. Past it, the connection is
        // closed and the next export makes a new one.
        let mut body = response.into_body();
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Failed::Sent(e.into()))?;
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > ANSWER_READ {
                return Ok((None, status));
            }
        }
        Ok((Some(link), status))
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A connection to the collector: the side that sends requests, and the task that drives the
/// socket, ended with it. Dropped (an export timed out, or failed), the task is aborted and the
/// socket closed: detached, the task of a timed-out export went on writing to a collector that
/// had stopped reading, keeping the socket and a whole export body (30 MB of 2,048 spans) for
/// good, one more at every export.
struct Link {
    sender: Sender,
    task: tokio::task::AbortHandle,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

/// How an export request failed: before it could have been read (the connection found closed:
/// worth sending again), or after it was written (sent again, the collector could get its
/// spans twice).
enum Failed {
    Unsent(Error),
    Sent(Error),
}

impl Failed {
    fn into_error(self) -> Error {
        match self {
            Failed::Unsent(e) | Failed::Sent(e) => e,
        }
    }
}

async fn connect(uri: &Uri) -> Result<Link, Error> {
    let host = uri.host().ok_or("the OTLP endpoint has no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, uri.port_u16().unwrap_or(80))).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let task = tokio::spawn(connection).abort_handle();
    Ok(Link { sender, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collector at `address`, no connection made yet.
    fn collector_at(address: std::net::SocketAddr) -> Collector {
        Collector {
            uri: format!("http://{address}/v1/traces").parse().unwrap(),
            headers: Vec::new(),
            resource: Resource::builder().build(),
            idle: tokio::sync::Mutex::default(),
        }
    }

    /// A collector whose answer never ends (a wrong endpoint, a stream): read whole, it grew
    /// the proxy by gigabytes within the export's timeout. The status counts, a little of the
    /// body is read, and the connection is closed (the collector's writes then fail).
    #[tokio::test]
    async fn an_endless_answer_is_read_no_further_than_a_little() {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let collector = collector_at(address);
        let answered = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(socket.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            reader.read_exact(&mut vec![0; length]).unwrap();
            let mut socket = socket;
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            socket.write_all(head.as_bytes()).unwrap();
            let chunk = [format!("{:x}\r\n", 1 << 20).into_bytes(), vec![b'x'; 1 << 20]].concat();
            let mut written = 0u64;
            while socket.write_all(&chunk).and_then(|()| socket.write_all(b"\r\n")).is_ok() {
                written += chunk.len() as u64;
            }
            written
        });
        collector.export_body(vec![1; 100]).await.expect("answered 200");
        assert!(collector.idle.lock().await.is_none(), "the connection was kept");
        let written = tokio::task::spawn_blocking(move || answered.join().unwrap()).await.unwrap();
        assert!(written < 64 << 20, "{written} bytes of the answer went out before it was closed");
    }

    /// A collector that accepts and never reads: the export times out, and its connection is
    /// closed with it (detached, it went on writing the body for good, socket and all).
    #[tokio::test(start_paused = true)]
    async fn a_timed_out_export_closes_its_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let collector = collector_at(address);
        let accepted = std::thread::spawn(move || listener.accept().unwrap().0);
        // Connected first: under paused time the clock moves on while a connect is pending,
        // and the export could time out before writing anything.
        *collector.idle.lock().await = Some(connect(&collector.uri).await.unwrap());
        // Far more than the sockets' buffers hold: the connection is still writing it.
        let failed = collector.export_body(vec![0; 64 << 20]).await.unwrap_err();
        assert!(failed.to_string().contains("timed out"), "{failed}");
        let mut socket = accepted.join().unwrap();
        let read = tokio::task::spawn_blocking(move || {
            socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            std::io::copy(&mut socket, &mut std::io::sink())
        });
        let read = read.await.unwrap().expect("the connection closes (no read times out)");
        // Some was written (the export was under way when cut), not all of it.
        assert!(read > 0 && read < 64 << 20, "{read} bytes of the body arrived");
    }

    /// An export under way to a collector that takes the connection and never answers (its
    /// request waits forever): the runtime, the connection held open, and the queue.
    fn stuck_export(
        span: impl Fn(u64) -> SpanData,
    ) -> (tokio::runtime::Runtime, std::net::TcpStream, Queue) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let collector = collector_at(listener.local_addr().unwrap());
        let queue =
            runtime.block_on(async { Queue::with(collector, tokio::runtime::Handle::current()) });
        queue.on_end(span(1));
        queue.thread.unpark();
        // The export is under way once its connection comes.
        let (connection, _) = listener.accept().unwrap();
        (runtime, connection, queue)
    }

    /// Shutdown gives the stuck export up once its flush has had its time, and the export
    /// thread ends while the runtime still runs. (Left exporting, its timer panicked on the
    /// runtime shutting down under it.)
    #[test]
    fn shutdown_ends_the_export_an_unanswering_collector_holds() {
        let scope = opentelemetry::InstrumentationScope::builder("test").build();
        let (runtime, _connection, queue) =
            stuck_export(|id| crate::trace::otlp::tests::span(id, &scope, false));
        assert!(queue.shutdown_with_timeout(Duration::from_millis(50)).is_ok());
        assert_eq!(std::sync::Arc::strong_count(&queue.shared), 1, "the thread has ended");
        drop(runtime);
    }

    #[test]
    fn spans_queued_behind_an_export_given_up_at_the_stop_are_dropped_not_left() {
        // Queued while the export waited on a collector that never answers: at the stop they
        // had stayed in the queue, in no count and no warning (and so did spans ending later).
        let scope = opentelemetry::InstrumentationScope::builder("test").build();
        let span = |id| crate::trace::otlp::tests::span(id, &scope, false);
        let (runtime, _connection, queue) = stuck_export(span);
        (2..5).for_each(|id| queue.on_end(span(id)));
        assert!(queue.shutdown_with_timeout(Duration::from_millis(50)).is_ok());
        let queued = || queue.shared.spans.lock().unwrap().len();
        assert_eq!(queued(), 0, "taken out and counted dropped");
        queue.on_end(span(5));
        assert_eq!(queued(), 0, "one ending after the stop is dropped at once");
        drop(runtime);
    }
}
