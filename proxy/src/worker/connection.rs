//! One connected worker: its hello ([`super::hello`]) and its joining the stage, then "wait for a
//! batch, send it, read its results" until the connection ends.
//!
//! The socket is split: this task reads, an [`Outbox`] task writes. Reading never waits on a
//! write, so a worker blocked writing a large `results` frame is always read while a large batch
//! goes out to it (see [`super::outbox`]); and the hung timer and the shutdown signal stay in
//! sight while a write is under way.
//!
//! The task owns the jobs of the batches its worker holds, so when the connection breaks or the
//! worker breaks the protocol it knows exactly which jobs to hand back ([`settle`]): nobody waits
//! for a deadline because of a dead worker. Only this connection is closed; the proxy and the
//! other workers carry on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::{
    Batch, BatchJob, Cancel, Hello, Payload, ProxyCodec, ProxyMessage, Shm, Shutdown,
    WorkerMessage, FEATURE_CANCEL, FEATURE_SHM, FEATURE_STREAM,
};
use futures_util::{FutureExt, StreamExt};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::departures::Departures;
use super::hello::{declarations, handshake, misplaced, refuse};
use super::outbox::{Delivery, Outbox};
use super::settle::{self, answer, answer_result, give_back, Orphan};
use super::streaming;
use super::words::{logged, logged_within};
use super::Inbox;
use crate::job::{Job, Outcome, Sent};
use crate::metrics::{metrics, WorkerFailure};
use crate::shared_memory::SharedMemory;
use crate::stage::{Parts, Stage, WorkerSeat};
use crate::supervisor::{Children, Served, SpawnedWorker};
use crate::trace;

/// How long the closing frame (`shutdown`, `reject`) and anything queued before it get to reach
/// a worker: one that does not read must not hold up the proxy's exit.
const CLOSE_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// What a worker connection needs besides its socket.
#[derive(Clone)]
pub struct Context {
    /// The stages a worker may serve, by name: its hello says which.
    pub stages: Arc<HashMap<String, Arc<Stage>>>,
    /// Cancelled when the proxy stops: the worker is told to exit.
    pub shutdown: CancellationToken,
    /// Worker processes this proxy spawned, so that a hung one, or one left without its
    /// connection, can be killed and restarted.
    pub children: Children,
    /// The stages Corral spawns workers for (those with a command).
    pub spawning: Arc<HashSet<String>>,
    /// Large bodies' memory, handed to workers that declare `shm`.
    pub shared_memory: Option<Arc<SharedMemory>>,
    /// Connections yet to say hello, at most [`super::listener::AWAITING_HELLO`] more than the
    /// workers spawned (`listener::accept` takes a permit, the handshake gives it back; a
    /// worker Corral spawned is let in without one).
    pub awaiting_hello: Arc<tokio::sync::Semaphore>,
    /// Connected workers Corral did not spawn, at most [`MAX_EXTERNAL`] across the stages: each
    /// holds a permit for as long as it is connected.
    pub external: Arc<tokio::sync::Semaphore>,
}

/// Without `--batch-timeout-ms`, a worker is hung once it holds a batch this long past the
/// longest its jobs' routes allow a worker from when it got the batch ([`Job::allowance`]):
/// every client has its 408 by then. Not from its jobs' deadlines: those a client shortens and
/// the queue uses up, and no client can get a worker killed that way.
pub const HUNG_MARGIN: Duration = Duration::from_secs(1);

/// How long a worker may hold its work before it is hung, and where that limit came from (said
/// in the reason when it passes: without the flag it differs from batch to batch):
/// `--batch-timeout-ms`, else `allowance` (the longest its jobs' routes allow) and the margin.
pub(super) fn hung_limit(
    batch_timeout: Option<Duration>,
    allowance: Duration,
) -> (Duration, &'static str) {
    match batch_timeout {
        // Named as the stage's setting, wherever it was set: a config file's stage key had been
        // blamed on the flag.
        Some(limit) => (limit, "the stage's batch timeout, --batch-timeout-ms or batch_timeout_ms"),
        None => (allowance + HUNG_MARGIN, "its jobs' time and 1 s"),
    }
}

/// The most workers connected at once that Corral did not spawn, across its stages: each holds
/// a descriptor, buffers and a task, and a peer saying hello on connection after connection had
/// taken the descriptors HTTP needs. Kept room for under the open-file limit
/// ([`crate::open_files`]), so kept modest: a sidecar's external workers are a node's GPUs'
/// worth (8 × 4 is 32), and each counts against the HTTP connections a 1,024-descriptor limit
/// leaves. Corral's own workers are always let in.
pub const MAX_EXTERNAL: usize = 128;

