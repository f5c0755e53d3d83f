//! Every message that crosses the worker socket.
//!
//! Each message is one msgpack map with a `type` key naming it (`serde(tag = "type")`); the other
//! keys follow in the order the structs declare them. Receivers ignore keys they do not know, so a
//! later minor addition does not break an older peer; anything incompatible bumps
//! [`crate::PROTOCOL_VERSION`].
//!
//! The conversation is pull-based: a worker says `hello`, which also means "I am idle"; the proxy
//! answers with one `batch` when it has work; the worker answers with one `results`, which again
//! means "I am idle". A worker works on one batch at a time, and may hold one more sent ahead
//! when its stage is saturated (PROTOCOL.md, "The conversation"); a streaming worker holds the
//! jobs it pulled (`pull`) until each has its end.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{JobId, Payload};

/// What a worker sends.
// A hello is far larger than the rest, and comes once a connection; the frames of the hot path
// (results, chunks, pull) are small whatever its size, so nothing is gained by boxing it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    Hello(Hello),
    Results(Results),
    /// Streaming workers only: partial answers of jobs the worker holds.
    Chunks(Chunks),
    /// Joining workers only: room for more jobs while the worker holds some.
    Pull(Pull),
}

/// What the proxy sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProxyMessage {
    Batch(Batch),
    Reject(Reject),
    Shutdown(Shutdown),
    /// Workers that declared `cancel` only: jobs nobody waits for any more.
    Cancel(Cancel),
    /// Workers that declared `shm` only, once, right after their hello: the shared memory that
    /// `payload_at` points into, its descriptor passed with the frame's first byte.
    Shm(Shm),
}

/// The worker's first frame: who it is and what it speaks. It also marks the worker idle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Protocol version the worker speaks; must equal [`crate::PROTOCOL_VERSION`].
    pub version: u32,
    /// The stage this worker serves (`"default"` for a single-stage proxy).
    pub stage: String,
    /// The worker's process id, for logs.
    pub pid: u32,
    /// A free-form name for logs (e.g. the worker class).
    #[serde(default)]
    pub name: String,
    /// Optional: JSON Schema (as JSON text) of one request, for the proxy's OpenAPI document.
    /// References point into `#/components/schemas/`, defined by `schema_components`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<String>,
    /// Optional: JSON Schema (as JSON text) of one response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<String>,
    /// Optional: a JSON object (as JSON text) of named schemas the two above refer to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_components: Option<String>,
    /// Optional: what the worker does beyond one answer per job — [`FEATURE_STREAM`],
    /// [`FEATURE_CANCEL`], [`FEATURE_JOIN`]. Unknown names are ignored, so a worker may declare
    /// features a proxy does not know yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Optional: the tensors each job's payload holds (Open Inference Protocol v2 routes), one
    /// row each; see PROTOCOL.md, "Tensors and raw bytes".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<TensorSpec>,
    /// Optional: the tensors each job's result holds, one row each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<TensorSpec>,
    /// Optional: how heavy each job is, for stages with a batch weight budget: a JSON Pointer
    /// (RFC 6901, e.g. `"/text"`) into the job's payload; the job weighs the length of the
    /// string (in characters), array, map or bytes found there, else 1. See PROTOCOL.md,
    /// "Weights".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// Optional: the most jobs the worker takes in one `batch` (at least 1): the proxy sends it
    /// none larger than this or the stage's `max_batch_size`. A joining worker's `max_running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<u32>,
}

/// A tensor a worker takes or gives, one row of it per job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// `BOOL`, `UINT8` … `UINT64`, `INT8` … `INT64`, `FP16`, `FP32`, `FP64` or `BYTES`.
    pub datatype: String,
    /// One row's shape, without the batch dimension; `-1` is a dimension of any length.
    pub shape: Vec<i64>,
}

