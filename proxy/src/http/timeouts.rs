//! The two clocks of an HTTP connection, kept by Corral rather than hyper because hyper runs one
//! clock for both (its header timeout starts as soon as a connection is idle):
//!
//! - the **header deadline** (`--header-read-timeout-ms`): from the first byte of a request head
//!   to the request reaching a handler. A client dribbling headers (slowloris) is cut off.
//! - the **idle timeout** (`--idle-timeout-ms`): how long a keep-alive connection may sit with no
//!   request in progress. It is then closed, as nginx's `keepalive_timeout` does; a request that
//!   started in time is never cut by it.
//!
//! [`Watched`] wraps the socket and notes when a request head starts and, on HTTP/1.1, when the
//! connection writes; [`Clock::request`] marks a request from its handler's start until hyper has
//! taken the last of its answer ([`Answer`] holds the request's guard in the body). An answer
//! being written is a request in progress, so neither clock cuts it: a stream whose worker was
//! silent for longer than the idle timeout once lost its terminal event that way, and a request
//! pipelined behind a large answer started the header clock and cut the answer short (a head
//! that starts behind an answer now has its deadline from the answer's end). While only answers
//! are being written the connection has a third bound instead, for a client that stopped
//! reading: no progress for the idle timeout — or, while a stream is among them, for the longest
//! a stream may last plus the idle timeout (every stream has ended by then). [`Clock::expired`]
//! completes when a clock runs out.
//!
//! Bytes read while a handler runs are taken for its request's body: where that body ends is
//! hyper's to know, so a head that starts before the handler returns has the idle timeout, not
//! the header deadline. HTTP/2 connections (they open with the h2 preface) have no header clock
//! at all: their frames (pings, settings) arrive between requests and are not request heads, so
//! a slow HEADERS frame has the idle timeout too. Nor do their writes count as progress: hyper
//! answers a client's PINGs and SETTINGS itself, and a client sending them held an idle
//! connection, or answers it never read, for ever. Progress there is a request ending, an answer
//! beginning, or an answer handing hyper its next piece: hyper hands a piece to h2 and waits for
//! window room for it before it asks for the next, so each piece taken means the client read
//! the one before the last. A reader must take a piece (16 KiB) per idle timeout.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Body;

/// How long a connection with no request in progress stays open once the server drains, counted
/// from the drain or its last progress, whichever is later: time for a client to acknowledge an
/// HTTP/2 GOAWAY. An answer hyper has taken that is still leaving the socket is progress at each
/// write (HTTP/2's writes count once the server drains).
pub const DRAIN_QUIET: Duration = Duration::from_secs(1);

/// What an HTTP/2 connection's first bytes are: the whole preface, as hyper reads it before it
/// tells the protocol (told at its first 14 bytes, a connection whose preface came in pieces was
/// asked to shut down while hyper was still reading it, and dropped unread).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The most bytes of an HTTP/2 answer handed to hyper at once. hyper asks a body for its next
/// frame only once h2 had window room for the one before it, so each piece it takes is the
/// client reading; a large answer handed over whole would sit in h2's send buffer with no
/// progress to see. h2's default DATA frame size: nothing changes on the wire, and a slow but
/// steady reader makes progress often (at 64 KiB, one reading 16 KB/s was cut at a 2 s idle
/// timeout its HTTP/1.1 twin met). (HTTP/1.1 writes count as they are: its frames stay whole.)
const PIECE: usize = 16 * 1024;

/// Which clock ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request head took longer than the header deadline.
    Header,
    /// The connection sat idle past the idle timeout.
    Idle,
    /// Only answers were being written, and none made progress for longer than its bound: their
    /// client stopped reading.
    Stalled,
}

pub struct Clock {
    state: Mutex<State>,
    /// Woken when a request starts or ends, an answer begins, or a head starts: the deadline may
    /// have moved.
    changed: Notify,
    /// Cancelled once the first bytes have told HTTP/1.1 from HTTP/2 ([`Clock::told`]); set
    /// under the state's lock.
    told: CancellationToken,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// How long a connection whose only requests in progress are answers being written, a stream
    /// among them, may make no progress.
    stall_timeout: Duration,
}

