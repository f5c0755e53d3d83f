//! One connected worker: handshake, then "wait for a batch, send it, read its results" until the
//! connection ends.
//!
//! The task owns the jobs of the batch its worker holds, so when the connection breaks or the
//! worker breaks the protocol it knows exactly which jobs to fail: each gets 500, nobody waits for
//! a deadline because of a dead worker. Only this connection is closed; the proxy and the other
//! workers carry on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::{
    Batch, BatchJob, Hello, JobId, ProxyCodec, ProxyMessage, Reject, ResultStatus, Results,
    Shutdown, WorkerMessage, PROTOCOL_VERSION,
};
use futures_util::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::job::{Job, Outcome};
use crate::metrics::metrics;
use crate::stage::{Schemas, Stage, WorkerSeat};
use crate::supervisor::Children;

/// How long a new connection has to say hello before it is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

type Conn = Framed<UnixStream, ProxyCodec>;

/// What a worker connection needs besides its socket.
#[derive(Clone)]
pub struct Context {
    /// The stages a worker may serve, by name: its hello says which.
    pub stages: Arc<HashMap<String, Arc<Stage>>>,
    /// Cancelled when the proxy stops: the worker is told to exit.
    pub shutdown: CancellationToken,
    /// Worker processes this proxy spawned, so that a hung one can be killed and restarted.
    pub children: Children,
}

/// Without `--batch-timeout-ms`, a worker is hung once it holds a batch this long past the
/// batch's latest deadline: by then every client has its 408 and nobody waits for the worker.
const HUNG_MARGIN: Duration = Duration::from_secs(1);

/// Serves one worker connection until it closes, breaks the protocol, or the proxy shuts down.
pub async fn serve(stream: UnixStream, context: Context) {
    let mut conn = Framed::new(stream, ProxyCodec::default());
    let Some((hello, stage)) = handshake(&mut conn, &context.stages).await else {
        return;
    };
    let stage = &stage;
    declare_schemas(stage, &hello);
    context.children.connected(hello.pid);
    let seat = stage.worker_joined();
    info!(
        stage = stage.name(),
        pid = hello.pid,
        name = %hello.name,
        workers = stage.workers(),
        "worker connected"
    );
    let ended = work(&mut conn, stage, &seat, &context).await;
    match &ended {
        Ended::Stopped => {
            let message = "proxy shutting down".to_string();
            // Best effort: the worker may be gone already.
            let _ = conn.send(&ProxyMessage::Shutdown(Shutdown { message })).await;
        }
        Ended::Failed { reason, .. } => {
            metrics().worker_failures.with_label_values(&[stage.name(), reason]).inc();
            if *reason == "hung" && context.children.kill(hello.pid) {
                warn!(pid = hello.pid, "killed a hung worker; it will be restarted");
            }
        }
        Ended::Closed => {}
    }
    info!(stage = stage.name(), pid = hello.pid, reason = %ended, "worker disconnected");
}