/// The worker may send `chunks` before a job's result, and end a job with status `end`.
pub const FEATURE_STREAM: &str = "stream";
/// The worker understands `cancel`.
pub const FEATURE_CANCEL: &str = "cancel";
/// The worker can map shared memory passed over the socket and read payloads there
/// (`payload_at`); it reads the proxy's first frame with `recvmsg` to receive the descriptor.
pub const FEATURE_SHM: &str = "shm";
/// The worker (also streaming) takes more jobs while it holds some, asking with `pull`.
pub const FEATURE_JOIN: &str = "join";

impl Hello {
    /// Whether the worker declared `feature`.
    pub fn declares(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    /// Whether it declares tensors (inputs or outputs).
    pub fn declares_tensors(&self) -> bool {
        !self.inputs.is_empty() || !self.outputs.is_empty()
    }
}

/// The proxy refuses a worker (e.g. an unknown protocol version) and then closes the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reject {
    pub message: String,
}

/// The proxy is stopping: the worker should exit (not reconnect). Sent once the jobs the worker
/// held are answered; the proxy then closes the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shutdown {
    pub message: String,
}

/// Work for an idle worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub jobs: Vec<BatchJob>,
}

/// One job of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchJob {
    pub id: JobId,
    /// Milliseconds left before this job's deadline, as of sending. Past it the client has its
    /// 408 already and the result will be dropped, so a worker may skip such jobs.
    pub timeout_ms: u64,
    /// The job's input: one complete msgpack value, carried as `bin` so that the proxy never
    /// re-encodes it and the worker can decode (and reject) each job on its own. Held as one
    /// buffer or as segments ([`Payload`]); the wire bytes are the same.
    pub payload: Payload,
    /// A raw-bytes request only: the media type the client sent; `payload` is then one msgpack
    /// `bin` holding the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// A traced request only: its span's W3C `traceparent` (`00-<trace id>-<span id>-<flags>`),
    /// for the worker's spans to continue its trace. Workers that do not trace ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// With `traceparent`, when the trace has one: its W3C `tracestate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// A worker that declared `shm` only: `[offset, length]` of the payload in the shared memory
    /// the `shm` frame gave it; `payload` is then empty. The bytes there stay as they are until
    /// the worker has answered the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_at: Option<[u64; 2]>,
}

/// The shared memory a worker that declared `shm` reads `payload_at` from: `size` bytes, to be
/// mapped read-only from the descriptor that came with this frame. `size` 0 (and no descriptor):
/// this proxy shares none, and every payload travels in its frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shm {
    pub size: u64,
}

/// A worker's answer to one batch: exactly one result per job of that batch, in any order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    #[serde(deserialize_with = "list::required")]
    pub results: Vec<JobResult>,
}

/// How one job ended in the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    /// `data` holds the output (one msgpack value as `bin`); the client gets 200.
    Ok,
    /// The worker rejected this job's input; `message` says why; the client gets 422.
    Invalid,
    /// The worker failed on this job; `message` says why; the client gets 500.
    Error,
    /// The worker skipped this job because its deadline had passed; the client gets 408.
    Expired,
    /// Streaming workers only: the job's stream ended after its chunks (no `data`).
    End,
}

/// A status is read from its name only: serde's derived reading also took a variant's index
/// (`1` for `invalid`) where msgpack was read directly, but not where it was buffered first, so
/// a frame's fate hung on its keys' order (`codec::Tagged`).
impl<'de> Deserialize<'de> for ResultStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = ResultStatus;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("ok, invalid, error, expired or end")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ResultStatus, E> {
                Ok(match name {
                    "ok" => ResultStatus::Ok,
                    "invalid" => ResultStatus::Invalid,
                    "error" => ResultStatus::Error,
                    "expired" => ResultStatus::Expired,
                    "end" => ResultStatus::End,
                    _ => return Err(E::unknown_variant(name, STATUSES)),
                })
            }
            // PROTOCOL.md: any `str` may come as a `bin` of UTF-8 (older msgpack writers).
            fn visit_bytes<E: serde::de::Error>(self, name: &[u8]) -> Result<ResultStatus, E> {
                match std::str::from_utf8(name) {
                    Ok(name) => self.visit_str(name),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Bytes(name), &self)),
                }
            }
        }
        const STATUSES: &[&str] = &["ok", "invalid", "error", "expired", "end"];
        deserializer.deserialize_str(Name)
    }
}

