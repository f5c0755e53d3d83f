//! The HTTP server loop: accept, one task per connection (HTTP/1.1 and h2c), graceful drain, and
//! the limits that keep one client from holding resources: a cap on open connections (and past
//! it a small reserve on which only probes and the proxy's own pages are answered,
//! [`super::reserve`]), a deadline for a request's headers (a client dribbling them,
//! slowloris-style, is cut off), an idle timeout for keep-alive connections (both in
//! [`super::timeouts`]), a cap on header size and count (431; the size to the byte in
//! [`super::head`]), and a cap on the requests one HTTP/2 connection runs at once. A request's
//! body has its own clock, read in its handler ([`super::body`]); the cap on connections, and
//! its reserve, are kept under the open-file limit ([`crate::open_files`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::JobId;
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::error::ApiError;
use super::reserve::{self, Caps};
use super::timeouts::{Answer, Clock, Expired, Watched};
use super::{routes, App};
use crate::metrics::metrics;

/// How long answers given at the end of the grace period get to reach their clients.
const FLUSH: Duration = Duration::from_secs(2);

/// hyper's own bound on a request head's headers, used when none is set: set, even to the same
/// number, hyper fills its arrays for the headers element by element for every request head
/// (0.8% of the proxy's CPU at 64 echo clients); left to its default, they are built at once.
const HYPER_MAX_HEADERS: usize = 100;

/// The limits of the HTTP edge.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may wait, idle, for its next request.
    pub idle_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// The longest a streamed answer may last: the longest of the stages' stream timeouts.
    pub stream_timeout: Duration,
    /// Most requests in progress at once on one HTTP/2 connection (`--http2-max-streams`).
    pub http2_max_streams: u32,
}

/// A HEAD request's answer: its headers, the length its body would have had, and no body.
/// hyper's HTTP/1.1 server leaves a HEAD answer's body out itself; its HTTP/2 server sent it,
/// which clients refuse as a protocol error.
fn without_body(mut response: http::Response<super::Body>) -> http::Response<super::Body> {
    if let Some(length) = hyper::body::Body::size_hint(response.body()).exact() {
        response.headers_mut().entry(http::header::CONTENT_LENGTH).or_insert(length.into());
    }
    response.map(|_| http_body_util::Empty::new().boxed_unsync())
}

/// An answer to an HTTP/1.0 client that closes the connection, written as HTTP/1.0: hyper
/// appends `keep-alive` to the `Connection` of an HTTP/1.1 answer to a keep-alive HTTP/1.0
/// client without looking for `close` (`Conn::fix_keep_alive`), and such a client read
/// `connection: close, keep-alive` on an answer after which the connection did close. As
/// HTTP/1.0, hyper ends keep-alive itself and leaves the field as it is. (hyper writes every
/// answer to an HTTP/1.0 client as HTTP/1.0 whatever its version: only its reading changes.)
/// An answer of no known length (a stream) closes too: HTTP/1.0 has no chunks, its end is the
/// connection's; it had said `keep-alive`, then closed.
fn closing_http10(response: &mut http::Response<super::Body>) {
    let of_no_length = hyper::body::Body::size_hint(response.body()).exact().is_none();
    if of_no_length {
        let close = http::HeaderValue::from_static("close");
        response.headers_mut().insert(http::header::CONNECTION, close);
    }
    let closes = response.headers().get_all(http::header::CONNECTION).iter().any(|value| {
        value.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    });
    if closes {
        *response.version_mut() = http::Version::HTTP_10;
    }
}

/// hyper's HTTP/2 bound on a request head: h2 counts each field as its name and value plus 32
/// bytes, pseudo-fields (`:authority`...) included, and answered past it with a bare 431 before
/// Corral's own check: 90 headers of a 62 KB head passed over HTTP/1.1 and were refused over
/// HTTP/2. Room for every field `--max-headers` allows, and the four pseudo-fields, at 32 bytes
/// each, rounded up to a power of two as HTTP/1.1's read buffer is, leaves the byte-exact bound
/// to `head::head_size` on both, with its JSON answer.
fn h2_header_list_size(limits: &Limits) -> u32 {
    let fields = limits.max_headers + 4;
    let size = limits.max_header_bytes.saturating_add(fields.saturating_mul(32));
    u32::try_from(size.next_power_of_two()).unwrap_or(u32::MAX)
}

