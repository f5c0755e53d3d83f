//! A streamed job's chunks on their way to its client: the bounded buffer between the worker
//! connection (which pushes chunks as they arrive) and the HTTP answer (which takes them as fast
//! as the client reads).
//!
//! The buffer is bounded in bytes, not in chunks (`--stream-buffer-bytes`): one slow client must
//! never slow its worker or its batch-mates, so a push never waits. A push past the bound is
//! refused instead, and the connection ends that job (`slow_client`). Memory per stream is thus
//! at most the bound plus one chunk.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::job::{Sent, SentSlot};

/// What both ends share: the bytes pushed and not yet taken, and the batch that carried the job
/// to its worker (for the stream's `server-timing`).
#[derive(Debug, Default)]
struct Shared {
    pending: AtomicUsize,
    sent: SentSlot,
}

/// The pushing end, carried by the job.
#[derive(Debug)]
pub struct ChunkSink {
    chunks: mpsc::UnboundedSender<Bytes>,
    pending: Arc<Shared>,
    limit: usize,
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
    (ChunkSink { chunks: tx, pending: pending.clone(), limit }, ChunkSource { chunks: rx, pending })
}

impl ChunkSink {
    /// Records the batch that carries the job to its worker (the latest, if it is retried).
    pub fn sent(&self, sent: Sent) {
        self.pending.sent.set(sent);
    }

    /// Queues a chunk for the client, never waiting.
    pub fn push(&self, chunk: Bytes) -> Result<(), Refused> {
        if self.chunks.is_closed() {
            return Err(Refused::Gone);
        }
        let len = chunk.len();
        let before = self.pending.pending.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before + len > self.limit {
            self.pending.pending.fetch_sub(len, Ordering::AcqRel);
            return Err(Refused::SlowClient);
        }
        self.chunks.send(chunk).map_err(|_| {
            self.pending.pending.fetch_sub(len, Ordering::AcqRel);
            Refused::Gone
        })
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
        self.pending.pending.fetch_sub(chunk.len(), Ordering::AcqRel);
        Some(chunk)
    }

    /// A chunk already there, without waiting.
    pub fn try_next(&mut self) -> Option<Bytes> {
        let chunk = self.chunks.try_recv().ok()?;
        self.pending.pending.fetch_sub(chunk.len(), Ordering::AcqRel);
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_behind_by_more_than_the_bound_is_refused_and_one_chunk_always_fits() {
        let (sink, mut source) = channel(10);
        assert_eq!(sink.push(Bytes::from(vec![0; 64])), Ok(()), "one chunk always fits");
        assert_eq!(sink.push(Bytes::from_static(b"x")), Err(Refused::SlowClient));
        assert_eq!(source.next().await.map(|c| c.len()), Some(64));
        assert_eq!(sink.push(Bytes::from_static(b"0123456789")), Ok(()));
        assert_eq!(sink.push(Bytes::from_static(b"x")), Err(Refused::SlowClient));
        drop(source);
        assert_eq!(sink.push(Bytes::from_static(b"late")), Err(Refused::Gone));
    }
}
