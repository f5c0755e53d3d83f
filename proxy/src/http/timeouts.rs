//! The two clocks of an HTTP connection, kept by Corral rather than hyper because hyper runs one
//! clock for both (its header timeout starts as soon as a connection is idle):
//!
//! - the **header deadline** (`--header-read-timeout-ms`): from the first byte of a request head
//!   to the request reaching a handler. A client dribbling headers (slowloris) is cut off.
//! - the **idle timeout** (`--idle-timeout-ms`): how long a keep-alive connection may sit with no
//!   request in progress and nothing written. It is then closed, as nginx's `keepalive_timeout`
//!   does; a request that started in time is never cut by it.
//!
//! [`Watched`] wraps the socket and notes when a request head starts (bytes read while no request
//! is in progress) and when the connection writes; [`Clock::request`] marks a request from its
//! handler's start to its end — for a streamed answer, to its body's end ([`Streaming`]): a
//! stream is a request in progress until its last event is written, so neither clock cuts it
//! (a stream whose worker sends nothing for longer than the idle timeout once lost its
//! terminal event that way, and a pipelined request's first bytes started the header clock).
//! While only streams are in progress the connection has a third bound instead: nothing
//! written for the longest stream timeout plus the idle timeout (every stream has ended by
//! then), so a client that stopped reading does not hold its connection for ever.
//! [`Clock::expired`] completes when a clock runs out. HTTP/2 connections (they open with the h2
//! preface) keep only the idle clock: their frames (pings, settings) arrive between requests and
//! are not request heads.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Body;

/// What an HTTP/2 connection's first bytes are.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Which clock ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request head took longer than the header deadline.
    Header,
    /// The connection sat idle past the idle timeout.
    Idle,
    /// Only streams were in progress, and nothing was written for longer than any stream lasts.
    Stalled,
}

pub struct Clock {
    state: Mutex<State>,
    /// Woken when a request starts or ends, or a head starts: the deadline may have moved.
    changed: Notify,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// How long a connection whose only requests in progress are streams may write nothing.
    stall_timeout: Duration,
}

struct State {
    /// Requests in progress now (HTTP/2 runs several at once): in a handler, or a stream whose
    /// body is still being written.
    active: usize,
    /// Of those, the streams being written.
    streams: usize,
    /// When the first byte of the next request head arrived, if it has. Bytes that come while
    /// only streams are in progress are that head too (a stream's own request was read whole
    /// before its answer began); its clock starts again when the last stream ends.
    head_started: Option<Instant>,
    /// When the connection last finished a request or wrote.
    idle_since: Instant,
    /// Whether any byte was read yet (the first ones tell HTTP/2 apart).
    opened: bool,
    http2: bool,
}