/// Serves until `stop` is cancelled, then stops accepting and lets open requests finish for up
/// to `grace`. If that runs out, `expired` is cancelled (whoever holds the remaining jobs answers
/// them) and the answers get [`FLUSH`] to go out.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    stop: CancellationToken,
    grace: Duration,
    expired: CancellationToken,
    limits: Limits,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let mut http1 = builder.http1();
    if limits.max_headers != HYPER_MAX_HEADERS {
        http1.max_headers(limits.max_headers);
    }
    http1
        .timer(TokioTimer::new())
        // Corral keeps the header deadline itself: hyper's would also cut idle connections.
        .header_read_timeout(None)
        // hyper reads a request head into this buffer; a head that does not fit is hyper's 431.
        // The buffer grows in powers of two, so the bound to the byte is kept at the edge
        // (`head::head_size`), with the JSON answer every other error has.
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(h2_header_list_size(&limits))
        // Each stream may hold a body as it arrives and an answer as it goes: hyper's default of
        // 200 per connection made the memory bound 200 times what one connection holds.
        .max_concurrent_streams(limits.http2_max_streams);
    // A reserve connection carries one request ([`reserve`]): HTTP/1.1, which probes and
    // scrapers speak, since an h2 connection cannot be held to one request by an answer's
    // header. (An h2c client past the cap got an HTTP/1.1 503 it could not read before, too.)
    let mut one_request = builder.clone().http1_only();
    one_request.http1().keep_alive(false);
    let caps = Caps::new(limits.max_connections);
    // The connections' tasks: the drain waits for them to end.
    let connections = TaskTracker::new();
    // Each accepted connection: admitted under the cap (or refused 503) and served on a task of
    // its own until it ends, expires, or the drain closes it.
    let admit = |stream: TcpStream| {
        // Small answers go out at once rather than waiting for Nagle's timer.
        let _ = stream.set_nodelay(true);
        let Some(permit) = caps.admit() else {
            metrics().shed.with_label_values(&[super::error::TOO_MANY_CONNECTIONS, ""]).inc();
            tokio::spawn(refuse(stream));
            return;
        };
        let reserved = permit.reserve;
        let app = app.clone();
        // A probe sends its request at once: a reserve connection waits for one no longer than
        // for a head, so that idle connections past the cap do not keep the reserve for the
        // whole keep-alive timeout.
        let idle_timeout = if reserved {
            limits.idle_timeout.min(limits.header_read_timeout)
        } else {
            limits.idle_timeout
        };
        let clock = Clock::new(limits.header_read_timeout, idle_timeout, limits.stream_timeout);
        let service = service_fn({
            let clock = clock.clone();
            move |request| {
                let (app, in_progress) = (app.clone(), clock.request());
                async move {
                    // A HEAD request runs its handler as a GET would (the length is the body's).
                    let head = request.method() == hyper::Method::HEAD;
                    let http10 = request.version() == http::Version::HTTP_10;
                    let http2 = request.version() == http::Version::HTTP_2;
                    let mut response = if reserved {
                        reserve::answer(&app, request).await
                    } else {
                        routes::route(&app, request).await
                    };
                    if head {
                        response = without_body(response);
                    }
                    // Said by Corral, not left to hyper's graceful shutdown: a connection's
                    // first request, read and answered in the poll that told its protocol, is
                    // answered before the connection can be asked to shut down, and its answer
                    // said keep-alive on a connection that then closed. (HTTP/2 has GOAWAY.)
                    if !http2 && app.draining.load(std::sync::atomic::Ordering::Relaxed) {
                        let close = http::HeaderValue::from_static("close");
                        response.headers_mut().insert(http::header::CONNECTION, close);
                    }
                    if http10 {
                        closing_http10(&mut response);
                    }
                    // Its request is in progress until hyper has taken the last of the answer:
                    // a request pipelined behind a large answer started the header clock, and
                    // cut the answer, when it ended with the handler.
                    Ok::<_, Infallible>(response.map(|body| Answer::new(body, in_progress)))
                }
            }
        });
        let io = TokioIo::new(Watched::new(stream, clock.clone()));
        let builder = if reserved { &one_request } else { &builder };
        // Reserve connections drain on shutdown as every other does.
        let connection = builder.serve_connection(io, service).into_owned();
        let draining = stop.clone();
        connections.spawn(async move {
            // At the drain an idle connection gets a quiet second, not the idle timeout, and
            // hyper is asked to shut it down gracefully (HTTP/1.1: close after the answer in
            // progress; HTTP/2: GOAWAY) only once it has read the first bytes: asked before, it
            // drops the connection with the request waiting unread in the socket, and the
            // client, its request sent, meets a reset (a connection accepted a moment before
            // the signal, or one taken from the accept queue after it). hyper_util's
            // `GracefulShutdown` asked every connection at once.
            let drain = async {
                draining.cancelled().await;
                clock.drain();
                clock.told().await;
            };
            tokio::pin!(connection, drain);
            let mut asked = false;
            loop {
                tokio::select! {
                    // The connection first: a request waiting in the socket as the drain begins
                    // is read before hyper is asked to shut down, which closes an idle
                    // HTTP/1.1 connection at once, unread.
                    biased;
                    ended = connection.as_mut() => break ended_with(ended),
                    // Dropping the connection closes it: no request is in progress (idle), a
                    // head is still arriving after its deadline, or only answers are being
                    // written to a client that stopped reading them; no handler is cut short.
                    why = clock.expired() => break closed_by(why),
                    () = drain.as_mut(), if !asked => {
                        asked = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(permit);
        });
    };
    let mut accept_failures = crate::open_files::AcceptFailures::default();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_failures.accepted("HTTP connections");
                    stream
                }
                Err(e) => {
                    // Typically out of file descriptors: back off a little and keep serving.
                    accept_failures.failed("an HTTP connection", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        admit(stream);
    }
    // Connections already in the kernel's accept queue are served too, their requests answered
    // 503 `shutting_down` as any new request in the drain: closing the listener on them reset
    // each after its request was sent, with no answer (11 of 59 connections opened around the
    // signal in a probe).
    for stream in waiting(listener) {
        admit(stream);
    }
    info!("no longer accepting HTTP connections; draining open requests");
    connections.close();
    let drained = connections.wait();
    tokio::pin!(drained);
    if tokio::time::timeout(grace, &mut drained).await.is_err() {
        warn!("the grace period ran out; answering what is left 503");
        expired.cancel();
        let _ = tokio::time::timeout(FLUSH, drained).await;
    }
}

/// A connection that hyper ended: one it ended with an error is logged, and counted if hyper
/// answered 400 or 431 itself, before any request existed to count (`is_parse` covers a head too
/// large as well).
fn ended_with(ended: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(e) = ended {
        debug!(error = %e, "HTTP connection ended with an error");
        if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_parse) {
            closed("malformed");
        }
    }
}

/// A connection one of its clocks closes: logged, and counted under its reason.
fn closed_by(why: Expired) {
    match why {
        Expired::Header => {
            debug!("closed a connection: request head too slow");
            closed("head_timeout");
        }
        Expired::Idle => debug!("closed an idle keep-alive connection"),
        Expired::Stalled => {
            debug!("closed a connection whose client stopped reading its answers");
            closed("stalled");
        }
    }
}

/// The connections waiting in the listener's accept queue, taken without waiting, and the
/// listener closed. Accepted through std, not tokio: tokio's accept stops at the task's budget
/// (128), and a queue longer than that was reset past it; nor does it see connections that came
/// after the reactor last looked. A failed accept (a connection aborted while queued) is passed
/// over; the bound keeps a run of failures (out of descriptors) from holding the drain.
fn waiting(listener: TcpListener) -> Vec<TcpStream> {
    let Ok(listener) = listener.into_std() else { return Vec::new() };
    let mut streams = Vec::new();
    let mut failures = 0;
    while failures < 64 {
        let accepted = listener.accept().and_then(|(stream, _)| {
            // An accepted socket does not inherit the listener's non-blocking mode.
            stream.set_nonblocking(true)?;
            TcpStream::from_std(stream)
        });
        match accepted {
            Ok(stream) => streams.push(stream),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => failures += 1,
        }
    }
    streams
}

fn closed(reason: &str) {
    metrics().connections_closed.with_label_values(&[reason]).inc();
}

/// Refused connections that may linger at once, each holding its descriptor up to a second:
/// past them a refusal closes as soon as its 503 is written. A flood past the cap is when
/// refusals come; unbounded, lingering ones held a hundred descriptors more, out of the ones
/// the worker socket, worker restarts and shared memory need (`open_files::RESERVED` counts
/// these 32).
static LINGERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(32);

/// Answers a connection over the cap and its reserve 503 and closes it, without reading its
/// request. The answer is written straight to the socket: hyper is not involved, so it costs no
/// buffers and cannot hang. What the client sends meanwhile (its head, its body) is then read
/// and dropped until it closes, for [`reserve::LINGER`] and [`reserve::LINGER_BYTES`] at most,
/// by up to [`LINGERING`] refusals at once: a socket closed with bytes unread is reset, and a
/// client that sends its body after its head (Python's urllib) got that reset, `EPIPE`, instead
/// of the 503 waiting for it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(reserve::LINGER, async {
        // The body a reserve connection's refusal has too.
        let body = ApiError::too_many_connections().body();
        // An id as every answer has, though no request was read to give one to.
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             x-request-id: {}\r\nretry-after: 1\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n",
            JobId::new(),
            body.len(),
        );
        stream.write_all(&[head.as_bytes(), &body].concat()).await?;
        stream.shutdown().await?;
        let Ok(_lingering) = LINGERING.try_acquire() else { return Ok(()) };
        let mut unread = vec![0; 16 * 1024];
        let mut read = 0;
        while read < reserve::LINGER_BYTES {
            match stream.read(&mut unread).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}
