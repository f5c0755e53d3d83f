//! The wire contract between the Corral proxy and its inference workers.
//!
//! # Layout
//! - [`message`]: every message that crosses the Unix socket, as Rust types. Workers send
//!   [`WorkerMessage`]s (`hello`, `results`; a streaming worker also `chunks` and `pull`); the
//!   proxy sends [`ProxyMessage`]s (`batch`, `reject`, `shutdown`; `cancel` to a streaming
//!   worker, `shm` to one that maps shared memory).
//! - [`job_id`]: the 16-byte job identifier and its msgpack form.
//! - [`codec`]: frames (tokio-util's length-delimited codec: 4-byte big-endian length) around one
//!   msgpack map each, and the msgpack step itself.
//! - [`payload`]: a job's payload, one msgpack value held as one buffer or several segments.
//! - [`segments`]: a `batch` frame as segments around its payloads, for one vectored write that
//!   copies no payload byte.
//! - [`walk`]: a msgpack value walked marker by marker — where it ends, what it holds, whether
//!   its strings are UTF-8 — for the codec and for the proxy's checks of every value it reads.
//!
//! This crate has no opinion about sockets or runtimes: anything that is `AsyncRead + AsyncWrite`
//! can be wrapped in a `Framed` with [`codec::ProxyCodec`] or [`codec::WorkerCodec`].
//! `PROTOCOL.md` next to this crate documents every byte; `vectors/` holds golden frames that
//! this crate's tests and the Python package's tests both decode and re-encode byte for byte.

pub mod codec;
#[doc(hidden)]
pub mod fuzzing;
pub mod job_id;
pub mod message;
pub mod payload;
pub mod segments;
pub mod walk;

pub use codec::{decode, encode, frame_codec, DecodeError, ProxyCodec, WorkerCodec};
pub use job_id::JobId;
pub use message::{
    Batch, BatchJob, Cancel, Chunk, Chunks, Hello, JobResult, ProxyMessage, Pull, Reject,
    ResultStatus, Results, Shm, Shutdown, TensorSpec, WorkerMessage, FEATURE_CANCEL, FEATURE_JOIN,
    FEATURE_SHM, FEATURE_STREAM,
};
pub use payload::Payload;
pub use segments::BatchFrame;

/// The protocol version this crate speaks. A worker that says hello with another version is
/// refused (a `reject` message, then the connection is closed).
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame (length prefix excluded) either side accepts: 64 MiB.
///
/// Chosen so that a full default batch of 32 one-MiB payloads, with its per-job overhead, fits
/// with room to spare, while one misbehaving peer still cannot make the other allocate without
/// bound. The Python package uses the same number.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// Bytes a batch frame spends beyond its payloads, per job (map header, keys, id, timeout and bin
/// headers: about 50) rounded up generously, so the proxy can keep a batch under
/// [`MAX_FRAME_BYTES`] by counting payload bytes only.
pub const FRAME_OVERHEAD_PER_JOB: usize = 128;