/// Serves one worker connection until it closes, breaks the protocol, or the proxy shuts down.
/// `own_pid` is the worker's pid as the kernel tells it (0 where it cannot say, such as a peer
/// in another pid namespace), and `child` the spawned worker it is or runs under: what only a
/// spawned worker may claim (its device, its stage, being killed when hung) goes by those, not
/// by the pid a hello names.
pub async fn serve(
    stream: UnixStream,
    (own_pid, child): (u32, Option<SpawnedWorker>),
    context: Context,
    awaiting_hello: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    // A spawned worker left without a connection, but for the proxy's shutdown, is killed if
    // it lives on (`SpawnedWorker::lost`): on every way out of here.
    let mut lost = child.clone().map(|child| {
        child.connecting();
        Lost { child, joined: false, shutdown: context.shutdown.clone() }
    });
    let (read, write) = stream.into_split();
    // Until its hello, a peer is anyone who can open the socket: its frames get room as their
    // bytes come, not as their length announces (`MessageCodec`).
    let mut inbox = FramedRead::new(read, ProxyCodec::untrusted());
    let mut outbox = Outbox::new(write);
    let Some((hello, stage)) =
        handshake(&mut inbox, &mut outbox, &context.stages, &context.shutdown, child.as_ref())
            .await
    else {
        outbox.close(CLOSE_WRITE_LIMIT).await;
        return;
    };
    drop(awaiting_hello);
    inbox.decoder_mut().trust();
    let stage = &stage;
    let spawned = child.is_some();
    // Held while connected (dropped as this function returns).
    let external = match spawned {
        true => None,
        false => context.external.clone().try_acquire_owned().ok(),
    };
    // Read before the step below (schemas of up to 8 MiB parse here, not while it holds
    // every other newcomer of the stage).
    let declared = declarations(&hello);
    // As read: a schema ignored (unparsable, too large, no object) declares none.
    let parts = Parts::of(declared.as_ref());
    // Its own, kept while it is connected: what the stage's are laid from again as workers
    // leave (`Stage::forget_departed`).
    let own = declared.clone().map(std::sync::Arc::new);
    // The check, the declarations and the seat in one step ([`Stage::joining`]).
    let joined = {
        let _joining = stage.joining();
        let refusal = if !spawned && external.is_none() {
            Some(format!(
                "the proxy has {MAX_EXTERNAL} connected workers it did not spawn, the most it takes"
            ))
        } else if let Some(own) = misplaced(child.as_ref(), stage, &context.spawning) {
            Some(format!(
                "this worker was spawned for stage {own:?} and said hello for stage {:?} \
                 (its --stage, run(stage=...) or CORRAL_STAGE)",
                stage.name()
            ))
        } else if hello.declares(FEATURE_STREAM) && stage.feeds_another() {
            Some(format!(
                "stage {:?} feeds another stage; only the last stage of a pipeline may stream",
                stage.name()
            ))
        } else {
            stage.tensor_conflict(&hello.inputs, &hello.outputs)
        };
        match refusal {
            Some(message) => Err(message),
            None => {
                stage.keep(declared, parts);
                let served = child.as_ref().map(SpawnedWorker::connected).unwrap_or_default();
                let seat = stage.worker_joined_on(child.as_ref().and_then(SpawnedWorker::gpu));
                if let Some(most) = hello.max_batch {
                    seat.take_at_most(most as usize);
                }
                seat.declares(parts, own);
                Ok((served, seat))
            }
        }
    };
    let (served, seat) = match joined {
        Ok(joined) => {
            if let Some(lost) = &mut lost {
                lost.joined = true;
            }
            joined
        }
        Err(message) => {
            // Counted where it was spawned for, when that is another stage: the one left
            // without its worker.
            let counted = child.as_ref().map_or(stage.name(), SpawnedWorker::stage);
            refuse(&mut outbox, child.as_ref(), &context.stages, Some(counted), &message);
            outbox.close(CLOSE_WRITE_LIMIT).await;
            return;
        }
    };
    let shared = share_memory(&mut outbox, &hello, &context);
    info!(
        stage = stage.name(),
        pid = hello.pid,
        // Escaped, not quoted: a JSON log's `name` is the name, `"Scripted"` had had quotes.
        name = %logged_within(&hello.name, 200),
        workers = stage.workers(),
        "worker connected"
    );
    let ended = if hello.declares(FEATURE_STREAM) {
        streaming::work(&mut inbox, &mut outbox, stage, &seat, &context, &hello, &served).await
    } else {
        let by = Worker { stage: stage.name(), pid: hello.pid, shared, served: &served };
        let cancels = hello.declares(FEATURE_CANCEL);
        work(&mut inbox, &mut outbox, stage, &seat, &context, cancels, &by).await
    };
    drop(seat);
    if !matches!(ended, Ended::Stopped) {
        stage.forget_departed();
    }
    match &ended {
        Ended::Stopped => {
            let message = "proxy shutting down".to_string();
            outbox.send(ProxyMessage::Shutdown(Shutdown { message }));
            // Best effort: the worker may be gone already, or not reading.
            outbox.close(CLOSE_WRITE_LIMIT).await;
        }
        Ended::Failed { reason, .. } => {
            metrics().worker_failures.with_label_values(&[stage.name(), reason.label()]).inc();
            if *reason == WorkerFailure::Hung && context.children.kill(own_pid) {
                warn!(
                    stage = stage.name(),
                    pid = own_pid,
                    name = %logged_within(&hello.name, 200),
                    "killed a hung worker; it will be restarted (unless Corral is stopping)"
                );
            }
        }
        Ended::Closed => {}
    }
    // Named as its connect line names it: among several workers of a stage, the pid alone
    // left the operator to find that line first.
    let name = logged_within(&hello.name, 200);
    if let Ended::Failed { .. } = ended {
        // A worker that broke the protocol, died holding a batch or hung is an operator's
        // problem to see; one that left or was told to is routine.
        let reason = logged(&ended);
        warn!(stage = stage.name(), pid = hello.pid, name = %name, %reason, "worker disconnected");
    } else {
        let reason = logged(&ended);
        info!(stage = stage.name(), pid = hello.pid, name = %name, %reason, "worker disconnected");
    }
}

