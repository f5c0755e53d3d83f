//! A request's body, read whole before any job is made: what every envelope (native or a
//! protocol's) gets before it parses the body its own way ([`Received`]), with the request's
//! deadline and traffic read from its headers. The body is refused early where it can be (415
//! for a compressed one, 413 from its declared length) and read by its own clock, up to
//! `--max-body-bytes`, into one buffer: in shared memory when it is large and a slot is free.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, EXPECT, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, Request};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::error::ApiError;
use super::format::{self, Format};
use super::{deadline, traffic, App, Route};
use crate::metrics::metrics;
use crate::shared_memory::{SharedMemory, Slot, SHARED_FROM};
use crate::traffic::Traffic;

/// The format a request's `Content-Type` names, for the protocols' envelopes (which take JSON or
/// msgpack only); a client that names none almost always means JSON.
pub fn request_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    match headers.get(CONTENT_TYPE) {
        None => Ok(Format::Json),
        Some(value) => {
            let media_type = value.to_str().unwrap_or("");
            Format::of_body(media_type).ok_or_else(|| ApiError::unsupported_media_type(media_type))
        }
    }
}

/// A request's body, read whole, and the job clock it started: what every envelope (native or
/// a protocol's) gets before it parses the body its own way.
pub struct Received {
    pub body: Bytes,
    pub arrived: Instant,
    /// The route's timeout, shortened by `x-corral-timeout-ms` if the client sent one.
    pub deadline: Instant,
    /// The jobs' class, tenant and weight, from the headers and the route.
    pub traffic: Traffic,
}

/// Reads the body within the request's deadline and `--body-read-timeout-ms`, stopping at
/// `--max-body-bytes` (413).
pub async fn receive(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Received, ApiError> {
    Ok(receive_with(app, route, request, 0, None).await?.0)
}

/// [`receive`], with a [`Gap`] left in the body's buffer and filled once the body is in, and
/// the room it left (`gap.len`, or 0 where none was left: a chunked body kept on the heap).
pub async fn receive_with_gap(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
    gap: Gap,
) -> Result<(Received, usize), ApiError> {
    receive_with(app, route, request, 0, Some(gap)).await
}

/// Room left inside a body's buffer: `len` bytes after its first `at` bytes (if it has that
/// many), filled from the end with what `fill` makes of those first bytes, if it fits. A v2
/// request keeps room between its JSON header and its binary data for the msgpack head of a
/// one-row payload, which then lies in one piece right before the row's data
/// (`v2::request::single_row_head`).
#[derive(Clone, Copy)]
pub struct Gap {
    pub at: usize,
    pub len: usize,
    pub fill: fn(&[u8]) -> Option<Vec<u8>>,
}

/// [`receive`], with `front` bytes kept free at the start of the body's buffer, for a header,
/// and a [`Gap`] inside it; with the room the gap left.
pub async fn receive_with(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
    front: usize,
    gap: Option<Gap>,
) -> Result<(Received, usize), ApiError> {
    let arrived = Instant::now();
    let headers = request.headers();
    check_encoding(headers).map_err(before_body)?;
    let timeout = deadline::requested(headers)
        .map_err(before_body)?
        .map_or(route.timeout, |t| t.min(route.timeout));
    let mut traffic =
        traffic::requested(headers, route.priority, &app.tenant_header).map_err(before_body)?;
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > app.max_body_bytes as u64)
        && headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
    {
        // The client waits for a 100 before it sends the body, and reading the body would ask
        // for it (hyper sends the 100 at the first read): answer now, and read nothing.
        return Err(before_body(ApiError::body_too_large(app.max_body_bytes)));
    }
    let deadline = arrived + timeout;
    traffic.allowance = Some(route.timeout);
    traffic.budget = Some(timeout);
    // No connection clock runs while a handler does (a slow body is not a slow head), so the
    // body gets its own, ending at the job's deadline at the latest.
    let read_by = deadline.min(arrived + app.body_read_timeout);
    // Every large body goes to shared memory if it fits, whatever its kind: raw and msgpack
    // bodies are then read by workers from there, a v2 request's rows are written to the socket
    // from there, and large bodies take one pool of memory rather than two that each keep
    // their peak.
    let shared = app.shared_memory.as_ref();
    let limits =
        Limits { bytes: app.max_body_bytes, declared, read_by, grace_over: &app.grace_over };
    let (body, room) =
        read_body(request.into_body(), limits, front, gap, shared).await.map_err(|e| {
            e.unwrap_or_else(|| {
                if read_by == deadline {
                    ApiError::body_past_deadline(read_by - arrived)
                } else {
                    ApiError::body_timeout(read_by - arrived)
                }
            })
        })?;
    Ok((Received { body, arrived, deadline, traffic }, room))
}