impl Clock {
    /// The clocks of a new connection; `stream_timeout` is the longest a stream may last.
    pub fn new(
        header_timeout: Duration,
        idle_timeout: Duration,
        stream_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                active: 0,
                streams: 0,
                head_started: None,
                idle_since: Instant::now(),
                opened: false,
                http2: false,
            }),
            changed: Notify::new(),
            header_timeout,
            idle_timeout,
            stall_timeout: stream_timeout.saturating_add(idle_timeout),
        })
    }

    /// Marks a request as in progress until the returned guard is dropped.
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        {
            let mut state = self.lock();
            state.active += 1;
            state.head_started = None;
        }
        self.changed.notify_one();
        RequestGuard { clock: self.clone(), stream: false }
    }

    /// Completes when the header deadline or the idle timeout runs out.
    pub async fn expired(&self) -> Expired {
        loop {
            let next = {
                let state = self.lock();
                if state.active > state.streams {
                    None
                } else if state.streams > 0 {
                    Some((state.idle_since + self.stall_timeout, Expired::Stalled))
                } else if let Some(started) = state.head_started {
                    Some((started + self.header_timeout, Expired::Header))
                } else {
                    Some((state.idle_since + self.idle_timeout, Expired::Idle))
                }
            };
            match next {
                Some((at, why)) if Instant::now() >= at => return why,
                Some((at, _)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }

    fn read(&self, bytes: &[u8]) {
        let started = {
            let mut state = self.lock();
            if !state.opened {
                state.opened = true;
                state.http2 = bytes.starts_with(H2_PREFACE);
            }
            // Bytes read while a handler runs are its request's body; while nothing, or only
            // streams, are in progress, they begin the next request's head.
            let starts_head =
                state.active == state.streams && state.head_started.is_none() && !state.http2;
            if starts_head {
                state.head_started = Some(Instant::now());
            }
            starts_head
        };
        if started {
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        self.lock().idle_since = Instant::now();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A request in progress; its end restarts the idle clock.
pub struct RequestGuard {
    clock: Arc<Clock>,
    /// Whether it is a stream being written ([`RequestGuard::streaming`]).
    stream: bool,
}

impl RequestGuard {
    /// The request's answer is a stream: it stays in progress while its body is written.
    pub fn streaming(mut self) -> Self {
        {
            let mut state = self.clock.lock();
            state.streams += 1;
            // The stall clock starts with the stream: its first event may be a while coming.
            state.idle_since = Instant::now();
        }
        self.stream = true;
        self.clock.changed.notify_one();
        self
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        {
            let mut state = self.clock.lock();
            state.active -= 1;
            state.streams -= usize::from(self.stream);
            state.idle_since = Instant::now();
            if state.active == 0 && state.head_started.is_some() {
                // A head that came behind a stream has its deadline from the stream's end: it
                // could not be read before (a slow one would otherwise get the idle timeout, or
                // one that came early in a long stream be cut the moment it ends).
                state.head_started = Some(Instant::now());
            }
        }
        self.clock.changed.notify_one();
    }
}

/// A streamed answer's body, holding its request's guard until hyper has written (or dropped)
/// the last of it.
pub struct Streaming {
    body: Body,
    _request: RequestGuard,
}

impl Streaming {
    pub fn new(body: Body, request: RequestGuard) -> Self {
        Self { body, _request: request.streaming() }
    }
}

impl hyper::body::Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, reporting reads and writes to its [`Clock`].
pub struct Watched<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, clock: Arc<Clock>) -> Self {
        Self { inner, clock }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_secs(5);
    const STREAM: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_outlives_the_header_deadline_until_the_idle_timeout() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let start = Instant::now();
        assert_eq!(clock.expired().await, Expired::Idle);
        assert_eq!(start.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_must_finish_within_the_header_deadline() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let watchdog = tokio::spawn({
            let clock = clock.clone();
            async move { (clock.expired().await, Instant::now()) }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let head = Instant::now();
        clock.read(b"POST /infer HTTP/1.1\r\n");
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - head), (Expired::Header, HEADER));
    }

    #[tokio::test(start_paused = true)]
    async fn no_clock_runs_while_a_request_is_in_progress() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"GET / HTTP/1.1\r\n\r\n");
        let request = clock.request();
        let watchdog = tokio::spawn({
            let clock = clock.clone();
            async move { (clock.expired().await, Instant::now()) }
        });
        tokio::time::sleep(IDLE * 3).await;
        assert!(!watchdog.is_finished());
        let ended = Instant::now();
        drop(request);
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - ended), (Expired::Idle, IDLE), "the idle clock restarts at the end");
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_are_not_heads() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let start = Instant::now();
        assert_eq!(clock.expired().await, Expired::Idle);
        assert_eq!(start.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_being_written_is_cut_by_neither_clock() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"POST /infer HTTP/1.1\r\n\r\n");
        let stream = clock.request().streaming();
        let watchdog = tokio::spawn({
            let clock = clock.clone();
            async move { (clock.expired().await, Instant::now()) }
        });
        // A worker silent for longer than the idle timeout, then a chunk.
        tokio::time::sleep(IDLE * 3).await;
        clock.wrote();
        // A pipelined request's first bytes while the stream goes on.
        clock.read(b"GET /healthz HTTP/1.1\r\n");
        tokio::time::sleep(IDLE * 3).await;
        assert!(!watchdog.is_finished(), "a stream in progress was cut");
        drop(stream);
        drop(clock.request()); // the pipelined request, served once the stream is over
        let ended = Instant::now();
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - ended), (Expired::Idle, IDLE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_whose_client_stopped_reading_is_cut_past_any_streams_length() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let _stream = clock.request().streaming();
        tokio::time::sleep(Duration::from_secs(10)).await;
        clock.wrote();
        let last = Instant::now();
        assert_eq!(clock.expired().await, Expired::Stalled);
        assert_eq!(last.elapsed(), STREAM + IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_request_beside_a_stream_holds_the_connection_open() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let _stream = clock.request().streaming();
        let plain = clock.request();
        let watchdog = tokio::spawn({
            let clock = clock.clone();
            async move { clock.expired().await }
        });
        tokio::time::sleep((STREAM + IDLE) * 2).await;
        assert!(!watchdog.is_finished());
        drop(plain);
        assert_eq!(watchdog.await.unwrap(), Expired::Stalled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_behind_a_stream_has_the_header_deadline_from_the_streams_end() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let stream = clock.request().streaming();
        clock.read(b"GET /healthz HTTP/1.1\r\n"); // a slow head, pipelined
        tokio::time::sleep(IDLE * 2).await;
        drop(stream);
        let ended = Instant::now();
        assert_eq!(clock.expired().await, Expired::Header);
        assert_eq!(ended.elapsed(), HEADER);
    }
}