/// One job's result. `data` is present exactly when `status` is `ok`, `message` otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub id: JobId,
    pub status: ResultStatus,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "bin::optional")]
    pub data: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// With `ok` only, optional: the media type of an output that is one msgpack `bin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// Partial answers: each entry is one chunk of one job's stream (one msgpack value as `bin`).
/// Several jobs' chunks share a frame; one job's chunks are in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunks {
    #[serde(deserialize_with = "list::required")]
    pub chunks: Vec<Chunk>,
}

/// One chunk of one job's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub id: JobId,
    #[serde(deserialize_with = "bin::required")]
    pub data: Bytes,
}

/// A result's or a chunk's `data` as the protocol has it, a msgpack `bin` and nothing else:
/// serde's reading of `Bytes` also took a `str` (its bytes then read as msgpack: a worker that
/// wrote the text `"1"` there was answered 49, with 200) and an array of integers.
mod bin {
    use std::fmt;

    use bytes::Bytes;
    use serde::de::{self, Deserializer, Visitor};

    struct Bin;

    impl<'de> Visitor<'de> for Bin {
        type Value = Bytes;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a msgpack bin (the msgpack value, as bytes)")
        }

        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(bytes))
        }

        fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(bytes))
        }
    }

    struct MaybeBin;

    impl<'de> Visitor<'de> for MaybeBin {
        type Value = Option<Bytes>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a msgpack bin (the msgpack value, as bytes), or nil")
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<Bytes>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<Bytes>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Bytes>, D::Error> {
            required(d).map(Some)
        }
    }

    pub fn required<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_byte_buf(Bin)
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        d.deserialize_option(MaybeBin)
    }
}

/// A frame's list (`results`, `chunks`) as the protocol has it, a msgpack array and nothing else:
/// rmp_serde reads a `bin` where a sequence is asked for as the sequence of its bytes, so
/// `results: b""` was an empty answer (a streaming worker's sign of life) where the frame came
/// with `type` first, and refused where it did not (`codec::Tagged`'s two readings).
mod list {
    use std::{fmt, marker::PhantomData};

    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

    struct List<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for List<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            // No more room ahead than 4,096 entries, whatever length a hostile frame claims
            // (serde's own reading of a Vec keeps to a MiB's worth).
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(item) = seq.next_element()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    /// Read as any value is, so that a `bin` comes to the visitor as bytes (refused), not as a
    /// sequence of integers.
    pub fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        d.deserialize_any(List(PhantomData))
    }
}

/// A joining worker can take up to `max` more jobs now (0 withdraws an earlier offer). The proxy
/// answers with one `batch` of 1 to `max` jobs when it has queued work, or not at all; a later
/// `pull` replaces the offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    pub max: u32,
}

/// Jobs whose client left or whose deadline passed: the worker may stop computing them. Each
/// still gets its one result (any status: the proxy drops it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    pub ids: Vec<JobId>,
}

impl JobResult {
    pub fn ok(id: JobId, data: impl Into<Bytes>) -> Self {
        let data = Some(data.into());
        Self { id, status: ResultStatus::Ok, data, message: None, content_type: None }
    }

    pub fn invalid(id: JobId, message: impl Into<String>) -> Self {
        let message = Some(message.into());
        Self { id, status: ResultStatus::Invalid, data: None, message, content_type: None }
    }

    pub fn error(id: JobId, message: impl Into<String>) -> Self {
        let message = Some(message.into());
        Self { id, status: ResultStatus::Error, data: None, message, content_type: None }
    }

    pub fn end(id: JobId) -> Self {
        Self { id, status: ResultStatus::End, data: None, message: None, content_type: None }
    }
}