/// A spawned worker's connection, told to its supervisor as it ends ([`SpawnedWorker::lost`])
/// unless the proxy is shutting down.
struct Lost {
    child: SpawnedWorker,
    /// Counted as one of its connections ([`SpawnedWorker::connected`]).
    joined: bool,
    shutdown: CancellationToken,
}

impl Drop for Lost {
    fn drop(&mut self) {
        if !self.shutdown.is_cancelled() {
            self.child.lost(self.joined);
        }
    }
}

/// Answers a worker that declared `shm` with the `shm` frame, first thing after its hello: the
/// shared memory's read-only descriptor and size, or size 0 where the proxy shares none. Returns
/// the memory that this worker's batches may then point into.
fn share_memory<'a>(
    outbox: &mut Outbox,
    hello: &Hello,
    context: &'a Context,
) -> Option<&'a SharedMemory> {
    if !hello.declares(FEATURE_SHM) {
        return None;
    }
    let memory = context.shared_memory.as_deref();
    let descriptor = memory.and_then(|m| {
        m.for_workers()
            .try_clone_to_owned()
            .inspect_err(|e| warn!(error = %e, "could not pass shared memory to a worker"))
            .ok()
    });
    let size = descriptor.as_ref().and(memory).map_or(0, |m| m.size() as u64);
    outbox.send_with(ProxyMessage::Shm(Shm { size }), descriptor);
    memory.filter(|_| size > 0)
}

/// Why a worker connection ended.
pub(super) enum Ended {
    /// The worker hung up while idle.
    Closed,
    /// The proxy is shutting down.
    Stopped,
    /// The worker broke the protocol, its connection broke while it held a batch (died), or it
    /// held a batch past the limit (hung).
    Failed { reason: WorkerFailure, why: String },
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Closed => f.write_str("connection closed"),
            Ended::Stopped => f.write_str("proxy shutting down"),
            Ended::Failed { why, .. } => f.write_str(why),
        }
    }
}

/// How a broken read ends the connection: a frame that does not decode is the worker breaking
/// the protocol; anything else (reset, closed inside a frame) is the connection dying.
pub(super) fn read_error(e: io::Error) -> Ended {
    match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => protocol_error(e),
        // tokio-util's words for a stream that ended inside a frame.
        _ if e.to_string() == "bytes remaining on stream" => {
            died("connection closed in the middle of a frame".into())
        }
        _ => died(format!("connection broken: {e}")),
    }
}