/// What bounds a body's reading: its size (`--max-body-bytes`, and the length it declared),
/// its time, and the end of the grace period.
struct Limits<'a> {
    bytes: usize,
    declared: Option<u64>,
    read_by: Instant,
    grace_over: &'a tokio_util::sync::CancellationToken,
}

/// An error answered before the request's body was read: the connection is closed after it
/// (`Connection: close`), since the unread body may still be on its way. Without the header,
/// hyper closes such a connection anyway, and a client that reused it at once saw it drop
/// without an answer.
pub fn before_body(error: ApiError) -> ApiError {
    ApiError { close: true, ..error }
}

/// A compressed body (`Content-Encoding` other than `identity`, or a `Transfer-Encoding` coding
/// other than `chunked`, which hyper does not undo) is refused (415, RFC 9110 15.5.16), not
/// passed on as if it were its content: the worker would read gzip bytes as the input, and a v2
/// client's compressed binary body would fail its lengths with a puzzling 400.
pub(super) fn check_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    let refused = |coding: &str, header: &str, how: &str| {
        let message = format!("{header} {coding:?} is not supported: send the body {how}");
        Err(ApiError { message, ..ApiError::unsupported_media_type("") })
    };
    if let Some(coding) = coding_other_than(headers, TRANSFER_ENCODING, "chunked") {
        return refused(
            &coding,
            "Transfer-Encoding",
            "uncompressed (chunked, or with a Content-Length)",
        );
    }
    if let Some(coding) = coding_other_than(headers, CONTENT_ENCODING, "identity") {
        let error = refused(&coding, "Content-Encoding", "uncompressed");
        return error.map_err(|error| ApiError { accept_encoding: Some("identity"), ..error });
    }
    Ok(())
}

/// The first coding a header lists (any of its values, comma-separated) other than `allowed`.
fn coding_other_than(headers: &HeaderMap, name: HeaderName, allowed: &str) -> Option<String> {
    headers.get_all(name).iter().find_map(|value| {
        let text = String::from_utf8_lossy(value.as_bytes());
        text.split(',')
            .map(str::trim)
            .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(allowed))
            .map(String::from)
    })
}

/// A small body read whole, for an endpoint that takes no job (v2's repository index), by the
/// same reading as a job's body: not compressed (415), at most `max` bytes (413, from its
/// declared length before a byte is read), within `--body-read-timeout-ms` (408), 503 past the
/// grace period; a body that breaks off is 400.
pub async fn read_small(
    app: &App,
    request: Request<Incoming>,
    max: usize,
) -> Result<Bytes, ApiError> {
    check_encoding(request.headers()).map_err(before_body)?;
    let declared = declared_length(request.headers());
    let read_by = Instant::now() + app.body_read_timeout;
    let limits = Limits { bytes: max, declared, read_by, grace_over: &app.grace_over };
    let read = read_body(request.into_body(), limits, 0, None, None).await;
    let timeout = || ApiError::body_timeout(app.body_read_timeout);
    let (body, _) = read.map_err(|e| e.unwrap_or_else(timeout))?;
    Ok(body)
}

