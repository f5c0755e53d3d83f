//! One connected worker: handshake, then "wait for a batch, send it, read its results" until the
//! connection ends.
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
    Batch, BatchJob, Cancel, DecodeError, Hello, Payload, ProxyCodec, ProxyMessage, Reject, Shm,
    Shutdown, WorkerMessage, FEATURE_CANCEL, FEATURE_SHM, FEATURE_STREAM, PROTOCOL_VERSION,
};
use futures_util::StreamExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::departures::Departures;
use super::outbox::{Delivery, Outbox};
use super::settle::{self, answer, answer_result, give_back, Orphan};
use super::streaming;
use crate::http::protocols::v2::tensor::DataType;
use crate::job::{Job, Outcome, Sent};
use crate::metrics::{metrics, UNKNOWN_STAGE};
use crate::shared_memory::SharedMemory;
use crate::stage::{Declared, Parts, Stage, WeightRule, WorkerSeat};
use crate::supervisor::{Children, Served, SpawnedWorker};
use crate::trace;

/// How long a new connection has to say hello before it is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the closing frame (`shutdown`, `reject`) and anything queued before it get to reach
/// a worker: one that does not read must not hold up the proxy's exit.
const CLOSE_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// The reading half of a worker connection.
pub(super) type Inbox = FramedRead<OwnedReadHalf, ProxyCodec>;

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
                keep(stage, declared, parts);
                let served = child.as_ref().map(SpawnedWorker::connected).unwrap_or_default();
                let seat = stage.worker_joined_on(child.as_ref().and_then(SpawnedWorker::gpu));
                if let Some(most) = hello.max_batch {
                    seat.take_at_most(most as usize);
                }
                seat.declares(parts);
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
        forget_departed(stage);
    }
    match &ended {
        Ended::Stopped => {
            let message = "proxy shutting down".to_string();
            outbox.send(ProxyMessage::Shutdown(Shutdown { message }));
            // Best effort: the worker may be gone already, or not reading.
            outbox.close(CLOSE_WRITE_LIMIT).await;
        }
        Ended::Failed { reason, .. } => {
            metrics().worker_failures.with_label_values(&[stage.name(), reason]).inc();
            if *reason == "hung" && context.children.kill(own_pid) {
                warn!(pid = own_pid, "killed a hung worker; it will be restarted");
            }
        }
        Ended::Closed => {}
    }
    if let Ended::Failed { .. } = ended {
        // A worker that broke the protocol, died holding a batch or hung is an operator's
        // problem to see; one that left or was told to is routine.
        warn!(stage = stage.name(), pid = hello.pid, reason = %logged(&ended), "worker disconnected");
    } else {
        info!(stage = stage.name(), pid = hello.pid, reason = %logged(&ended), "worker disconnected");
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

/// Largest schema (or set of schema components) a hello may declare. Schemas are documentation,
/// each copied into `/openapi.json` where its routes use it: one of 50 MB made that document 209
/// MB and the proxy's memory 1.2 GB. Real ones are kilobytes; one of 4 MiB (10,000 described
/// fields) is served, and tested.
const MAX_SCHEMA_BYTES: usize = 8 * 1024 * 1024;

/// The stage a spawned worker was spawned for, where it said hello for another that Corral
/// spawns workers for too: its `--stage`, `run(stage=...)` or a CORRAL_STAGE of its own. Taken,
/// the stage it was spawned for never got a worker, and every request there waited for its
/// 408. A process a spawned launcher starts for a stage with no `command` is let in, as before.
fn misplaced<'a>(
    child: Option<&'a SpawnedWorker>,
    stage: &Stage,
    spawning: &HashSet<String>,
) -> Option<&'a str> {
    let own = child?.stage();
    (own != stage.name() && spawning.contains(stage.name())).then_some(own)
}

/// Keeps what a worker declared (None: nothing to keep; `parts`, what it holds), as the
/// stage's newest: a part it lacks, that no connected worker declares, goes (its lack of tensors
/// replaces the last ones' as a newcomer's tensors do, `Stage::tensor_conflict`).
fn keep(stage: &Stage, declared: Option<Declared>, parts: Parts) {
    stage.forget_all_but(parts.or(stage.declaring()));
    if let Some(declared) = declared {
        stage.declare(declared);
    }
}

