//! A job: one client request on its way to a worker, and the one answer it will get.
//!
//! The HTTP handler keeps the receiving end of the job's reply channel and waits on it until the
//! job's deadline; whoever holds the [`Job`] (the stage queue, then a worker connection) answers
//! through it exactly once, because [`Job::answer`] consumes the job. A client that disconnects
//! drops the receiver, which the queue sees as [`Job::is_abandoned`]; the waiting side also
//! cancels the job's `left` token when it stops waiting, so that a worker holding the job can be
//! told (`cancel`).
//!
//! A streamed job also carries a [`ChunkSink`]: its chunks go to the client as they arrive, and
//! its outcome only ends the stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corral_protocol::{JobId, Payload};
use http::HeaderValue;
use opentelemetry::trace::{SpanContext, SpanId, TraceId};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::stream::ChunkSink;
use crate::traffic::{Class, Tenant};

/// How a job ended, as told to the HTTP handler waiting for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The worker's output: one msgpack value; and, when that value is one msgpack `bin`, the
    /// media type the worker named for those bytes, if it named one (checked, see
    /// [`crate::worker::settle::output`]).
    Done(Bytes, Option<HeaderValue>),
    /// The worker rejected this job's input (422).
    Invalid(String),
    /// The worker raised while processing this job (500).
    Failed(String),
    /// The worker answered `ok` with `data` that is not one well-formed msgpack value (500).
    BadOutput(String),
    /// The worker's connection broke or misbehaved while it held this job (500).
    WorkerLost(String),
    /// The deadline passed before the job was answered, queued or in its worker (408).
    Expired,
    /// A job of a higher class needed the queue's room: this one was evicted before it was
    /// dispatched (503 `preempted`), worth retrying after `retry_after`.
    Preempted { retry_after: Duration },
    /// The proxy is stopping and its grace period ran out before this job was answered (503).
    ShuttingDown,
    /// The job's row was read against tensors its stage's workers no longer declare: a worker
    /// of other tensors replaced them while it was queued (503 `tensors_changed`: sent again,
    /// the request is read against the new ones).
    TensorsChanged,
    /// A streamed job's stream ended normally: every chunk went through its sink.
    Ended,
    /// A streamed job's client fell behind by more than its buffer: the job was cancelled.
    SlowClient,
}

/// When a job's batch was queued for its worker, and how many jobs that batch held: set by the
/// worker connection as it sends the batch (again, if the job is retried on another worker).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sent {
    pub at: Instant,
    pub batch_size: u32,
    /// The batch's span (trace and span id), when tracing is on and the batch has one.
    pub span: Option<(TraceId, SpanId)>,
}

/// A job's [`Sent`], as its waiting side sees it: a one-shot job's shared with it
/// ([`Job::watch_sent`]), a stream's kept by its chunks' channel ([`crate::stream`]). So a job
/// whose deadline passed while a worker held it is answered 408 with the batch it rode
/// (`server-timing`'s `queue` and `batch`, `x-corral-batch-size`).
#[derive(Debug, Default)]
pub struct SentSlot(Mutex<Option<Sent>>);

impl SentSlot {
    /// The batch that carried the job to its worker (the latest, if it was retried), once one did.
    pub fn get(&self) -> Option<Sent> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set(&self, sent: Sent) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
    }
}

/// A job's answer as its waiting side receives it: the outcome and, if the job rode a batch,
/// when that batch was sent and when the answer came (`x-corral-batch-size`, `server-timing`).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub outcome: Outcome,
    /// The batch the job rode, and when its answer was given.
    pub batch: Option<(Sent, Instant)>,
    /// The class the job had reached by its answer (promoted while it waited): a pipeline's
    /// next stage takes the request in at it ([`crate::pipeline`]).
    pub class: Class,
}