/// The body's length as its `Content-Length` declares it, if it does.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// After a 413 the rest of the body is read and thrown away, up to this much, so that a client
/// still sending gets to read the answer instead of a connection reset. Beyond it, the connection
/// is simply closed.
const DRAIN_BYTES: usize = 4 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads the body by `read_by` (`Err(None)` after it), stopping (413) as soon as it passes the
/// limit rather than buffering it all. With `front` > 0 the buffer starts with that many bytes
/// for a `bin32` header, written once the body's length is known: the body becomes one msgpack
/// value where it lies.
///
/// Each byte is copied once, from hyper's frames into the buffer, and the buffer has no slack (a
/// queued job keeps its whole allocation alive): with a declared length the buffer is allocated
/// at that size and filled as frames come — in `shared` memory when given, the length is at
/// least [`SHARED_FROM`] and a slot is free; without one (chunked) the frames are kept and
/// copied at the end into a buffer of the size they add up to ([`assemble`]), where
/// growing a buffer by doubling would copy the body again at each step (frames under 1 MiB,
/// all of HTTP/1.1's and HTTP/2's, are copied together as they come, once more: [`Frames`]).
/// Returns the body and
/// the room its gap left (0 without one).
async fn read_body(
    mut body: Incoming,
    limits: Limits<'_>,
    front: usize,
    gap: Option<Gap>,
    shared: Option<&Arc<SharedMemory>>,
) -> Result<(Bytes, usize), Option<ApiError>> {
    let Limits { bytes: limit, declared, read_by, grace_over } = limits;
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(refuse_too_large(body, limit).await);
    }
    let (mut sized, sized_gap) = match declared {
        Some(length) => {
            let (buf, gap) = Buffer::for_body(front, length as usize, gap, shared);
            (Some(buf), gap)
        }
        None => (None, None),
    };
    let mut frames = Frames::default();
    let mut received = 0;
    loop {
        let frame = tokio::select! {
            // The grace period first: a body that keeps coming never lets the read be pending.
            biased;
            // A body still arriving when the grace period runs out is answered as what else is
            // left: 503 (it had been dropped unanswered as the server stopped).
            () = grace_over.cancelled() => {
                let code = crate::stage::Shed::ShuttingDown.code();
                metrics().shed.with_label_values(&[code, ""]).inc();
                return Err(Some(before_body(ApiError::shutting_down())));
            }
            frame = tokio::time::timeout_at(read_by, body.frame()) => frame.map_err(|_| None)?,
        };
        let Some(frame) = frame else { break };
        let frame = frame
            .map_err(|e| Some(ApiError::bad_request(format!("could not read the body: {e}"))))?;
        if let Ok(data) = frame.into_data() {
            received += data.len();
            if received > limit {
                return Err(refuse_too_large(body, limit).await);
            }
            match &mut sized {
                Some(buf) => buf.put(&data, received - data.len(), sized_gap),
                None => frames.keep(data),
            }
        }
    }
    let (mut buf, gap) = match sized {
        Some(buf) => (buf, sized_gap),
        None => assemble(&frames.done(), received, front, gap, shared),
    };
    let room = gap.map_or(0, |gap| gap.len);
    if let Some(gap) = gap.filter(|gap| received == gap.at) {
        // The body ended where the room begins: no frame had a byte after it.
        buf.extend_zeros(gap.len);
    }
    if let Some(gap) = gap.filter(|gap| received >= gap.at) {
        let filled = buf.filled_mut();
        let (first, room) = filled[front..].split_at_mut(gap.at);
        if let Some(fill) = (gap.fill)(first).filter(|fill| fill.len() <= gap.len) {
            room[gap.len - fill.len()..gap.len].copy_from_slice(&fill);
        }
    }
    if front > 0 {
        format::write_bin32_header(buf.filled_mut());
    }
    Ok((buf.freeze(), room))
}

/// The frames of a body of unknown length, kept until it has all come, copied together as they
/// come into blocks of at least [`Frames::GATHERED`] (one `Bytes`, with its allocation, per
/// frame: a 16 MiB body sent in one-byte chunks held 1 GB while it came). Only a frame of at
/// least [`Frames::LARGE`] is kept as it came, not copied: an HTTP/1.1 frame is a slice of
/// hyper's read buffer and keeps all of it alive, and a 4 KiB frame between chunk-size lines
/// padded with zeros (`000…01`, valid hex) held a whole buffer each: 15 times the body at the
/// defaults, 200 times with `--max-header-bytes` at 1 MiB. The read buffer is at most
/// `--max-header-bytes` (1 MiB at most) rounded up, so a frame that large pins at most about
/// twice itself.
#[derive(Default)]
struct Frames {
    kept: Vec<Bytes>,
    small: BytesMut,
}

impl Frames {
    /// Frames at least this large are kept as they came.
    const LARGE: usize = 1024 * 1024;
    /// Frames gathered up to this make one kept block.
    const GATHERED: usize = 64 * 1024;