/// After a worker left: where workers are still connected but none declares tensors (or
/// schemas, or a weight rule), what the departed declared goes, as a newcomer declaring none takes it out
/// ([`keep`]). A rolling update starts the new worker before the old one stops: its successor
/// had joined while it was there, and its tensors stayed in force (v2 and KServe v1 requests
/// refused for inputs the workers left no longer take) and its schemas in `/openapi.json`. With
/// no worker left, the next hello decides, as at a restart.
fn forget_departed(stage: &Stage) {
    let _joining = stage.joining();
    if stage.workers() > 0 {
        stage.forget_all_but(stage.declaring());
    }
}

/// Reads the JSON Schemas a worker declared, for `/openapi.json`, its tensors, for v2
/// clients, and its weight rule, for the stage's batches. Schemas that do not parse (or pass [`MAX_SCHEMA_BYTES`]) are logged and ignored: they are documentation, and must
/// not cost the worker its connection.
fn declarations(hello: &Hello) -> Option<Declared> {
    let parse = |text: &Option<String>| -> Option<serde_json::Value> {
        let text = text.as_deref()?;
        if text.len() > MAX_SCHEMA_BYTES {
            let bytes = text.len();
            warn!(pid = hello.pid, bytes, "ignoring a worker's schema larger than 8 MiB");
            return None;
        }
        let schema: serde_json::Value = serde_json::from_str(text)
            .inspect_err(
                |e| warn!(pid = hello.pid, error = %logged(e), "ignoring a worker's schema"),
            )
            .ok()?;
        // A JSON Schema is an object (or `true`/`false`): another value (`5`) copied into the
        // document made all of `/openapi.json` invalid, every route's operations with it.
        if !(schema.is_object() || schema.is_boolean()) {
            warn!(pid = hello.pid, "ignoring a worker's schema that is no JSON object");
            return None;
        }
        Some(schema)
    };
    let (input, output) = (parse(&hello.input_schema), parse(&hello.output_schema));
    let weight = hello.weight.as_deref().and_then(|pointer| WeightRule::parse(pointer).ok());
    let tensors = hello.declares_tensors();
    if input.is_none() && output.is_none() && !tensors && weight.is_none() {
        return None;
    }
    let mut components = match parse(&hello.schema_components) {
        Some(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let before = components.len();
    components.retain(|_, schema| schema.is_object() || schema.is_boolean());
    if components.len() < before {
        warn!(pid = hello.pid, "ignoring a worker's schema components that are no JSON objects");
    }
    let (inputs, outputs) = (hello.inputs.clone(), hello.outputs.clone());
    // Its output schema is a chunk's: only where it declared one.
    let chunks = hello.declares(FEATURE_STREAM) && output.is_some();
    Some(Declared { input, output, components, chunks, inputs, outputs, weight })
}

/// A worker's own words (its tensors' names, the stage it claims) as a refusal shows them: at
/// most 200 bytes, quoted with `{:?}` there, so that a name with a line break cannot forge a log
/// line, and one of megabytes does not write one on every reconnect.
fn clipped(text: &str) -> &str {
    clip(text, 200)
}

/// A reason or error that may carry a worker's words (a decoder's message quotes what it could
/// not read: an unknown `type` or `status`) as a log line or a client's 500 shows it: at most
/// 300 bytes, said so when cut, its control characters shown escaped (`\u{a}`). As it came, a
/// `type` with a line break wrote a line of the worker's choosing into Corral's text log, and
/// one of megabytes a line as long.
fn logged(reason: &impl std::fmt::Display) -> String {
    logged_within(reason, 300)
}

/// [`logged`], at most `max` bytes: a refusal names the connected workers' tensors, of the
/// other worker's choosing.
fn logged_within(reason: &impl std::fmt::Display, max: usize) -> String {
    let text = reason.to_string();
    let cut = clip(&text, max);
    let mut shown = String::with_capacity(cut.len());
    cut.chars().for_each(|c| crate::supervisor::output::push_shown(&mut shown, c));
    if cut.len() < text.len() {
        shown.push_str(&format!("… ({} bytes in all)", text.len()));
    }
    shown
}

/// `text`'s first `max` bytes at most, ending on a character's boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Why a hello's tensor declarations cannot be served, if they cannot: a datatype v2 does not
/// have would turn every v2 request into a 400 naming it; a name declared twice among the
/// inputs (or the outputs) would be listed twice in every answer and in the metadata; a
/// dimension below −1 (−1 is "any length") is no shape.
fn undeclarable(hello: &Hello) -> Option<String> {
    for side in [&hello.inputs, &hello.outputs] {
        let mut names = std::collections::HashSet::new();
        if let Some(twice) = side.iter().find(|spec| !names.insert(spec.name.as_str())) {
            return Some(format!("tensor {:?} is declared twice", clipped(&twice.name)));
        }
    }
    let tensors = hello.inputs.iter().chain(&hello.outputs);
    tensors.into_iter().find_map(|spec| {
        if let Some(dimension) = spec.shape.iter().find(|&&d| d < -1) {
            return Some(format!(
                "tensor {:?}: a dimension is a length or -1 (any), not {dimension}",
                clipped(&spec.name)
            ));
        }
        DataType::parse(&spec.datatype)
            .err()
            .map(|problem| format!("tensor {:?}: {problem}", clipped(&spec.name)))
    })
}

/// Reads the hello and checks it; refuses (with a `reject` frame) what this proxy cannot serve.
/// A connection that has not said hello when the proxy stops is dropped at once. A refused
/// spawned worker (`child`) is refused again at every restart: its stage's `/readyz` says why.
async fn handshake(
    inbox: &mut Inbox,
    outbox: &mut Outbox,
    stages: &HashMap<String, Arc<Stage>>,
    shutdown: &CancellationToken,
    child: Option<&SpawnedWorker>,
) -> Option<(Hello, Arc<Stage>)> {
    let first = tokio::select! {
        first = tokio::time::timeout(HELLO_TIMEOUT, inbox.next()) => first,
        _ = shutdown.cancelled() => return None,
    };
    // A connection that said nothing is no worker refused: a probe of the socket, or a
    // half-open connection, would have counted as one in the failures alerts read.
    let silent = first.is_err();
    let first = match first {
        // Refused, saying why: a worker that said nothing yet may still be reading.
        Err(_) => {
            Err(format!("no hello within {HELLO_TIMEOUT:?}: a worker's first frame is its hello"))
        }
        Ok(None) => return None,
        // A frame that arrived whole but is not a valid message (a hello without `pid`, a
        // version that is not an integer, a frame over the limit): refused, saying why.
        Ok(Some(Err(e)))
            if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput) =>
        {
            // A msgpack map that is no valid hello (a `version` as a string, no `pid`) comes
            // from a worker: its supervisor may kill it if it lives on. Not bytes that are no
            // map, or no frame at all (a wrapper's `echo ping` read as a length of 1.9 GB).
            let decoded = e.get_ref().and_then(|inner| inner.downcast_ref::<DecodeError>());
            if decoded.is_some_and(|d| !matches!(d, DecodeError::NotAMap(_) | DecodeError::Empty)) {
                child.inspect(|child| child.spoke());
            }
            Err(format!(
                "malformed hello: {e}; a hello needs `type` \"hello\", `version` (an integer), \
                 `stage` (a string) and `pid` (an integer)"
            ))
        }
        // The connection broke inside the first frame: nobody is there to tell.
        Ok(Some(Err(e))) => {
            warn!(error = %logged(&e), "worker connection closed before its hello");
            return None;
        }
        Ok(Some(Ok(message))) => {
            // A worker, refused or not: its supervisor may kill it if it then lives on without
            // a connection. Not for a frame that is no message (a wrapper's probe writing a
            // line to the socket, `echo ok | nc -U`, would have its loading worker killed).
            child.inspect(|child| child.spoke());
            Ok(message)
        }
    };
    // The parser's own reason: "must start with /" had been said of "/a~2".
    let bad_weight = match &first {
        Ok(WorkerMessage::Hello(hello)) => {
            hello.weight.as_deref().and_then(|w| WeightRule::parse(w).err())
        }
        _ => None,
    };
    let refusal = match first {
        Err(malformed) => malformed,
        Ok(WorkerMessage::Hello(hello)) if hello.version != PROTOCOL_VERSION => format!(
            "protocol version {} is not supported; this proxy speaks version {PROTOCOL_VERSION}",
            hello.version
        ),
        Ok(WorkerMessage::Hello(_)) if bad_weight.is_some() => bad_weight.unwrap_or_default(),
        Ok(WorkerMessage::Hello(hello)) if hello.max_batch == Some(0) => {
            "max_batch 0 would take no job: it is at least 1 (leave it out for no bound)".into()
        }
        Ok(WorkerMessage::Hello(hello)) => match (undeclarable(&hello), stages.get(&hello.stage)) {
            (Some(why), _) => why,
            (None, Some(stage)) => return Some((hello, stage.clone())),
            (None, None) => {
                let mut names: Vec<&str> = stages.keys().map(String::as_str).collect();
                names.sort_unstable();
                let names = names.join(", ");
                format!("unknown stage {:?}; this proxy serves: {names}", clipped(&hello.stage))
            }
        },
        Ok(_) => "the first message must be a hello".to_string(),
    };
    // Not labelled with the stage the worker claimed, which must not grow the label set: a
    // spawned worker's under the stage it was spawned for (the one left without it), as a
    // refusal after the hello counts it.
    let own = child.map(SpawnedWorker::stage).filter(|stage| stages.contains_key(*stage));
    let counted = (!silent).then(|| own.unwrap_or(UNKNOWN_STAGE));
    refuse(outbox, child, stages, counted, &refusal);
    None
}

/// A worker refused at its hello, for `why`: logged, counted under `counted` (None: not
/// counted), and told (it may already be gone; the log has it either way). A spawned worker is
/// refused again at every restart, so its stage's `/readyz` says why as well (an external
/// worker's refusal is the log's alone: its stage is whatever it claimed). `why` is escaped and
/// cut first, shorter in the log: it may carry the worker's own words (its stage's or its
/// tensors' names), and a name with a line break had forged a log line, one of megabytes
/// written a line as long.
fn refuse(
    outbox: &mut Outbox,
    child: Option<&SpawnedWorker>,
    stages: &HashMap<String, Arc<Stage>>,
    counted: Option<&str>,
    why: &str,
) {
    let message = logged_within(&why, 2_000);
    if let Some(own) = child.and_then(|child| stages.get(child.stage())) {
        own.worker_refused(&message);
    }
    if let Some(counted) = counted {
        metrics().worker_failures.with_label_values(&[counted, "refused"]).inc();
    }
    // Logged once `/readyz` and the metric say so: a reader of the line (a test, an operator)
    // had found `/readyz` not knowing it yet.
    warn!(reason = %logged(&why), "worker refused");
    outbox.send(ProxyMessage::Reject(Reject { message }));
}

/// Why a worker connection ended.
pub(super) enum Ended {
    /// The worker hung up while idle.
    Closed,
    /// The proxy is shutting down.
    Stopped,
    /// The worker broke the protocol (`reason` = "protocol"), its connection broke while it
    /// held a batch ("died"), or it held a batch past the limit ("hung").
    Failed { reason: &'static str, why: String },
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
        _ => died(format!("connection broken: {e}")),
    }
}

/// A broken protocol. `why` may quote the worker's words (a decoder's error quotes an unknown
/// `type` or `status`, up to a frame's 64 MiB): kept to a few hundred bytes, since it goes into
/// every orphaned job's 500 and the logs.
pub(super) fn protocol_error(why: impl std::fmt::Display) -> Ended {
    Ended::Failed { reason: "protocol", why: format!("protocol error: {}", logged(&why)) }
}

pub(super) fn died(why: String) -> Ended {
    Ended::Failed { reason: "died", why }
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
            let hung_at = match stage.settings().batch_timeout {
                Some(limit) => front.sent.max(last_done) + limit,
                // From when the worker could start on the batch (one sent ahead: once it was
                // done with the one before), for as long as the jobs' routes allow.
                None => {
                    let allowance = front.jobs.iter().map(|job| job.allowance).max();
                    front.sent.max(last_done) + allowance.unwrap_or_default() + HUNG_MARGIN
                }
            };
            // Biased, results first: after a long write the results and an expired hung timer
            // can be ready together, and a worker that answered is not hung.
            tokio::select! {
                biased;
                message = inbox.next() => message,
                e = outbox.broken() => break died(format!("could not write to the worker: {e}")),
                _ = context.shutdown.cancelled() => break Ended::Stopped,
                _ = tokio::time::sleep_until(hung_at) => break Ended::Failed {
                    reason: "hung",
                    why: "the worker held a batch past its limit".into(),
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
                let (size, weight) = (batch.jobs.len(), crate::stage::weight_of(&batch.jobs));
                let sent_after = in_flight.front().map_or(&[][..], |ahead| &ahead.jobs[..]);
                match settle::pair(batch.jobs, results, sent_after) {
                    Ok(answers) => {
                        by.served.mark();
                        let now = Instant::now();
                        // Before the answers go out: the clients they release may be back at
                        // once, and the stage counts arrivals after this moment as returns.
                        seat.finished(size, weight, now - batch.sent.max(last_done));
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
        let (reason, why) = match &ended {
            Ended::Failed { reason, why } => (*reason, why.as_str()),
            _ => ("closed", "connection closed while holding a batch"),
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
                    trace::worker_failed(span, reason, why);
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
        return tokio::select! {
            biased;
            message = inbox.next() => Err(match message {
                None => Ended::Closed,
                Some(Ok(WorkerMessage::Pull(_))) if joins => continue,
                Some(Ok(WorkerMessage::Chunks(chunks))) if streams && chunks.chunks.is_empty() => {
                    continue
                }
                Some(Ok(_)) => protocol_error("message while idle"),
                Some(Err(e)) => read_error(e),
            }),
            e = outbox.broken() => Err(died(format!("could not write to the worker: {e}"))),
            _ = context.shutdown.cancelled() => Err(Ended::Stopped),
            jobs = &mut next => Ok(jobs),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_silent_past_the_hello_timeout_is_told_why() {
        // It was closed without a word: the worker saw a bare end of file.
        let (proxy_end, worker_end) = UnixStream::pair().unwrap();
        let (read, write) = proxy_end.into_split();
        let mut inbox = FramedRead::new(read, ProxyCodec::default());
        let mut outbox = Outbox::new(write);
        let (stages, shutdown) = (HashMap::new(), CancellationToken::new());
        let refused =
            || metrics().worker_failures.with_label_values(&[UNKNOWN_STAGE, "refused"]).get();
        let before = refused();
        assert!(handshake(&mut inbox, &mut outbox, &stages, &shutdown, None).await.is_none());
        // Nor is it counted as a worker refused (OBSERVABILITY.md): a probe of the socket is
        // no worker, and the failures' alerts read that count.
        assert_eq!(refused(), before);
        outbox.close(CLOSE_WRITE_LIMIT).await;
        let mut heard = FramedRead::new(worker_end, corral_protocol::WorkerCodec::default());
        match heard.next().await {
            Some(Ok(ProxyMessage::Reject(reject))) => {
                assert!(reject.message.starts_with("no hello within 10s"), "{}", reject.message)
            }
            other => panic!("expected a reject, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_malformed_hello_is_a_worker_speaking_and_junk_is_not() {
        // A spawned worker refused for a `version` that is a string lives on: its supervisor
        // must count it as one that spoke (and kill it); a wrapper's `ping` must not be.
        for (frame, spoke) in [
            (
                rmp_serde::to_vec_named(&serde_json::json!({
                    "type": "hello", "version": "1", "stage": "default", "pid": 7,
                }))
                .unwrap(),
                true,
            ),
            (b"ping".to_vec(), false),
        ] {
            let (proxy_end, worker_end) = UnixStream::pair().unwrap();
            let (read, write) = proxy_end.into_split();
            let mut inbox = FramedRead::new(read, ProxyCodec::untrusted());
            let mut outbox = Outbox::new(write);
            let (stages, shutdown) = (HashMap::new(), CancellationToken::new());
            let child = SpawnedWorker::default();
            let mut sent = worker_end;
            let framed = if spoke {
                [&(frame.len() as u32).to_be_bytes()[..], &frame].concat()
            } else {
                frame // read as the length of a frame of 1.9 GB
            };
            tokio::io::AsyncWriteExt::write_all(&mut sent, &framed).await.unwrap();
            let heard = handshake(&mut inbox, &mut outbox, &stages, &shutdown, Some(&child)).await;
            assert!(heard.is_none(), "refused");
            assert_eq!(child.has_spoken(), spoke, "{framed:?}");
        }
    }

    #[test]
    fn a_departed_worker_s_weight_rule_leaves_with_it() {
        // Its successor joined first (a rolling update) and declares none: every job had gone
        // on being weighed by the departed worker's rule (its `/n`: items batched one by one).
        use crate::stage::{BatchSettings, Policy};
        let settings = BatchSettings {
            max_batch_size: 8,
            max_wait: Duration::ZERO,
            max_batch_bytes: 1 << 20,
            max_job_bytes: 1 << 20,
            max_batch_weight: Some(10),
            policy: Policy::Fixed,
            prefetch: false,
            batch_timeout: None,
        };
        let stage = Stage::new("default", settings, 100);
        let rule = WeightRule::parse("/n").unwrap();
        let declared = Declared { weight: Some(rule), ..Declared::default() };
        let parts = Parts::of(Some(&declared));
        keep(&stage, Some(declared), parts);
        let weighted = stage.worker_joined();
        weighted.declares(parts);
        keep(&stage, None, Parts::default());
        let _plain = stage.worker_joined();
        assert!(stage.declared().unwrap().weight.is_some(), "kept while its worker is there");
        drop(weighted);
        forget_departed(&stage);
        assert!(stage.declared().unwrap().weight.is_none());
    }
}