/// A broken protocol. `why` may quote the worker's words (a decoder's error quotes an unknown
/// `type` or `status`, up to a frame's 64 MiB): kept to a few hundred bytes, since it goes into
/// every orphaned job's 500 and the logs.
pub(super) fn protocol_error(why: impl std::fmt::Display) -> Ended {
    Ended::Failed {
        reason: WorkerFailure::Protocol,
        why: format!("protocol error: {}", logged(&why)),
    }
}

pub(super) fn died(why: String) -> Ended {
    Ended::Failed { reason: WorkerFailure::Died, why }
}

/// A batch queued for the worker and not yet answered.
pub(super) struct InFlight {
    pub jobs: Vec<Job>,
    /// When it was queued for writing: its hung timer counts the write too.
    pub sent: Instant,
    /// Its frame's index in the outbox, to tell whether it ever reached the worker.
    pub frame: u64,
    /// Its span, when tracing is on: ends when the batch is dropped (answered or handed back).
    pub span: Option<opentelemetry_sdk::trace::Span>,
    /// Cancelled once the batch is answered: its jobs' departures are then no cancel to send.
    pub done: CancellationToken,
}

impl InFlight {
    /// A batch sent ahead reaches its turn: the worker is done with the one before it. Its jobs'
    /// batch time counts from now (`server-timing`'s `batch`, as `corral_batch_duration_seconds`
    /// counts it), the wait behind that batch as queueing (`queue`, and the end of the `queue`
    /// span); its span, which began when it was written, gets a `started` event. Counted from the
    /// send, a saturated stage's every answer showed about one batch more as `batch` and almost
    /// no `queue`, blaming the model or the payload for what was queueing.
    fn started(&mut self, at: Instant) {
        for job in &mut self.jobs {
            if let Some(sent) = job.sent {
                job.mark_sent(Sent { at, ..sent });
            }
        }
        if let Some(span) = &mut self.span {
            trace::started(span);
        }
    }
}