/// One unit of work: a payload, its identity and its deadline.
#[derive(Debug)]
pub struct Job {
    pub id: JobId,
    /// The job's input: one complete msgpack value (as segments where it arrived in pieces).
    pub payload: Payload,
    /// When the job was queued; the batch window counts from the oldest queued job's arrival.
    pub arrived: Instant,
    pub deadline: Instant,
    /// How long a worker may take over the job: its route's timeout (a stream's, no longer
    /// than its stream timeout), never less than the job's own budget. A worker's hung clock
    /// runs this long from when it got the batch (the longest among the batch's jobs). Not the
    /// time to `deadline`, which a client's header (or the mesh's) shortens and the queue uses
    /// up: with it, a 100 ms header on a 2.5 s model got the worker killed as hung on every
    /// request, and so did a job queued behind a long batch. The client has its 408 at
    /// `deadline` all the same.
    pub allowance: Duration,
    /// The request's whole time, arrival to deadline, whichever stage the job is on (a later
    /// stage's job is given what is left): admission judges against it whether the request could
    /// ever make it, with nothing queued and every worker free.
    pub budget: Duration,
    /// The job's priority class (raised while it waits: see [`crate::stage::lanes`]).
    pub class: Class,
    /// The tenant the request named, if any.
    pub tenant: Option<Tenant>,
    /// The epoch of its stage's declared tensors its row was read against (a v2, KServe v1 or
    /// OpenAI request's job on its first stage), if it was read against them: taken for a batch
    /// after a worker of other tensors replaced them, it is answered 503 `tensors_changed`
    /// ([`crate::stage::Stage::tensors_epoch`]).
    pub tensors: Option<u64>,
    /// What the job counts toward its batch's weight budget and the cost model (at least 1;
    /// 0 until its stage weighs it, by the client's `x-corral-weight` or the workers' rule).
    pub weight: u32,
    /// How many more times the job may be given to another worker if its worker dies with it.
    pub retries: u32,
    /// Set once a worker died, hung or broke the protocol after the job's batch was written to
    /// it, in part or whole (a batch it never got goes back as it was): from then on the job
    /// goes to a worker in a batch of its own, with nothing sent ahead behind it and nothing
    /// joining it ([`crate::stage`]'s taking), so that a poison input retried takes none of its
    /// batch-mates down with it.
    pub alone: bool,
    /// The request the job belongs to, shared by all its jobs ([`Job::new`] gives each job a
    /// request of its own): jobs handed back after their worker died are queued as their
    /// request again, to be taken and evicted whole.
    pub request: u64,
    /// Cancelled once nobody waits for the answer any more (client left, deadline passed), or,
    /// for a stream, by its worker's connection at the stream's timeout (the client then gets
    /// the timeout's error event, nothing more).
    pub left: CancellationToken,
    /// Where a streamed job's chunks go (None: a one-shot job; chunks, if its worker streams,
    /// are gathered into one answer).
    pub stream: Option<ChunkSink>,
    /// A raw-bytes job only: the media type of its payload (one msgpack `bin`), as the client
    /// sent it; it goes to the worker as the job's `content_type`.
    pub content_type: Option<HeaderValue>,
    /// The batch that carries the job to its worker, once one does ([`Job::mark_sent`]).
    pub sent: Option<Sent>,
    /// Where the waiting side of a one-shot job looks for [`Job::sent`] when its deadline comes
    /// before the answer ([`Job::watch_sent`]); a streamed job's sink does this for it.
    sent_slot: Option<Arc<SentSlot>>,
    /// The request's span context, when tracing is on: its batch's span links to it. Set with
    /// [`Job::set_trace`], which also counts what it adds to the frame; read with [`Job::trace`].
    trace: Option<Box<SpanContext>>,
    /// The bytes the trace context adds to the job's frame entry (0 untraced): counted once,
    /// since the queue asks for [`Job::size`] several times per job.
    trace_bytes: usize,
    reply: oneshot::Sender<Reply>,
}

