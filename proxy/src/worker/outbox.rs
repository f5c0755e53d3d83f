//! The writing half of a worker connection: frames go out in order on a task of their own, so
//! the connection task never waits on a write.
//!
//! Why a task of its own: a batch frame larger than the socket buffer (~208 KiB) is written only
//! as fast as the worker reads it. A worker busy writing its own large `results` frame reads
//! nothing until that write is done, and that write is done only if someone reads it. With one
//! task doing both in turn, each side waited on the other for good (issue #15: a stage jammed at
//! default settings by embedding-sized outputs). Here the connection task keeps reading — and
//! keeps its hung timer and the shutdown signal in sight — while this task writes.
//!
//! A write has no deadline of its own: it counts toward the batch's. The connection task's hung
//! timer for a batch starts when the batch is queued here, so a worker that stops reading
//! mid-frame is declared hung like one that stops answering, and the writer is aborted with the
//! connection.
//!
//! A batch goes out as a [`BatchFrame`]: its headers, keys and ids in one small buffer, between
//! them the jobs' payloads themselves, written with vectored writes (`writev`). No payload byte is
//! copied here; the kernel reads them from the buffer the request body was read into (see
//! docs/ARCHITECTURE.md, "How a body reaches the socket"). The other frames are small and go
//! through the codec.
//!
//! The one frame with a descriptor — `shm`, the shared memory a worker maps — has it passed with
//! the frame's first bytes (`sendmsg`, `SCM_RIGHTS`), where the worker's `recvmsg` finds it.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use corral_protocol::{BatchFrame, ProxyCodec, ProxyMessage};
use tokio::io::{AsyncWrite, Interest};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio_util::codec::Encoder;

/// Frames queued for one worker, and the task writing them.
pub struct Outbox {
    queue: Option<mpsc::UnboundedSender<Outgoing>>,
    /// How far the writer got: frames it began and frames it wrote whole.
    progress: Arc<Progress>,
    queued: u64,
    writer: JoinHandle<io::Result<()>>,
    /// The writer's end was seen (by [`Outbox::broken`]); its handle must not be awaited again.
    ended: bool,
}

impl Outbox {
    /// Starts the writer over the socket's write half.
    pub fn new(half: OwnedWriteHalf) -> Self {
        let (queue, frames) = mpsc::unbounded_channel();
        let progress = Arc::new(Progress::default());
        let writer = tokio::spawn(write(half, frames, progress.clone()));
        Self { queue: Some(queue), progress, queued: 0, writer, ended: false }
    }

    /// Queues a frame; returns its index (see [`Outbox::delivery`]). Never waits. The queue is
    /// unbounded in type only: the connection task queues at most two batches and one closing
    /// frame before it hears back (a joining worker's next batch only once the one before is
    /// written, [`Outbox::all_written`]), and cancels for jobs it holds.
    pub fn send(&mut self, message: ProxyMessage) -> u64 {
        self.send_with(message, None)
    }

    /// As [`Outbox::send`], passing `descriptor` along with the frame's first bytes (or not at
    /// all, if the frame never goes out).
    pub fn send_with(&mut self, message: ProxyMessage, descriptor: Option<OwnedFd>) -> u64 {
        let index = self.queued;
        self.queued += 1;
        if let Some(queue) = &self.queue {
            // A closed queue means the writer has stopped; `broken` reports why.
            let _ = queue.send(Outgoing { message, descriptor });
        }
        index
    }

    /// How far the frame at `index` got; final once the writer has stopped ([`Outbox::halt`]).
    pub fn delivery(&self, index: u64) -> Delivery {
        if index < self.progress.written.load(Ordering::Acquire) {
            Delivery::Whole
        } else if index < self.progress.begun.load(Ordering::Acquire) {
            Delivery::Partial
        } else {
            Delivery::None
        }
    }

    /// Whether every frame queued so far has been written whole: the worker has read them, all
    /// but what the socket buffers.
    pub fn all_written(&self) -> bool {
        self.progress.written.load(Ordering::Acquire) >= self.queued
    }