/// The pull loop. Returns why it ended; every job it took has been answered or handed back by
/// then.
///
/// A worker holds one batch, plus — only while the stage is saturated (every worker busy and a
/// full batch queued), and if the stage allows it — one more, sent ahead so that it is already in
/// the worker's socket when the worker finishes: the proxy's round trip between two batches is
/// then hidden from a saturated worker. Batches are answered in the order they were sent.
async fn work(
    inbox: &mut Inbox,
    outbox: &mut Outbox,
    stage: &Stage,
    seat: &WorkerSeat<'_>,
    context: &Context,
    cancels: bool,
    by: &Worker<'_>,
) -> Ended {
    let prefetch = stage.settings().prefetch;
    let mut departures = Departures::new(cancels);
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(2);
    // When the worker finished its previous batch: a batch sent ahead starts only then.
    let mut last_done = Instant::now();
    let ended = loop {
        let message = if in_flight.is_empty() {
            match idle(inbox, outbox, seat, context, (false, false)).await {
                Ok(jobs) => {
                    let batch = send(outbox, jobs, by);
                    batch.jobs.iter().for_each(|job| departures.watch(job, &batch.done));
                    in_flight.push_back(batch);
                    continue;
                }
                Err(ended) => break ended,
            }
        } else {
            let front = in_flight.front().expect("a batch is in flight");
            // Nothing is written behind a job that goes alone (it is alone in its batch): if it
            // kills the worker, whatever the worker was sent dies with it, a retry spent.
            let alone = crate::stage::goes_alone(&front.jobs);
            let may_prefetch = prefetch && in_flight.len() < 2 && !alone;
            // From when the worker could start on the batch (one sent ahead: once it was done
            // with the one before).
            let allowance = front.jobs.iter().map(|job| job.allowance).max().unwrap_or_default();
            let (limit, whose) = hung_limit(stage.settings().batch_timeout, allowance);
            let hung_at = front.sent.max(last_done) + limit;
            // Biased, results first: after a long write the results and an expired hung timer
            // can be ready together, and a worker that answered is not hung.
            tokio::select! {
                biased;
                message = inbox.next() => message,
                e = outbox.broken() => break died(format!("could not write to the worker: {e}")),
                _ = context.shutdown.cancelled() => break Ended::Stopped,
                _ = tokio::time::sleep_until(hung_at) => break Ended::Failed {
                    reason: WorkerFailure::Hung,
                    why: format!(
                        "the worker held a batch past its limit of {} ms ({whose})",
                        limit.as_millis()
                    ),
                },
                id = departures.next() => {
                    // The id alone is not enough: a pipeline that lists a stage twice brings
                    // the request back under the same id, and the departure of its first
                    // step's job (answered, its token cancelled when that step ended) may come
                    // only now, while the second step's job is held.
                    let left = |job: &&Job| job.id == id && job.left.is_cancelled();
                    if in_flight.iter().flat_map(|batch| &batch.jobs).any(|job| left(&job)) {
                        outbox.send(ProxyMessage::Cancel(Cancel { ids: vec![id] }));
                    }
                    continue;
                }
                jobs = seat.next_batch_ahead(), if may_prefetch => {
                    metrics().batches_ahead.with_label_values(&[stage.name()]).inc();
                    let batch = send(outbox, jobs, by);
                    batch.jobs.iter().for_each(|job| departures.watch(job, &batch.done));
                    in_flight.push_back(batch);
                    continue;
                }
            }
        };
        match message {
            Some(Ok(WorkerMessage::Results(results))) => {
                let batch = in_flight.pop_front().expect("a batch is in flight");
                batch.done.cancel();
                let size = batch.jobs.len();
                let sent_after = in_flight.front().map_or(&[][..], |ahead| &ahead.jobs[..]);
                match settle::pair(batch.jobs, results, sent_after) {
                    Ok(answers) => {
                        by.served.mark();
                        let now = Instant::now();
                        // Before the answers go out: the clients they release may be back at
                        // once, and the stage counts arrivals after this moment as returns.
                        seat.finished(size, settle::ran(&answers), now - batch.sent.max(last_done));
                        last_done = now;
                        if let Some(ahead) = in_flight.front_mut() {
                            ahead.started(now);
                        }
                        for (job, outcome) in answers {
                            answer_result(job, outcome, now);
                        }
                    }
                    Err((why, jobs)) => {
                        // Put back in front, so that the jobs are handed back oldest first.
                        in_flight.push_front(InFlight { jobs, ..batch });
                        break protocol_error(why);
                    }
                }
            }
            Some(Ok(other)) => {
                break protocol_error(format!("{} while holding a batch", kind_of(&other)))
            }
            Some(Err(e)) => break read_error(e),
            None => break died("connection closed while holding a batch".into()),
        }
    };
    if matches!(ended, Ended::Stopped) {
        // The grace period is over: no retry, the client hears that the proxy is stopping.
        let now = Instant::now();
        for batch in in_flight {
            for job in batch.jobs {
                answer(job, Outcome::ShuttingDown, now);
            }
        }
    } else if !in_flight.is_empty() {
        outbox.halt().await;
        // Oldest first, in one go, so that the retried jobs keep their order at the queue's front.
        let (failure, why) = match &ended {
            Ended::Failed { reason, why } => (Some(*reason), why.as_str()),
            _ => (None, "connection closed while holding a batch"),
        };
        let now = Instant::now();
        let orphans = in_flight
            .into_iter()
            .flat_map(|mut batch| {
                // A worker that hung or died inside a frame had that batch in hand as far as
                // anyone can tell; one whose socket took not a byte of it never saw it.
                let reached = outbox.delivery(batch.frame) != Delivery::None;
                let orphans: Vec<Orphan> =
                    batch.jobs.into_iter().map(|job| Orphan { job, reached }).collect();
                if let Some(span) = &mut batch.span {
                    trace::worker_failed(span, failure, why);
                    // Those that go back to the queue, as `give_back` decides at the same now
                    // (not a job answered 408 meanwhile, nor one out of retries).
                    for orphan in orphans.iter().filter(|orphan| orphan.goes_back(now)) {
                        trace::retried(span, &orphan.job.id.to_string());
                    }
                }
                orphans
            })
            .collect();
        give_back(seat, orphans, &ended.to_string(), now);
    }
    ended
}

/// A worker message's `type`, for error messages.
fn kind_of(message: &WorkerMessage) -> &'static str {
    match message {
        WorkerMessage::Hello(_) => "hello",
        WorkerMessage::Results(_) => "results",
        WorkerMessage::Chunks(_) => "chunks (the worker did not declare stream)",
        WorkerMessage::Pull(_) => "pull (the worker did not declare stream and join)",
    }
}