/// Keeps the JSON Schemas a worker declared, for `/openapi.json`. Schemas that do not parse are
/// logged and ignored: they are documentation, and must not cost the worker its connection.
fn declare_schemas(stage: &Stage, hello: &Hello) {
    let parse = |text: &Option<String>| -> Option<serde_json::Value> {
        let text = text.as_deref()?;
        serde_json::from_str(text)
            .inspect_err(|e| warn!(pid = hello.pid, error = %e, "ignoring a worker's schema"))
            .ok()
    };
    let (input, output) = (parse(&hello.input_schema), parse(&hello.output_schema));
    if input.is_none() && output.is_none() {
        return;
    }
    let components = match parse(&hello.schema_components) {
        Some(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    stage.declare(Schemas { input, output, components });
}

/// Reads the hello and checks it; refuses (with a `reject` frame) what this proxy cannot serve.
async fn handshake(
    conn: &mut Conn,
    stages: &HashMap<String, Arc<Stage>>,
) -> Option<(Hello, Arc<Stage>)> {
    let first = match tokio::time::timeout(HELLO_TIMEOUT, conn.next()).await {
        Err(_) => {
            warn!("worker connection closed: no hello within {HELLO_TIMEOUT:?}");
            return None;
        }
        Ok(None) => return None,
        Ok(Some(Err(e))) => {
            warn!(error = %e, "worker connection closed: undecodable hello");
            return None;
        }
        Ok(Some(Ok(message))) => message,
    };
    let refusal = match first {
        WorkerMessage::Hello(hello) if hello.version != PROTOCOL_VERSION => format!(
            "protocol version {} is not supported; this proxy speaks version {PROTOCOL_VERSION}",
            hello.version
        ),
        WorkerMessage::Hello(hello) => match stages.get(&hello.stage) {
            Some(stage) => return Some((hello, stage.clone())),
            None => {
                let mut names: Vec<&str> = stages.keys().map(String::as_str).collect();
                names.sort_unstable();
                let names = names.join(", ");
                format!("unknown stage {:?}; this proxy serves: {names}", hello.stage)
            }
        },
        WorkerMessage::Results(_) => "the first message must be a hello".to_string(),
    };
    warn!(reason = %refusal, "worker refused");
    // Not labelled with the stage the worker claimed: a claim must not grow the label set.
    metrics().worker_failures.with_label_values(&["unknown", "refused"]).inc();
    let reject = ProxyMessage::Reject(Reject { message: refusal });
    // The worker may already be gone; the refusal is logged either way.
    let _ = conn.send(&reject).await;
    None
}

/// Why a worker connection ended.
enum Ended {
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

fn protocol_error(why: impl std::fmt::Display) -> Ended {
    Ended::Failed { reason: "protocol", why: format!("protocol error: {why}") }
}

/// A batch sent to the worker and not yet answered.
struct InFlight {
    jobs: Vec<Job>,
    sent: Instant,
}

/// The pull loop. Returns why it ended; every job it took has been answered by then.
///
/// A worker holds one batch, plus — only while the stage is saturated (every worker busy and a
/// full batch queued), and if the stage allows it — one more, sent ahead so that it is already in
/// the worker's socket when the worker finishes: the proxy's round trip between two batches is
/// then hidden from a saturated worker. Batches are answered in the order they were sent.
async fn work(conn: &mut Conn, stage: &Stage, seat: &WorkerSeat<'_>, context: &Context) -> Ended {
    let prefetch = stage.settings().prefetch;
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(2);
    // When the worker finished its previous batch: a batch sent ahead starts only then.
    let mut last_done = Instant::now();
    let ended = loop {
        let message = if in_flight.is_empty() {
            // Idle: wait for a batch, but notice a worker that goes away (or talks out of turn)
            // meanwhile, so no batch is ever sent to a dead connection.
            tokio::select! {
                jobs = seat.next_batch() => {
                    match send(conn, seat, jobs).await {
                        Ok(sent) => in_flight.push_back(sent),
                        Err(ended) => break ended,
                    }
                    continue;
                }
                message = conn.next() => break match message {
                    None => Ended::Closed,
                    Some(Ok(_)) => protocol_error("message while idle"),
                    Some(Err(e)) => protocol_error(e),
                },
                _ = context.shutdown.cancelled() => break Ended::Stopped,
            }
        } else {
            let may_prefetch = prefetch && in_flight.len() < 2;
            let front = in_flight.front().expect("a batch is in flight");
            let hung_at = match stage.settings().batch_timeout {
                Some(limit) => front.sent.max(last_done) + limit,
                None => {
                    front.jobs.iter().map(|job| job.deadline).max().unwrap_or(front.sent)
                        + HUNG_MARGIN
                }
            };
            tokio::select! {
                jobs = seat.next_batch_ahead(), if may_prefetch => {
                    match send(conn, seat, jobs).await {
                        Ok(sent) => in_flight.push_back(sent),
                        Err(ended) => break ended,
                    }
                    continue;
                }
                message = conn.next() => message,
                _ = tokio::time::sleep_until(hung_at) => break Ended::Failed {
                    reason: "hung",
                    why: "the worker held a batch past its limit".into(),
                },
                _ = context.shutdown.cancelled() => break Ended::Stopped,
            }
        };
        let batch = in_flight.pop_front().expect("a batch is in flight");
        let size = batch.jobs.len();
        match message {
            Some(Ok(WorkerMessage::Results(results))) => match pair(batch.jobs, results) {
                Ok(answers) => {
                    let now = Instant::now();
                    // Before the answers go out: the clients they release may be back at once,
                    // and the stage counts arrivals after this moment as returns.
                    seat.finished(size, now - batch.sent.max(last_done));
                    last_done = now;
                    for (job, outcome) in answers {
                        answer(job, outcome, now);
                    }
                }
                Err((why, jobs)) => {
                    let ended = protocol_error(why);
                    give_back(seat, jobs, &ended.to_string());
                    break ended;
                }
            },
            other => {
                let ended = match other {
                    Some(Ok(_)) => protocol_error("hello while holding a batch"),
                    Some(Err(e)) => protocol_error(e),
                    None => Ended::Failed {
                        reason: "died",
                        why: "connection closed while holding a batch".into(),
                    },
                };
                give_back(seat, batch.jobs, &ended.to_string());
                break ended;
            }
        }
    };
    for batch in in_flight {
        if matches!(ended, Ended::Stopped) {
            // The grace period is over: no retry, the client hears that the proxy is stopping.
            let now = Instant::now();
            batch.jobs.into_iter().for_each(|job| answer(job, Outcome::ShuttingDown, now));
        } else {
            give_back(seat, batch.jobs, &ended.to_string());
        }
    }
    ended
}

/// Sends a batch: each job's id, remaining time and payload.
async fn send(conn: &mut Conn, seat: &WorkerSeat<'_>, jobs: Vec<Job>) -> Result<InFlight, Ended> {
    let sent = Instant::now();
    let batch = Batch {
        jobs: jobs
            .iter()
            .map(|job| BatchJob {
                id: job.id,
                // Rounded up: 0 would tell the worker the job is already late, and the queue never
                // dispatches a job that is.
                timeout_ms: job.remaining(sent).as_micros().div_ceil(1000) as u64,
                payload: job.payload.clone(),
            })
            .collect(),
    };
    match conn.send(&ProxyMessage::Batch(batch)).await {
        Ok(()) => Ok(InFlight { jobs, sent }),
        Err(e) => {
            let why = format!("could not send a batch: {e}");
            give_back(seat, jobs, &why);
            Err(Ended::Failed { reason: "died", why })
        }
    }
}

/// Why a results frame cannot be trusted, and every job of its batch, handed back.
type Untrusted = (String, Vec<Job>);

/// Pairs each job of a batch with its outcome. The whole frame is checked before any job is
/// answered: a result for an unknown or repeated id, a missing result, or an `ok` without data
/// hands every job of the batch back to the caller, which closes the connection, since the worker
/// can no longer be trusted.
fn pair(jobs: Vec<Job>, results: Results) -> Result<Vec<(Job, Outcome)>, Untrusted> {
    let mut pending: HashMap<JobId, Job> = jobs.into_iter().map(|job| (job.id, job)).collect();
    let mut answers = Vec::with_capacity(pending.len());
    let mut problem = None;
    for result in results.results {
        let Some(job) = pending.remove(&result.id) else {
            problem = Some(format!("result for unknown or repeated job id {}", result.id));
            break;
        };
        let outcome = match (result.status, result.data) {
            (ResultStatus::Ok, Some(data)) => Outcome::Done(data),
            (ResultStatus::Ok, None) => {
                problem = Some(format!("ok result without data for job {}", job.id));
                answers.push((job, Outcome::WorkerLost(String::new())));
                break;
            }
            (ResultStatus::Invalid, _) => Outcome::Invalid(result.message.unwrap_or_default()),
            (ResultStatus::Error, _) => Outcome::Failed(result.message.unwrap_or_default()),
            (ResultStatus::Expired, _) => Outcome::Expired,
        };
        answers.push((job, outcome));
    }
    if problem.is_none() && !pending.is_empty() {
        problem = Some(format!("{} job(s) of the batch have no result", pending.len()));
    }
    match problem {
        None => Ok(answers),
        Some(why) => {
            let jobs = answers.into_iter().map(|(job, _)| job).chain(pending.into_values());
            Err((why, jobs.collect()))
        }
    }
}

/// Jobs whose worker is gone or untrustworthy: those with a retry left and time before their
/// deadline go back to the front of the queue for the next idle worker; the others are
/// answered 500 (`worker_died`).
fn give_back(seat: &WorkerSeat<'_>, jobs: Vec<Job>, why: &str) {
    let now = Instant::now();
    let mut retry = Vec::new();
    for mut job in jobs {
        if job.retries > 0 && !job.is_expired(now) && !job.is_abandoned() {
            debug!(request_id = %job.id, "job goes back to the queue for another worker");
            job.retries -= 1;
            retry.push(job);
        } else {
            debug!(request_id = %job.id, reason = why, "job failed with its worker");
            answer(job, Outcome::WorkerLost(format!("the worker failed: {why}")), now);
        }
    }
    if !retry.is_empty() {
        metrics().retried.with_label_values(&[seat.stage_name()]).inc_by(retry.len() as u64);
        seat.requeue(retry);
    }
}

/// Answers a job that a worker held. Nobody listening means the client got its 408 already (a
/// late result, dropped) or disconnected (a cancelled job): either is counted.
fn answer(job: Job, outcome: Outcome, now: Instant) {
    let expired = job.is_expired(now);
    if !job.answer(outcome) {
        if expired {
            metrics().late_results.inc();
            metrics().expired.with_label_values(&["worker"]).inc();
        } else {
            metrics().cancelled.with_label_values(&["worker"]).inc();
        }
    }
}