    /// Completes once a frame has been written whole since it last completed (at once if one was
    /// meanwhile): when [`Outbox::all_written`] is worth asking again. Cancel-safe. Not tied to the
    /// outbox: awaited beside [`Outbox::broken`].
    pub fn wrote(&self) -> impl std::future::Future<Output = ()> + use<> {
        let progress = self.progress.clone();
        async move { progress.wrote.notified().await }
    }

    /// Completes when a write fails (the worker is gone, or closed its end), with the error.
    /// Not to be polled again once it has completed: the connection ends then.
    pub async fn broken(&mut self) -> io::Error {
        let ended = (&mut self.writer).await;
        self.ended = true;
        match ended {
            Ok(Err(e)) => e,
            Ok(Ok(())) => io::Error::other("the writer stopped"),
            Err(join) => io::Error::other(join),
        }
    }

    /// Stops the writer and waits until it has: [`Outbox::delivery`] is final from then on. A
    /// write that returned has been counted by then (the writer stops only where it waits), so a
    /// worker that answered a batch is never taken for one that did not get it.
    pub async fn halt(&mut self) {
        self.writer.abort();
        if !self.ended {
            let _ = (&mut self.writer).await;
            self.ended = true;
        }
    }

    /// Lets what is queued go out, for up to `limit`, then stops the writer either way: a worker
    /// that does not read must not hold up the proxy's exit.
    pub async fn close(mut self, limit: Duration) {
        self.queue = None;
        if !self.ended && tokio::time::timeout(limit, &mut self.writer).await.is_err() {
            self.writer.abort();
        }
    }
}

impl Drop for Outbox {
    /// A connection that ends without [`Outbox::close`] (a failed or hung worker) stops writing
    /// at once; the write half closes with the task.
    fn drop(&mut self) {
        self.writer.abort();
    }
}

/// How far a frame got to the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Not a byte of it was written.
    None,
    /// Some of it was written, not all: the worker was reading it (or stuck in it).
    Partial,
    /// Written whole into the worker's socket.
    Whole,
}

/// Frames of which the writer wrote some bytes, and frames it wrote whole (each counts from the
/// first frame).
#[derive(Default)]
struct Progress {
    begun: AtomicU64,
    written: AtomicU64,
    /// Told each time a frame has been written whole ([`Outbox::wrote`]).
    wrote: Notify,
}

/// A queued frame, and the descriptor to pass with it.
struct Outgoing {
    message: ProxyMessage,
    descriptor: Option<OwnedFd>,
}

/// Writes each queued frame whole, in order. The write loop is by hand only to know whether any
/// byte of a frame went out before an error (see [`Delivery`]).
async fn write(
    mut half: OwnedWriteHalf,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    progress: Arc<Progress>,
) -> io::Result<()> {
    let mut codec = ProxyCodec::default();
    while let Some(Outgoing { message, mut descriptor }) = frames.recv().await {
        let mut frame = match &message {
            ProxyMessage::Batch(batch) => BatchFrame::new(batch)?,
            other => {
                let mut buf = BytesMut::new();
                codec.encode(other, &mut buf)?;
                BatchFrame::whole(buf.freeze())
            }
        };
        // The frame holds what it needs of the message (the payloads, shared).
        drop(message);
        let mut begun = false;
        while frame.has_remaining() {
            let written = match descriptor.take() {
                Some(fd) => write_with_descriptor(&half, frame.chunk(), fd).await?,
                None => write_some(&mut half, &frame).await?,
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            frame.advance(written);
            if !begun {
                begun = true;
                progress.begun.fetch_add(1, Ordering::Release);
            }
        }
        progress.written.fetch_add(1, Ordering::Release);
        progress.wrote.notify_one();
    }
    Ok(())
}

/// Segments a `writev` takes at once (Linux allows 1024): a batch of 32 jobs has about 65, or up
/// to two more per input for each large v2 row (held as segments).
const MAX_SEGMENTS: usize = 256;

/// One vectored write of what is left of `frame`; how many bytes it took.
async fn write_some(half: &mut OwnedWriteHalf, frame: &BatchFrame) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        let mut slices = [IoSlice::new(&[]); MAX_SEGMENTS];
        let filled = frame.chunks_vectored(&mut slices);
        Pin::new(&mut *half).poll_write_vectored(cx, &slices[..filled])
    })
    .await
}

