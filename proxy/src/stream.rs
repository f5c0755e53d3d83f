//! A streamed job's chunks on their way to its client: the bounded buffer between the worker
//! connection (which pushes chunks as they arrive) and the HTTP answer (which takes them as fast
//! as the client reads).
//!
//! The buffer is bounded in bytes, not in chunks (`--stream-buffer-bytes`): one slow client must
//! never slow its worker or its batch-mates, so a push never waits. A push past the bound is
//! refused instead, and the connection ends that job (`slow_client`). Each chunk counts as its
//! bytes plus [`CHUNK_HELD`], what holding it costs besides them, so that memory per stream is
//! at most the bound plus one chunk however small the chunks (counted as their bytes alone,
//! a megabyte of one-byte chunks held 49 MiB).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::job::{Sent, SentSlot};

/// What a chunk costs held in the buffer besides its bytes: its `Bytes` in the channel's slot
/// (32 bytes), its allocation's own rounding and head (one-byte chunks cost 49 bytes each,
/// measured), and a margin.
pub const CHUNK_HELD: usize = 64;

/// What both ends share: the bytes pushed and not yet taken, and the batch that carried the job
/// to its worker (for the stream's `server-timing`).
#[derive(Debug, Default)]
struct Shared {
    pending: AtomicUsize,
    sent: Arc<SentSlot>,
    /// The answer ended the stream itself: a chunk it could not write (no JSON form).
    ended_here: AtomicBool,
}

/// The pushing end, carried by the job.
#[derive(Debug)]
pub struct ChunkSink {
    chunks: mpsc::UnboundedSender<Bytes>,
    pending: Arc<Shared>,
    limit: usize,
    /// A chunk went into the buffer: the client's answer is a stream (200) from then on.
    started: AtomicBool,
}

/// The taking end, kept by the HTTP answer.
pub struct ChunkSource {
    chunks: mpsc::UnboundedReceiver<Bytes>,
    pending: Arc<Shared>,
}

/// Why a chunk was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The client is behind by more than the bound.
    SlowClient,
    /// Nobody takes chunks any more: the client left.
    Gone,
}

/// A buffer of at most `limit` unsent bytes (one chunk always fits, however large).
pub fn channel(limit: usize) -> (ChunkSink, ChunkSource) {
    let (tx, rx) = mpsc::unbounded_channel();
    let pending = Arc::new(Shared::default());
    let sink = ChunkSink { chunks: tx, pending: pending.clone(), limit, started: false.into() };
    (sink, ChunkSource { chunks: rx, pending })
}

impl ChunkSink {
    /// Records the batch that carries the job to its worker (the latest, if it is retried).
    pub fn sent(&self, sent: Sent) {
        self.pending.sent.set(sent);
    }

    /// Where the batch that carries the job is recorded, for a reader apart from the source
    /// (the request's queue span, `trace::QueueWait`).
    pub fn sent_slot(&self) -> Arc<SentSlot> {
        self.pending.sent.clone()
    }

    /// Queues a chunk for the client, never waiting.
    pub fn push(&self, chunk: Bytes) -> Result<(), Refused> {
        if self.chunks.is_closed() {
            return Err(Refused::Gone);
        }
        let len = chunk.len() + CHUNK_HELD;
        let before = self.pending.pending.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before + len > self.limit {
            self.pending.pending.fetch_sub(len, Ordering::AcqRel);
            return Err(Refused::SlowClient);
        }
        self.chunks.send(chunk).map_err(|_| {
            self.pending.pending.fetch_sub(len, Ordering::AcqRel);
            Refused::Gone
        })?;
        self.started.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a chunk went to the client: its answer is a stream, never a 408.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether the answer ended the stream itself ([`ChunkSource::end_here`]): the worker's
    /// later end of the job is then no client's departure.
    pub fn ended_here(&self) -> bool {
        self.pending.ended_here.load(Ordering::Relaxed)
    }
}

impl ChunkSource {
    /// The batch that carried the job to its worker, once one did.
    pub fn sent(&self) -> Option<Sent> {
        self.pending.sent.get()
    }

    /// The next chunk, once one is there; None once the sink is gone and every chunk taken.
    pub async fn next(&mut self) -> Option<Bytes> {
        let chunk = self.chunks.recv().await?;
        self.pending.pending.fetch_sub(chunk.len() + CHUNK_HELD, Ordering::AcqRel);
        Some(chunk)
    }

    /// The answer ends the stream itself, with an error its client gets (a chunk that has no
    /// JSON form): not a client that left, which `corral_jobs_cancelled_total` counts. The
    /// worker is still told to stop, as the answer ends.
    pub fn end_here(&self) {
        self.pending.ended_here.store(true, Ordering::Relaxed);
    }

    /// A chunk already there, without waiting.
    pub fn try_next(&mut self) -> Option<Bytes> {
        let chunk = self.chunks.try_recv().ok()?;
        self.pending.pending.fetch_sub(chunk.len() + CHUNK_HELD, Ordering::AcqRel);
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_behind_by_more_than_the_bound_is_refused_and_one_chunk_always_fits() {
        let (sink, mut source) = channel(CHUNK_HELD + 10);
        assert_eq!(sink.push(Bytes::from(vec![0; 640])), Ok(()), "one chunk always fits");
        assert_eq!(sink.push(Bytes::from_static(b"x")), Err(Refused::SlowClient));
        assert_eq!(source.next().await.map(|c| c.len()), Some(640));
        assert_eq!(sink.push(Bytes::from_static(b"0123456789")), Ok(()));
        assert_eq!(sink.push(Bytes::from_static(b"x")), Err(Refused::SlowClient));
        drop(source);
        assert_eq!(sink.push(Bytes::from_static(b"late")), Err(Refused::Gone));
    }

    #[tokio::test]
    async fn small_chunks_count_what_holding_them_costs() {
        // A bound of 1,000 bytes held a thousand one-byte chunks, 49 bytes of memory each.
        let (sink, _source) = channel(1000);
        let taken = (0..1000).take_while(|_| sink.push(Bytes::from_static(b"x")).is_ok()).count();
        assert_eq!(taken, 1000 / (1 + CHUNK_HELD));
    }
}