    fn keep(&mut self, data: Bytes) {
        if data.len() >= Self::LARGE {
            self.flush();
            self.kept.push(data);
            return;
        }
        if self.small.capacity() - self.small.len() < data.len() {
            self.flush();
            // Room for a whole gathering at once (grown by doubling, it could end at twice
            // that), or for a frame larger than one.
            self.small.reserve(Self::GATHERED.max(data.len()));
        }
        self.small.extend_from_slice(&data);
        if self.small.len() >= Self::GATHERED {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.small.is_empty() {
            return;
        }
        if self.small.len() * 2 >= self.small.capacity() {
            self.kept.push(std::mem::take(&mut self.small).freeze());
        } else {
            // Kept frozen, a buffer keeps its whole allocation: a 1-byte frame between 4 KiB
            // ones would hold 68 KiB each. Copied out instead, and the buffer used again.
            self.kept.push(Bytes::copy_from_slice(&self.small));
            self.small.clear();
        }
    }

    /// The frames, in order.
    fn done(mut self) -> Vec<Bytes> {
        self.flush();
        self.kept
    }
}

/// A chunked body's frames, `received` bytes in all, copied into one buffer now that its size
/// is known, as a declared length's is ([`Buffer::for_body`]). Returns the buffer and the gap
/// it kept.
fn assemble(
    frames: &[Bytes],
    received: usize,
    front: usize,
    gap: Option<Gap>,
    shared: Option<&Arc<SharedMemory>>,
) -> (Buffer, Option<Gap>) {
    let (mut buf, gap) = Buffer::for_body(front, received, gap, shared);
    let mut before = 0;
    for frame in frames {
        buf.put(frame, before, gap);
        before += frame.len();
    }
    (buf, gap)
}

/// A body's buffer: on the heap, or a slot of shared memory.
enum Buffer {
    Heap(BytesMut),
    Shared(Slot),
}

impl Buffer {
    /// The buffer for a body of `length` bytes after `front`: in `shared` memory with `gap`'s
    /// room if that takes it there (at least [`SHARED_FROM`] bytes with the room, and a slot
    /// free), else on the heap without the room, where it buys nothing (and finding the row's
    /// head would parse a v2 header twice). Returns the buffer and the gap it keeps.
    fn for_body(
        front: usize,
        length: usize,
        gap: Option<Gap>,
        shared: Option<&Arc<SharedMemory>>,
    ) -> (Self, Option<Gap>) {
        let room = gap.map_or(0, |gap| gap.len);
        match Self::shared(front, length + room, shared) {
            Some(buf) => (buf, gap),
            None => (Self::new(front, length, None), None),
        }
    }

    /// A buffer for `front` zero bytes then `length` bytes of body: in `shared` memory if
    /// [`Buffer::shared`] finds it a slot, else on the heap.
    fn new(front: usize, length: usize, shared: Option<&Arc<SharedMemory>>) -> Self {
        Self::shared(front, length, shared).unwrap_or_else(|| {
            let mut buf = Buffer::Heap(BytesMut::with_capacity(front + length));
            buf.extend_zeros(front);
            buf
        })
    }

    /// [`Buffer::new`] in a slot of `shared` memory, if `length` is at least [`SHARED_FROM`]
    /// (below it, the socket costs less than a slot) and a slot is free.
    fn shared(front: usize, length: usize, shared: Option<&Arc<SharedMemory>>) -> Option<Self> {
        let slot = shared.filter(|_| length >= SHARED_FROM)?.slot(front + length)?;
        let mut buf = Buffer::Shared(slot);
        buf.extend_zeros(front);
        Some(buf)
    }

    /// Appends `n` zero bytes (room to fill in later), without allocating them first.
    fn extend_zeros(&mut self, mut n: usize) {
        const ZEROS: [u8; 256] = [0; 256];
        while n > 0 {
            let step = n.min(ZEROS.len());
            self.extend_from_slice(&ZEROS[..step]);
            n -= step;
        }
    }

    /// Appends `data`, the body's bytes from `before` on, leaving `gap`'s room (zeros) before
    /// the body's byte at `at`, if `data` holds it.
    fn put(&mut self, data: &[u8], before: usize, gap: Option<Gap>) {
        match gap {
            Some(gap) if before <= gap.at && gap.at < before + data.len() => {
                let (head, tail) = data.split_at(gap.at - before);
                self.extend_from_slice(head);
                self.extend_zeros(gap.len);
                self.extend_from_slice(tail);
            }
            _ => self.extend_from_slice(data),
        }
    }