/// An idle worker's wait for its next batch, noticing meanwhile a worker that goes away (or talks
/// out of turn), a failed write and shutdown, so that a batch goes to a live connection whenever
/// that can be told. Shared by both pull loops. A worker that `joins` may offer room (`pull`)
/// just as its last job ends: the offer lapses (the worker is idle, and gets batches the
/// ordinary way) rather than break the protocol, which would depend on that race. So, for a
/// worker that `streams`, does a sign of life (a `chunks` frame with no chunk) sent as its last
/// job ended.
pub(super) async fn idle(
    inbox: &mut Inbox,
    outbox: &mut Outbox,
    seat: &WorkerSeat<'_>,
    context: &Context,
    (streams, joins): (bool, bool),
) -> Result<Vec<Job>, Ended> {
    let mut next = std::pin::pin!(seat.next_batch());
    loop {
        let message = tokio::select! {
            biased;
            message = inbox.next() => message,
            e = outbox.broken() => return Err(died(format!("could not write to the worker: {e}"))),
            _ = context.shutdown.cancelled() => return Err(Ended::Stopped),
            jobs = &mut next => return Ok(jobs),
        };
        match message {
            None => return Err(Ended::Closed),
            Some(Ok(WorkerMessage::Pull(_))) if joins => {}
            Some(Ok(WorkerMessage::Chunks(chunks))) if streams && chunks.chunks.is_empty() => {}
            // Named, as out of turn while busy is: results twice, a second hello, a chunk for
            // no job had all read alike.
            Some(Ok(WorkerMessage::Chunks(_))) if streams => {
                return Err(protocol_error("message while idle: chunks, holding no job"));
            }
            Some(Ok(other)) => {
                return Err(protocol_error(format!("message while idle: {}", kind_of(&other))))
            }
            Some(Err(e)) => return Err(read_error(e)),
        }
        // A frame that lapses. The select above reads the inbox first, and a worker whose
        // lapsing frames never stop coming (signs of life or offers sent in a loop) kept the
        // other branches from ever being polled (once the task's budget is spent, `select!`
        // polls none, and the inbox first again after): it got no batch while its stage's
        // clients ended 408, and was never told `shutdown`, the proxy's stop waiting on it for
        // good. So they are looked at here too, once a frame.
        if context.shutdown.is_cancelled() {
            return Err(Ended::Stopped);
        }
        if let Some(jobs) = (&mut next).now_or_never() {
            return Ok(jobs);
        }
    }
}

/// Queues a batch for the worker: each job's id, remaining time, payload and, for raw bytes,
/// their media type.
pub(super) fn send(outbox: &mut Outbox, mut jobs: Vec<Job>, by: &Worker) -> InFlight {
    let sent = Instant::now();
    // Counted as sent, whatever becomes of it (a batch whose worker dies counts too).
    metrics().batch_size.with_label_values(&[by.stage]).observe(jobs.len() as f64);
    let span = trace::batch(by.stage, by.pid, &jobs);
    let batch_sent =
        Sent { at: sent, batch_size: jobs.len() as u32, span: span.as_ref().map(trace::ids) };
    for job in &mut jobs {
        job.mark_sent(batch_sent);
    }
    let batch = Batch {
        jobs: jobs
            .iter()
            .map(|job| {
                // Where the payload lies in the shared memory this worker maps, if it lies there
                // in one piece (a body read into a slot, or a v2 row gathered into one).
                let payload_at = match (by.shared, job.payload.segments()) {
                    (Some(memory), [one]) => memory.locate(one),
                    _ => None,
                };
                BatchJob {
                    id: job.id,
                    // Rounded up: 0 would tell the worker the job is already late, and the queue
                    // never dispatches a job that is.
                    timeout_ms: job.remaining(sent).as_micros().div_ceil(1000) as u64,
                    // Shared with the job, not copied: the frame is written from this same
                    // memory — or not at all, where the worker reads it there (`payload_at`).
                    payload: payload_at.map_or_else(|| job.payload.clone(), |_| Payload::default()),
                    // Checked visible ASCII at the edge (`format::media_type`).
                    content_type: job
                        .content_type
                        .as_ref()
                        .and_then(|v| v.to_str().ok())
                        .map(Into::into),
                    traceparent: job.trace().map(trace::traceparent),
                    tracestate: job.trace().and_then(trace::tracestate),
                    payload_at,
                }
            })
            .collect(),
    };
    let frame = outbox.send(ProxyMessage::Batch(batch));
    InFlight { jobs, sent, frame, span, done: CancellationToken::new() }
}

/// The worker a batch goes to, as its span names it, and the shared memory it maps.
pub(super) struct Worker<'a> {
    pub stage: &'a str,
    pub pid: u32,
    pub shared: Option<&'a SharedMemory>,
    /// Marked once the worker answered work (see `supervisor::Served`).
    pub served: &'a Served,
}