/// One `sendmsg` of (some of) `bytes` with `descriptor` passed along (`SCM_RIGHTS`): the
/// descriptor arrives with the first of these bytes. Ours is closed once sent.
async fn write_with_descriptor(
    half: &OwnedWriteHalf,
    bytes: &[u8],
    descriptor: OwnedFd,
) -> io::Result<usize> {
    let stream: &UnixStream = half.as_ref();
    loop {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || send_descriptor(stream, bytes, &descriptor)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            written => return written,
        }
    }
}

/// A worker gone mid-write is an error to return, not a signal (Rust ignores SIGPIPE anyway).
#[cfg(target_os = "linux")]
const NO_SIGNAL: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(target_os = "linux"))]
const NO_SIGNAL: libc::c_int = 0;

fn send_descriptor(stream: &UnixStream, bytes: &[u8], descriptor: &OwnedFd) -> io::Result<usize> {
    let fd: libc::c_int = descriptor.as_raw_fd();
    // A control buffer aligned for `cmsghdr`, with room for one descriptor.
    let mut control = [0u64; 4];
    // SAFETY: `msghdr` points at `bytes` and `control`, both alive for the call; the control
    // message is written inside `control` through the CMSG macros, which stay within
    // `CMSG_SPACE(sizeof(int))` (≤ 32 bytes on every platform Corral builds for).
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        assert!(space <= std::mem::size_of_val(&control));
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd);
        let sent = libc::sendmsg(stream.as_raw_fd(), &message, NO_SIGNAL);
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sent as usize)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use corral_protocol::{Batch, BatchJob, JobId, Shutdown, WorkerCodec};
    use futures_util::StreamExt;
    use tokio::net::UnixStream;
    use tokio_util::codec::FramedRead;

    use super::*;

    #[tokio::test]
    async fn frames_larger_than_the_socket_buffer_arrive_whole_and_in_order() {
        let (proxy_end, worker_end) = UnixStream::pair().unwrap();
        let (_read, write) = proxy_end.into_split();
        let mut outbox = Outbox::new(write);
        // Several MiB: many partial vectored writes, each ending anywhere in a segment.
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let jobs = vec![
            BatchJob {
                id: JobId::new(),
                timeout_ms: 5000,
                payload: Bytes::from(big).into(),
                content_type: Some("application/octet-stream".into()),
                traceparent: None,
                tracestate: None,
                payload_at: None,
            },
            BatchJob {
                id: JobId::new(),
                timeout_ms: 1,
                payload: Bytes::from_static(&[0x93, 1, 2, 3]).into(),
                content_type: None,
                traceparent: None,
                tracestate: None,
                payload_at: None,
            },
        ];
        let batch = ProxyMessage::Batch(Batch { jobs });
        let shutdown = ProxyMessage::Shutdown(Shutdown { message: "bye".into() });
        assert_eq!(outbox.send(batch.clone()), 0);
        assert_eq!(outbox.send(shutdown.clone()), 1);

        let mut inbox = FramedRead::new(worker_end, WorkerCodec::default());
        assert_eq!(inbox.next().await.unwrap().unwrap(), batch);
        assert_eq!(inbox.next().await.unwrap().unwrap(), shutdown);
        outbox.close(Duration::from_secs(5)).await;
        assert!(inbox.next().await.is_none(), "the writer closed its end once done");
    }

    #[tokio::test]
    async fn a_frame_of_which_no_byte_went_out_is_not_delivered() {
        let (proxy_end, worker_end) = UnixStream::pair().unwrap();
        drop(worker_end);
        let (_read, write) = proxy_end.into_split();
        let mut outbox = Outbox::new(write);
        let job = BatchJob {
            id: JobId::new(),
            timeout_ms: 1,
            payload: Bytes::from_static(&[0xc0]).into(),
            content_type: None,
            traceparent: None,
            tracestate: None,
            payload_at: None,
        };
        let index = outbox.send(ProxyMessage::Batch(Batch { jobs: vec![job] }));
        let error = outbox.broken().await;
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
        outbox.halt().await;
        assert_eq!(outbox.delivery(index), Delivery::None);
    }
}