    fn extend_from_slice(&mut self, data: &[u8]) {
        match self {
            Buffer::Heap(buf) => buf.extend_from_slice(data),
            Buffer::Shared(slot) => {
                if !slot.extend_from_slice(data) {
                    // More than declared (hyper checks a Content-Length, so not expected): the
                    // body moves to the heap rather than being cut.
                    let mut heap = BytesMut::with_capacity(slot.len() + data.len());
                    heap.extend_from_slice(slot.filled_mut());
                    heap.extend_from_slice(data);
                    *self = Buffer::Heap(heap);
                }
            }
        }
    }

    fn filled_mut(&mut self) -> &mut [u8] {
        match self {
            Buffer::Heap(buf) => &mut buf[..],
            Buffer::Shared(slot) => slot.filled_mut(),
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Buffer::Heap(buf) => buf.freeze(),
            Buffer::Shared(slot) => slot.freeze(),
        }
    }
}

/// Returns whether the body was read to its end: if not, the connection closes after the
/// answer, which then says so (`Connection: close`; a client that reused the connection had
/// seen it drop without an answer).
async fn drain(mut body: Incoming) -> bool {
    let discard = async {
        let mut seen = 0;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_BYTES {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_TIME, discard).await.unwrap_or(false)
}

/// The 413 for a body past `limit`, once what could be drained of it was: said to close the
/// connection where the body was not read to its end.
async fn refuse_too_large(body: Incoming, limit: usize) -> Option<ApiError> {
    let error = ApiError::body_too_large(limit);
    Some(if drain(body).await { error } else { before_body(error) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_gathered_and_only_large_ones_kept_as_they_came() {
        let mut frames = Frames::default();
        let large = Bytes::from(vec![7u8; Frames::LARGE]);
        (0..100_000u32).for_each(|i| frames.keep(Bytes::from(vec![i as u8])));
        frames.keep(large.clone());
        frames.keep(Bytes::from_static(b"end"));
        let kept = frames.done();
        // 100,000 one-byte frames in two gathered ones, then the large one (not copied).
        assert_eq!(kept.len(), 4);
        assert_eq!(kept[2].as_ptr(), large.as_ptr());
        let body: Vec<u8> = kept.iter().flat_map(|frame| frame.iter().copied()).collect();
        assert_eq!(body.len(), 100_000 + Frames::LARGE + 3);
        assert!(body[..100_000].iter().enumerate().all(|(i, &b)| b == i as u8));
        assert!(body.ends_with(b"end"));
        // One small frame between large ones is kept at its size, not in a gathering's room.
        let mut frames = Frames::default();
        for _ in 0..20 {
            frames.keep(Bytes::from_static(b"x"));
            frames.keep(large.clone());
        }
        let kept = frames.done();
        let small: usize = kept.iter().filter(|f| f.len() == 1).count();
        assert_eq!(small, 20);
    }

    #[test]
    fn a_frame_cut_from_a_larger_buffer_is_copied_not_kept_with_it() {
        // As hyper hands out an HTTP/1.1 chunk: a slice of its read buffer.
        let buffer = Bytes::from(vec![1u8; 256 * 1024]);
        let mut frames = Frames::default();
        for at in 0..8 {
            frames.keep(buffer.slice(at * 4096..(at + 1) * 4096));
        }
        let kept = frames.done();
        assert_eq!(kept.iter().map(Bytes::len).sum::<usize>(), 8 * 4096);
        let inside = |frame: &Bytes| {
            let start = buffer.as_ptr() as usize;
            (start..start + buffer.len()).contains(&(frame.as_ptr() as usize))
        };
        assert!(!kept.iter().any(inside), "no kept frame is the read buffer's");
    }

    fn fill(first: &[u8]) -> Option<Vec<u8>> {
        Some(first.iter().rev().copied().collect())
    }

    /// The body's bytes in frames cut at `cuts`, put into a buffer with a gap, as `read_body`
    /// does.
    fn put_in_frames(body: &[u8], cuts: &[usize], gap: Gap) -> Vec<u8> {
        let mut buf = Buffer::new(0, body.len() + gap.len, None);
        let mut before = 0;
        for window in [0].iter().chain(cuts).chain(&[body.len()]).collect::<Vec<_>>().windows(2) {
            let frame = &body[*window[0]..*window[1]];
            buf.put(frame, before, Some(gap));
            before += frame.len();
        }
        buf.filled_mut().to_vec()
    }

    #[test]
    fn the_gap_goes_in_once_wherever_the_frames_are_cut() {
        let body = b"headerDATA";
        let gap = Gap { at: 6, len: 3, fill };
        for cut in 0..=body.len() {
            assert_eq!(put_in_frames(body, &[cut], gap), b"header\0\0\0DATA", "cut at {cut}");
        }
        assert_eq!(put_in_frames(body, &[5, 6, 7], gap), b"header\0\0\0DATA");
        let beyond = Gap { at: 20, len: 3, fill };
        assert_eq!(put_in_frames(body, &[6], beyond), b"headerDATA", "a body shorter than at");
    }

    #[test]
    fn a_body_goes_to_shared_memory_from_shared_from_bytes_on() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        let below = Buffer::new(0, SHARED_FROM - 1, Some(&memory));
        assert!(matches!(below, Buffer::Heap(_)), "the socket costs less");
        // The front (a raw body's bin32 header) counts toward the slot, not the threshold.
        assert!(matches!(Buffer::new(5, SHARED_FROM - 5, Some(&memory)), Buffer::Heap(_)));
        assert!(matches!(Buffer::new(0, SHARED_FROM, Some(&memory)), Buffer::Shared(_)));
        assert!(matches!(Buffer::new(0, SHARED_FROM, None), Buffer::Heap(_)), "none to take");
    }

    /// `body` cut into frames of `size` bytes, as hyper might hand a chunked body over.
    fn frames(body: &[u8], size: usize) -> Vec<Bytes> {
        body.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    #[test]
    fn a_chunked_body_goes_to_shared_memory_once_its_length_is_known() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        let body: Vec<u8> = (0..SHARED_FROM).map(|i| i as u8).collect();
        let (buf, gap) = assemble(&frames(&body, 1000), body.len(), 5, None, Some(&memory));
        assert!(matches!(buf, Buffer::Shared(_)) && gap.is_none());
        let bytes = buf.freeze();
        assert!(memory.locate(&bytes).is_some());
        assert_eq!(&bytes[..5], &[0; 5], "the front is kept");
        assert_eq!(&bytes[5..], &body[..]);

        let small = &body[..SHARED_FROM - 1];
        let (buf, _) = assemble(&frames(small, 1000), small.len(), 0, None, Some(&memory));
        assert!(matches!(buf, Buffer::Heap(_)), "the socket costs less");
        assert_eq!(&buf.freeze()[..], small);
    }

    #[test]
    fn a_chunked_body_keeps_its_gap_in_shared_memory_only() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        // With its room the body reaches the threshold, as a declared one's does.
        let body = vec![7; SHARED_FROM - 3];
        let gap = Gap { at: 6, len: 3, fill };
        let (mut buf, kept) =
            assemble(&frames(&body, 4096), body.len(), 0, Some(gap), Some(&memory));
        assert!(matches!(buf, Buffer::Shared(_)));
        assert_eq!(kept.map(|gap| gap.len), Some(3));
        assert_eq!(&buf.filled_mut()[..12], &[7, 7, 7, 7, 7, 7, 0, 0, 0, 7, 7, 7]);
        drop(buf);

        let small = vec![7; SHARED_FROM - 4];
        let (mut buf, kept) =
            assemble(&frames(&small, 4096), small.len(), 0, Some(gap), Some(&memory));
        assert!(matches!(buf, Buffer::Heap(_)) && kept.is_none(), "no room on the heap");
        assert_eq!(buf.filled_mut(), &small[..]);

        let taken = memory.slot(1 << 20).expect("the memory is free");
        let (mut buf, kept) =
            assemble(&frames(&body, 4096), body.len(), 0, Some(gap), Some(&memory));
        assert!(matches!(buf, Buffer::Heap(_)) && kept.is_none(), "no slot free: the heap");
        assert_eq!(buf.filled_mut(), &body[..]);
        drop(taken);
    }

    #[test]
    fn a_body_in_shared_memory_moves_to_the_heap_rather_than_past_its_slot() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        let mut buf = Buffer::new(0, SHARED_FROM, Some(&memory));
        assert!(matches!(buf, Buffer::Shared(_)));
        buf.extend_from_slice(&vec![1; SHARED_FROM]);
        buf.extend_from_slice(b"more than declared");
        assert!(matches!(buf, Buffer::Heap(_)));
        let body = buf.freeze();
        assert_eq!(body.len(), SHARED_FROM + 18);
        assert_eq!(memory.locate(&body), None);
        assert!(memory.slot(1 << 20).is_some(), "the slot was given back");
    }
}