struct State {
    /// Requests in progress now (HTTP/2 runs several at once): in a handler, or with an answer
    /// still being written.
    active: usize,
    /// Of those, the answers being written (their handlers have returned).
    writing: usize,
    /// Of those, the streams.
    streams: usize,
    /// When the first byte of the next request head arrived, if it has. Bytes that come while
    /// only answers are being written are that head too (the answers' requests were read whole
    /// before they began); its clock starts again when the last answer has been written.
    head_started: Option<Instant>,
    /// When the connection last made progress: a request ended, an answer began or handed
    /// hyper a frame, or (HTTP/1.1) the socket took a write.
    idle_since: Instant,
    /// When the server began to drain, if it has ([`Clock::drain`]).
    drain_started: Option<Instant>,
    /// Bytes of [`H2_PREFACE`] read so far, until it is told: a client may send it in pieces.
    preface: usize,
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
                writing: 0,
                streams: 0,
                head_started: None,
                idle_since: Instant::now(),
                drain_started: None,
                preface: 0,
                http2: false,
            }),
            changed: Notify::new(),
            told: CancellationToken::new(),
            header_timeout,
            idle_timeout,
            stall_timeout: stream_timeout.saturating_add(idle_timeout),
        })
    }

    /// Marks a request as in progress until the returned guard is dropped: hand it to its
    /// answer's body ([`Answer::new`]) to keep it until the answer has been written.
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        {
            let mut state = self.lock();
            state.active += 1;
            state.head_started = None;
        }
        self.changed.notify_one();
        RequestGuard { clock: self.clone(), writing: false, stream: false }
    }

    /// The server drains: from now on the connection is idle for [`DRAIN_QUIET`] at most.
    /// hyper closes an idle HTTP/1.1 connection at once, but asks an HTTP/2 client to
    /// acknowledge its GOAWAY with a PING first, and a client that reads only while it has a
    /// request out (httpx's HTTP/2 pool) never does: one such idle connection held the drain,
    /// and the workers, for the whole grace period, then had "what is left" answered 503.
    pub fn drain(&self) {
        self.lock().drain_started.get_or_insert_with(Instant::now);
        self.changed.notify_one();
    }

    /// Completes once the connection's first bytes have told HTTP/1.1 from HTTP/2 (at once if
    /// they have). Until then hyper has read nothing of a request, and asked to shut down
    /// gracefully it drops the connection, however many bytes of one wait in the socket.
    pub async fn told(&self) {
        self.told.cancelled().await;
    }

    /// Completes when the header deadline, the idle timeout or the stall bound runs out.
    pub async fn expired(&self) -> Expired {
        loop {
            let next = {
                let state = self.lock();
                if state.active > state.writing {
                    // A handler runs: its body and its job have clocks of their own.
                    None
                } else if state.streams > 0 {
                    Some((state.idle_since + self.stall_timeout, Expired::Stalled))
                } else if state.writing > 0 {
                    // A one-shot answer its client does not read: the idle timeout, as when it
                    // did not count as a request in progress.
                    Some((state.idle_since + self.idle_timeout, Expired::Stalled))
                } else if let Some(started) = state.head_started {
                    // Draining, a head still arriving has a quiet second from the drain (or
                    // from its start) too: it will be answered 503 whenever it ends, and a client
                    // that sent a byte and stalled held the drain for the header timeout.
                    let mut at = started + self.header_timeout;
                    if let Some(drain) = state.drain_started {
                        at = at.min(started.max(drain) + DRAIN_QUIET);
                    }
                    Some((at, Expired::Header))
                } else {
                    let mut at = state.idle_since + self.idle_timeout;
                    if let Some(drain) = state.drain_started {
                        at = at.min(state.idle_since.max(drain) + DRAIN_QUIET);
                    }
                    Some((at, Expired::Idle))
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
            if !self.told.is_cancelled() {
                // Told from the preface however it is cut: a client that wrote its first byte
                // on its own was taken for HTTP/1.1, its PINGs (acked by hyper) counted as
                // progress, and answers it never read were held for good.
                let rest = &H2_PREFACE[state.preface..];
                let seen = rest.len().min(bytes.len());
                if bytes[..seen] != rest[..seen] {
                    self.told.cancel();
                } else if state.preface + seen == H2_PREFACE.len() {
                    (state.http2, state.head_started) = (true, None);
                    self.told.cancel();
                } else {
                    state.preface += seen;
                }
            }
            // Bytes read while a handler runs are its request's body (or, unknowably, the next
            // head: README says such a head has the idle timeout); while nothing, or only answers
            // being written, are in progress, they begin the next request's head.
            let starts_head =
                state.active == state.writing && state.head_started.is_none() && !state.http2;
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
        let mut state = self.lock();
        // hyper writes on an HTTP/2 connection of its own accord (acks of the client's PINGs and
        // SETTINGS): progress there is counted by the answers instead ([`Answer`]). Once the
        // server drains, writes count there too: the last pieces of an answer hyper has taken
        // may still be in h2's send buffer, and the quiet second must not cut them; a client
        // that reads nothing takes no bytes, and one that pings is held to the grace period.
        if !state.http2 || state.drain_started.is_some() {
            state.idle_since = Instant::now();
        }
    }

    /// An answer handed hyper a frame. The deadline only moves later: no one need be woken.
    fn progressed(&self) {
        self.lock().idle_since = Instant::now();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A request in progress; its end restarts the idle clock.
pub struct RequestGuard {
    clock: Arc<Clock>,
    /// Whether its handler has returned and its answer is being written.
    writing: bool,
    /// Whether that answer is a stream.
    stream: bool,
}

impl RequestGuard {
    /// The request's handler has returned its answer, a stream or not; the request stays in
    /// progress while the answer is written. Returns whether the connection is HTTP/2.
    fn writing(&mut self, stream: bool) -> bool {
        let http2 = {
            let mut state = self.clock.lock();
            state.writing += 1;
            state.streams += usize::from(stream);
            // The stall clock starts with the answer: a stream's first event may be a while
            // coming.
            state.idle_since = Instant::now();
            state.http2
        };
        (self.writing, self.stream) = (true, stream);
        self.clock.changed.notify_one();
        http2
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        {
            let mut state = self.clock.lock();
            state.active -= 1;
            state.writing -= usize::from(self.writing);
            state.streams -= usize::from(self.stream);
            state.idle_since = Instant::now();
            if state.active == 0 && state.head_started.is_some() {
                // A head that came behind an answer has its deadline from the answer's end: it
                // could not be read before (a slow one would otherwise get the idle timeout, or
                // one that came early in a long answer be cut the moment it ends).
                state.head_started = Some(Instant::now());
            }
        }
        self.clock.changed.notify_one();
    }
}

/// Every answer's body as hyper gets it: the handler's body, holding its request's guard until
/// hyper has taken the last of it (or dropped it), and telling the clock of each frame taken.
pub struct Answer {
    body: Body,
    /// The rest of the body's last frame, handed over a [`PIECE`] at a time (HTTP/2 only).
    rest: Bytes,
    /// Whether the connection is HTTP/2, where frames go in pieces.
    http2: bool,
    /// Whether a frame has been handed over yet.
    started: bool,
    request: RequestGuard,
}

impl Answer {
    pub fn new(body: Body, mut request: RequestGuard) -> Self {
        // A body of no known size is a stream (the only kind Corral writes).
        let stream = hyper::body::Body::size_hint(&body).exact().is_none();
        let http2 = request.writing(stream);
        Self { body, rest: Bytes::new(), http2, started: false, request }
    }
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            let frame = match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(never)) => match never {},
                None => return Poll::Ready(None),
            };
            match frame.into_data() {
                Ok(data) => this.rest = data,
                Err(other) => return Poll::Ready(Some(Ok(other))),
            }
        }
        // Splitting shares the frame's bytes: no copy, and no allocation past the first split.
        let piece = if this.http2 && this.rest.len() > PIECE {
            this.rest.split_to(PIECE)
        } else {
            std::mem::take(&mut this.rest)
        };
        this.started = true;
        if this.http2 {
            // HTTP/1.1 counts the socket's writes as they happen ([`Watched`]): no second lock.
            this.request.clock.progressed();
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        if self.http2 {
            // hyper's HTTP/2 writer keeps the body until its last piece has had room in the
            // window.
            self.rest.is_empty() && self.body.is_end_stream()
        } else {
            // hyper's HTTP/1.1 writer drops a body that says it has ended as soon as it takes
            // the last frame, all of it still unwritten; one that does not say so it drops once
            // its write buffer is under its bound (`max_buf_size`), or asks again and finds the
            // end. Said only of a body with nothing to write at all.
            !self.started && self.body.is_end_stream()
        }
    }

    fn size_hint(&self) -> SizeHint {
        let hint = self.body.size_hint();
        if self.rest.is_empty() {
            return hint;
        }
        let rest = self.rest.len() as u64;
        let mut sum = SizeHint::new();
        sum.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            sum.set_upper(upper + rest);
        }
        sum
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
    use http_body_util::{BodyExt, Empty, Full};
    use hyper::body::Body as _;
    use tokio::sync::mpsc;

    use super::*;

    const HEADER: Duration = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_secs(5);
    const STREAM: Duration = Duration::from_secs(60);

    /// A request whose handler has returned a stream.
    fn stream(clock: &Arc<Clock>) -> RequestGuard {
        let mut request = clock.request();
        request.writing(true);
        request
    }

    /// A one-shot answer's body: `size` bytes in one frame.
    fn whole(size: usize) -> Body {
        Full::new(Bytes::from(vec![b'x'; size])).boxed_unsync()
    }

    /// A stream's body (no known size), its events sent by the test.
    struct Events(mpsc::UnboundedReceiver<Bytes>);

    impl hyper::body::Body for Events {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|event| event.map(|event| Ok(Frame::data(event))))
        }
    }

    /// Taps the clock as hyper's acks of a client's PINGs do, every `every`.
    fn pings(clock: &Arc<Clock>, every: Duration) -> tokio::task::JoinHandle<()> {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                clock.wrote();
            }
        })
    }

    // A bound that does not hold fails its test rather than keeping it waiting for ever (paused
    // time runs on while a pinger keeps the clock busy).
    use tokio::time::timeout as within;

    async fn next_len(answer: &mut Answer) -> usize {
        answer.frame().await.unwrap().unwrap().into_data().unwrap().len()
    }

    /// Which clock runs out, and when, watched from a task of its own.
    fn watch(clock: &Arc<Clock>) -> tokio::task::JoinHandle<(Expired, Instant)> {
        let clock = clock.clone();
        tokio::spawn(async move { (clock.expired().await, Instant::now()) })
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_outlives_the_header_deadline_until_the_idle_timeout() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let start = Instant::now();
        assert_eq!(clock.expired().await, Expired::Idle);
        assert_eq!(start.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_leaves_an_idle_connection_a_quiet_second_from_its_last_progress() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A request in progress when the drain starts is never cut by it...
        let request = clock.request();
        clock.drain();
        let watchdog = watch(&clock);
        tokio::time::sleep(IDLE * 3).await;
        assert!(!watchdog.is_finished());
        // ...and once it has ended, the connection has its quiet second, not the idle timeout.
        let ended = Instant::now();
        drop(request);
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - ended), (Expired::Idle, DRAIN_QUIET));
        // A connection idle for long when the drain starts has its second from the drain.
        let long_idle = Clock::new(HEADER, IDLE, STREAM);
        tokio::time::sleep(IDLE / 2).await;
        let drained = Instant::now();
        long_idle.drain();
        assert_eq!(long_idle.expired().await, Expired::Idle);
        assert_eq!(drained.elapsed(), DRAIN_QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_lets_an_http2_answer_still_being_sent_leave_the_socket() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(H2_PREFACE);
        let request = clock.request();
        clock.drain();
        drop(request); // hyper took the answer's last piece: h2 may still be sending it
        let watchdog = watch(&clock);
        for _ in 0..6 {
            tokio::time::sleep(DRAIN_QUIET / 2).await;
            clock.wrote(); // the socket takes more of it
        }
        assert!(!watchdog.is_finished(), "cut while its bytes were leaving");
        let last = Instant::now();
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - last), (Expired::Idle, DRAIN_QUIET));
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_must_finish_within_the_header_deadline() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let watchdog = watch(&clock);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let head = Instant::now();
        clock.read(b"POST /infer HTTP/1.1\r\n");
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - head), (Expired::Header, HEADER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_leaves_a_head_still_arriving_a_quiet_second_not_the_header_deadline() {
        let long_header = Duration::from_secs(60);
        let clock = Clock::new(long_header, IDLE, STREAM);
        clock.read(b"P"); // a byte, then nothing (HTTP/2's preface or a request, who knows)
        tokio::time::sleep(Duration::from_secs(2)).await;
        let drained = Instant::now();
        clock.drain();
        assert_eq!(clock.expired().await, Expired::Header);
        assert_eq!(drained.elapsed(), DRAIN_QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn the_protocol_is_told_by_the_whole_http2_preface_however_it_is_cut() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        // hyper tells HTTP/2 only from all 24 bytes: the first 18 tell nothing yet.
        clock.read(&H2_PREFACE[..18]);
        assert!(within(Duration::from_secs(1), clock.told()).await.is_err(), "told too soon");
        clock.read(&H2_PREFACE[18..]);
        assert!(within(Duration::from_secs(1), clock.told()).await.is_ok());
        let http1 = Clock::new(HEADER, IDLE, STREAM);
        http1.read(b"P");
        assert!(within(Duration::from_secs(1), http1.told()).await.is_err(), "told too soon");
        http1.read(b"OST /infer");
        assert!(within(Duration::from_secs(1), http1.told()).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn no_clock_runs_while_a_request_is_in_progress() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"GET / HTTP/1.1\r\n\r\n");
        let request = clock.request();
        let watchdog = watch(&clock);
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
        clock.read(H2_PREFACE);
        let start = Instant::now();
        assert_eq!(clock.expired().await, Expired::Idle);
        assert_eq!(start.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_being_written_is_cut_by_neither_clock() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"POST /infer HTTP/1.1\r\n\r\n");
        let stream = stream(&clock);
        let watchdog = watch(&clock);
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
        let _stream = stream(&clock);
        tokio::time::sleep(Duration::from_secs(10)).await;
        clock.wrote();
        let last = Instant::now();
        assert_eq!(clock.expired().await, Expired::Stalled);
        assert_eq!(last.elapsed(), STREAM + IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_request_beside_a_stream_holds_the_connection_open() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let _stream = stream(&clock);
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
        let stream = stream(&clock);
        clock.read(b"GET /healthz HTTP/1.1\r\n"); // a slow head, pipelined
        tokio::time::sleep(IDLE * 2).await;
        drop(stream);
        let ended = Instant::now();
        assert_eq!(clock.expired().await, Expired::Header);
        assert_eq!(ended.elapsed(), HEADER);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_pipelined_behind_a_large_answer_waits_for_hyper_to_take_all_of_it() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"POST /infer HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}");
        let mut answer = Answer::new(whole(8 << 20), clock.request());
        let watchdog = watch(&clock);
        assert_eq!(next_len(&mut answer).await, 8 << 20, "HTTP/1.1 writes a frame whole");
        // Not ended, though nothing is left: hyper then keeps the body, and its guard, until all
        // but its write buffer's bound has been written.
        assert!(!answer.is_end_stream());
        clock.read(b"GET /healthz HTTP/1.1\r\n\r\n");
        for _ in 0..10 {
            tokio::time::sleep(HEADER * 5).await; // longer than the header deadline
            clock.wrote(); // the answer goes out to a client reading it slowly
        }
        assert!(!watchdog.is_finished(), "an answer being written was cut");
        drop(answer);
        let ended = Instant::now();
        let (why, at) = watchdog.await.unwrap();
        assert_eq!((why, at - ended), (Expired::Header, HEADER), "the head's clock starts now");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_whose_client_stopped_reading_is_cut_at_the_idle_timeout() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let mut answer = Answer::new(whole(1 << 20), clock.request());
        next_len(&mut answer).await;
        tokio::time::sleep(IDLE / 2).await;
        clock.wrote();
        let last = Instant::now();
        assert_eq!(clock.expired().await, Expired::Stalled);
        assert_eq!(last.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_answer_ends_at_once() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        let answer = Answer::new(Empty::new().boxed_unsync(), clock.request());
        assert!(answer.is_end_stream(), "hyper drops a body that says so without polling it");
        drop(answer);
        let ended = Instant::now();
        assert_eq!(clock.expired().await, Expired::Idle);
        assert_eq!(ended.elapsed(), IDLE);
    }

    /// After a request, an HTTP/2 connection its client only pings is cut at the idle timeout.
    async fn pings_do_not_hold(clock: &Arc<Clock>) {
        drop(clock.request());
        let ended = Instant::now();
        let pinger = pings(clock, IDLE / 4);
        assert_eq!(within(STREAM, clock.expired()).await, Ok(Expired::Idle), "held by pings");
        assert_eq!(ended.elapsed(), IDLE);
        pinger.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_preface_sent_in_pieces_is_told_apart_too() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        for piece in H2_PREFACE.chunks(1) {
            clock.read(piece);
        }
        pings_do_not_hold(&clock).await;
        // A head that only begins like the preface is HTTP/1.1's.
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(b"PRI");
        clock.read(b"NT / HTTP/1.1\r\n");
        assert_eq!(clock.expired().await, Expired::Header);
    }

    #[tokio::test(start_paused = true)]
    async fn http2_writes_of_hypers_own_do_not_hold_an_idle_connection() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(H2_PREFACE);
        pings_do_not_hold(&clock).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_answer_goes_in_pieces_each_one_progress() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(H2_PREFACE);
        let mut answer = Answer::new(whole(2 * PIECE + 1), clock.request());
        assert_eq!(answer.size_hint().exact(), Some(2 * PIECE as u64 + 1));
        assert_eq!(next_len(&mut answer).await, PIECE);
        assert_eq!(answer.size_hint().exact(), Some(PIECE as u64 + 1));
        let pinger = pings(&clock, IDLE / 4);
        tokio::time::sleep(IDLE - HEADER).await;
        assert_eq!(next_len(&mut answer).await, PIECE); // the client read the first
        tokio::time::sleep(IDLE - HEADER).await;
        assert_eq!(next_len(&mut answer).await, 1);
        assert!(answer.is_end_stream());
        let last = Instant::now();
        // The last piece waits for a window the client never opens; its pings do not count.
        assert_eq!(within(STREAM, clock.expired()).await, Ok(Expired::Stalled), "held by pings");
        assert_eq!(last.elapsed(), IDLE);
        pinger.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_stream_whose_client_stopped_reading_is_cut_however_it_pings() {
        let clock = Clock::new(HEADER, IDLE, STREAM);
        clock.read(H2_PREFACE);
        let (events, rx) = mpsc::unbounded_channel();
        let mut answer = Answer::new(Events(rx).boxed_unsync(), clock.request());
        events.send(Bytes::from_static(b"data: 1\n\n")).unwrap();
        assert_eq!(next_len(&mut answer).await, 9);
        let last = Instant::now();
        let pinger = pings(&clock, IDLE / 4);
        let expired = within(STREAM * 2, clock.expired()).await;
        assert_eq!(expired, Ok(Expired::Stalled), "held by pings");
        assert_eq!(last.elapsed(), STREAM + IDLE);
        pinger.abort();
    }
}