/// A request key no other request has: what [`Job::request`] holds.
pub fn new_request() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Job {
    /// A new job and the receiver its answer will arrive on.
    pub fn new(
        id: JobId,
        payload: impl Into<Payload>,
        arrived: Instant,
        deadline: Instant,
    ) -> (Self, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let job = Self {
            id,
            payload: payload.into(),
            arrived,
            deadline,
            allowance: deadline.saturating_duration_since(arrived),
            budget: deadline.saturating_duration_since(arrived),
            class: Class::Normal,
            tenant: None,
            tensors: None,
            weight: 1,
            retries: 0,
            alone: false,
            request: new_request(),
            left: CancellationToken::new(),
            stream: None,
            content_type: None,
            sent: None,
            sent_slot: None,
            trace: None,
            trace_bytes: 0,
            reply,
        };
        (job, answer)
    }

    /// The bytes the job adds to its batch frame beyond the fixed per-job overhead
    /// ([`corral_protocol::FRAME_OVERHEAD_PER_JOB`]): what queues and batches count.
    pub fn size(&self) -> usize {
        self.payload.len()
            + self.content_type.as_ref().map_or(0, HeaderValue::len)
            + self.trace_bytes
    }

    /// The request's span context, if it is traced.
    pub fn trace(&self) -> Option<&SpanContext> {
        self.trace.as_deref()
    }

    /// Sets the request's span context (None: untraced) and what it adds to the frame:
    /// `traceparent` (55 characters), `tracestate`, their keys and headers.
    pub fn set_trace(&mut self, context: Option<Box<SpanContext>>) {
        self.trace_bytes = context.as_ref().map_or(0, |context| {
            let state = context.trace_state().header();
            let state = if state.is_empty() { 0 } else { state.len() + 12 };
            55 + 13 + state
        });
        self.trace = context;
    }

    /// Shares [`Job::sent`] with the job's waiting side, from now on.
    pub fn watch_sent(&mut self) -> Arc<SentSlot> {
        let slot = Arc::new(SentSlot::default());
        self.sent_slot = Some(slot.clone());
        slot
    }

    /// The batch that carries the job to its worker was sent: the job keeps it for its answer,
    /// and tells whoever waits for it (a stream's client, a one-shot waiter that watches).
    pub fn mark_sent(&mut self, sent: Sent) {
        self.sent = Some(sent);
        if let Some(stream) = &self.stream {
            stream.sent(sent);
        }
        if let Some(slot) = &self.sent_slot {
            slot.set(sent);
        }
    }

    /// Answers the job. Returns false when nobody was waiting any more (the client left, or its
    /// deadline passed and it already got 408): the answer is dropped.
    pub fn answer(self, outcome: Outcome) -> bool {
        let batch = self.sent.map(|sent| (sent, Instant::now()));
        self.reply.send(Reply { outcome, batch, class: self.class }).is_ok()
    }

    /// Whether the client stopped waiting (disconnected, or answered 408 at its deadline).
    pub fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    pub fn is_expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    /// Time left before the deadline, as of `now` (zero once past it).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_jobs_media_type_counts_toward_its_size() {
        let now = Instant::now();
        let (mut job, _answer) =
            Job::new(JobId::new(), Bytes::from_static(b"\xc4\x03PNG"), now, now);
        assert_eq!(job.size(), 5);
        job.content_type = Some(HeaderValue::from_static("image/png"));
        assert_eq!(job.size(), 5 + "image/png".len());
    }

    #[test]
    fn a_watching_waiter_learns_when_its_jobs_batch_was_sent() {
        let now = Instant::now();
        let (mut job, _answer) = Job::new(JobId::new(), Bytes::new(), now, now);
        let slot = job.watch_sent();
        assert_eq!(slot.get(), None, "still queued");
        let sent = Sent { at: now, batch_size: 3, span: None };
        job.mark_sent(sent);
        assert_eq!((job.sent, slot.get()), (Some(sent), Some(sent)));
    }
}
