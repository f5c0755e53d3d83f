//! The pull loop for a worker that declared `stream` (PROTOCOL.md, "Streams, cancellation and
//! joining"): the streamed answer path beside the one-shot one in [`super::connection`], sharing
//! its jobs, its queue and its connection.
//!
//! Such a worker holds a set of jobs rather than a queue of batches: it sends `chunks` for any of
//! them, ends any subset with a `results` frame, and, with `join`, offers room for more (`pull`)
//! while it holds some. Each chunk goes to its job's client at once (or is gathered into one
//! answer for a client that did not ask for a stream). The worker is idle when it holds nothing;
//! only then does it get a batch the ordinary way. Its hung clock counts from its last frame, so a
//! worker that streams steadily is not declared hung, unless it holds a job well past that job's
//! stream timeout: at the timeout the worker is told to stop it (`cancel`), whether or not its
//! client is still reading, and a second past its allowance after that it is hung.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use corral_protocol::{
    Cancel, Chunks, Hello, JobId, Payload, ProxyMessage, ResultStatus, Results, WorkerMessage,
    FEATURE_CANCEL, FEATURE_JOIN, MAX_FRAME_BYTES,
};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::connection::{
    died, hung_limit, idle, protocol_error, read_error, send, Context, Ended, Worker, HUNG_MARGIN,
};
use super::departures::Departures;
use super::outbox::{Delivery, Outbox};
use super::settle::{answer, answer_result, give_back, output, reason, Orphan};
use super::Inbox;
use crate::job::{Job, Outcome};
use crate::metrics::{metrics, WorkerFailure};
use crate::msgpack;
use crate::stage::{Stage, WorkerSeat};
use crate::stream::Refused;
use crate::supervisor::Served;
use crate::trace;

/// Longer than any stream a clock here counts to: further is as good as never, and kept from
/// the end of the clock's range.
const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// Why a worker holding a job past its stream timeout (and the allowance past it, [`Overdue`])
/// is hung.
fn overdue_why(stream_timeout: Duration, overdue: &Overdue) -> String {
    format!(
        "the streaming worker held a job past its stream timeout of {} ms by more than {} ms",
        stream_timeout.min(YEAR).as_millis(),
        overdue.past.as_millis()
    )
}

/// When the earliest held job is overdue ([`Held::overdue`]), and how long past its stream
/// timeout that is (said in the reason: it differs from job to job with their routes).
#[derive(Clone, Copy)]
struct Overdue {
    at: Instant,
    past: Duration,
}

/// The clocks of [`State::clocks`].
struct Clocks {
    silence: Duration,
    overdue: Option<Overdue>,
    stream_end: Option<Instant>,
}

/// A job the worker holds.
struct Held {
    /// None once the job was answered early (its client fell behind): what the worker still
    /// sends for it is dropped.
    job: Option<Job>,
    /// Its batch's frame in the outbox, to tell whether it ever reached the worker.
    frame: u64,
    /// Order of arrival, so that a failed worker's jobs go back oldest first.
    seq: u64,
    /// Chunks gathered for a client that asked for one answer.
    gathered: Gathered,
    /// Whether a chunk of it went to its streaming client: from then on it is never retried
    /// elsewhere (the client has seen part of an answer). Chunks gathered for a one-shot client
    /// do not count: that client has seen nothing.
    streamed: bool,
    /// How long its worker may stay silent, as its route allows (kept here because the job
    /// itself may be answered early).
    silence: Duration,
    /// When the worker is hung if it still holds the job, however lively: its stream timeout
    /// from its arrival, plus its silence allowance (or `--batch-timeout-ms`, if longer) and the
    /// margin to end it ([`State::clocks`]); `past` is what comes after the stream timeout.
    overdue: Overdue,
    /// The worker was told to stop it (`cancel`): once is enough. A bad chunk's cancel was
    /// followed by a second one when its client's answer ended before the worker's `end` came.
    cancelled: bool,
}

/// A batch waiting for its first chunk or result: what the cost model learns for a streaming
/// stage is the time to first chunk.
struct Pending {
    sent: Instant,
    weight: usize,
    /// Its jobs: the batch's size in the statistics.
    size: usize,
    /// The batch's span, when tracing is on: a streaming batch's ends at its first chunk (or, if
    /// its worker fails first, with the failure and its jobs' retries noted on it, as a plain
    /// batch's are).
    span: Option<opentelemetry_sdk::trace::Span>,
}

/// Serves a streaming worker until its connection ends; every job it took has been answered or
/// handed back by then.
pub(super) async fn work(
    inbox: &mut Inbox,
    outbox: &mut Outbox,
    stage: &Stage,
    seat: &WorkerSeat<'_>,
    context: &Context,
    hello: &Hello,
    served: &Served,
) -> Ended {
    // No payload of a streaming worker's points into shared memory: a job may be answered
    // (a slow client's) while the worker still holds it, and its slot must not be taken again
    // before the worker has read it.
    let by = Worker { stage: stage.name(), pid: hello.pid, shared: None, served };
    let mut state = State {
        held: HashMap::new(),
        busy: None,
        joins: hello.declares(FEATURE_JOIN),
        first: HashMap::new(),
        seq: 0,
        departures: Departures::new(hello.declares(FEATURE_CANCEL)),
        cancels: hello.declares(FEATURE_CANCEL),
        stream_timeout: stage.stream_timeout(),
        batch_timeout: stage.settings().batch_timeout,
        alone: false,
    };
    let joins = hello.declares(FEATURE_JOIN);
    // Room the worker offered for more jobs (`pull`), while it holds some.
    let mut offer: Option<usize> = None;
    // When the worker last sent a frame, or was given work while idle: its hung clock.
    let mut heard = Instant::now();
    let ended = loop {
        let message = if state.held.is_empty() {
            match idle(inbox, outbox, seat, context, (true, joins)).await {
                Ok(jobs) => {
                    heard = Instant::now();
                    state.hold(outbox, jobs, &by);
                    continue;
                }
                Err(ended) => break ended,
            }
        } else {
            // One pass over the held jobs per frame, for all three clocks.
            let clocks = state.clocks();
            let (silence, whose) = hung_limit(stage.settings().batch_timeout, clocks.silence);
            let silent_at = heard + silence;
            // Why, if the timer fires: said then (the limit in it differs from frame to frame).
            let stream_timeout = state.stream_timeout;
            let overdue_first = clocks.overdue.filter(|overdue| overdue.at < silent_at);
            let hung_at = overdue_first.map_or(silent_at, |overdue| overdue.at);
            let why = || match overdue_first {
                Some(overdue) => overdue_why(stream_timeout, &overdue),
                None => format!(
                    "the streaming worker sent nothing past its limit of {} ms ({whose})",
                    silence.as_millis()
                ),
            };
            // One timer: the earlier of the hung limit and the next stream's timeout.
            let stream_end = clocks.stream_end.filter(|&end| end < hung_at);
            // The select below reads the inbox before its timers: a worker whose frames never
            // stop coming would keep them from firing there. They are looked at here too, once
            // a frame.
            let now = Instant::now();
            if let Some(overdue) = clocks.overdue.filter(|overdue| now >= overdue.at) {
                let why = overdue_why(stream_timeout, &overdue);
                break Ended::Failed { reason: WorkerFailure::Hung, why };
            }
            if stream_end.is_some_and(|end| now >= end) {
                state.end_streams(now);
            }
            // So is the proxy's stop, for the same reason.
            if context.shutdown.is_cancelled() {
                break Ended::Stopped;
            }
            let (all_written, wrote) = (outbox.all_written(), outbox.wrote());
            tokio::select! {
                biased;
                // Departures and joins before the inbox: each completes once per event (a job
                // leaving, an offer of room), so neither can keep the inbox waiting, while a
                // worker whose frames never stop coming kept them from ever being polled. The
                // streams it ended at their timeout were never cancelled, and the worker streamed
                // on until it was killed as overdue (one run in five of
                // `test_a_stream_timeout_ends_a_stream_whose_client_is_always_behind`).
                id = state.departures.next() => {
                    state.cancel(outbox, id);
                    continue;
                }
                // Nothing joins a job that goes alone ([`Job::alone`]). A `pull` is answered only
                // once the worker has read what it was sent before: a worker that kept pulling
                // and never read its socket took the queue, job after job, into frames waiting
                // to be written (its clients ended 408 beside an idle worker, and their payloads
                // stayed held until its stream timeout, 200 MB of them in a probe).
                jobs = seat.next_join(offer.unwrap_or(0)),
                    if offer.is_some() && !state.alone && all_written =>
                {
                    offer = None;
                    state.hold(outbox, jobs, &by);
                    continue;
                }
                () = wrote, if offer.is_some() && !all_written => continue,
                // The inbox before a failed write: a worker that sent its last results and
                // exited while a cancel was being written to it has those results read and
                // used. (Under a flood of frames a failed write is noticed by the hung clock.)
                message = inbox.next() => message,
                e = outbox.broken() => break died(format!("could not write to the worker: {e}")),
                _ = context.shutdown.cancelled() => break Ended::Stopped,
                _ = tokio::time::sleep_until(stream_end.unwrap_or(hung_at)) => {
                    if stream_end.is_none() {
                        break Ended::Failed { reason: WorkerFailure::Hung, why: why() };
                    }
                    state.end_streams(Instant::now());
                    continue;
                }
            }
        };
        heard = Instant::now();
        let outcome = match message {
            Some(Ok(WorkerMessage::Chunks(chunks))) => state.chunks(outbox, seat, chunks),
            Some(Ok(WorkerMessage::Results(results))) => state.results(seat, results),
            Some(Ok(WorkerMessage::Pull(pull))) if joins => {
                offer = (pull.max > 0).then_some(pull.max as usize);
                Ok(())
            }
            Some(Ok(WorkerMessage::Pull(_))) => Err(protocol_error("pull without join")),
            Some(Ok(WorkerMessage::Hello(_))) => Err(protocol_error("hello while holding jobs")),
            Some(Err(e)) => Err(read_error(e)),
            None => Err(died("connection closed while holding jobs".into())),
        };
        if let Err(ended) = outcome {
            break ended;
        }
        if state.held.is_empty() {
            by.served.mark(); // every job it held has ended, answered by it
            offer = None;
            state.alone = false;
            if let Some((since, size, weight)) = state.busy.take() {
                seat.released(size, weight, since.elapsed(), joins);
            }
        }
    };
    if !matches!(ended, Ended::Stopped) {
        outbox.halt().await;
    }
    state.settle(outbox, seat, &ended);
    ended
}

struct State {
    held: HashMap<JobId, Held>,
    /// Since when the worker holds jobs, and how many it took in that time (and their weight).
    busy: Option<(Instant, usize, usize)>,
    joins: bool,
    first: HashMap<u64, Pending>,
    seq: u64,
    departures: Departures,
    cancels: bool,
    /// The stage's stream timeout: no job is the worker's for longer ([`Held::overdue`]).
    stream_timeout: Duration,
    /// The stage's `--batch-timeout-ms`, which lengthens what a job may take past it.
    batch_timeout: Option<Duration>,
    /// Whether a job that goes alone ([`Job::alone`]) is among those held since the worker was
    /// last idle: no job joins it.
    alone: bool,
}

impl State {
    /// Sends a batch (to an idle worker, or joining the jobs it holds) and holds its jobs.
    fn hold(&mut self, outbox: &mut Outbox, jobs: Vec<Job>, by: &Worker) {
        let weight = crate::stage::weight_of(&jobs);
        self.alone |= jobs.iter().any(|job| job.alone);
        let mut sent = send(outbox, jobs, by);
        let (since, size, held) = self.busy.unwrap_or((sent.sent, 0, 0));
        self.busy = Some((since, size + sent.jobs.len(), held + weight));
        let size = sent.jobs.len();
        let pending = Pending { sent: sent.sent, weight, size, span: sent.span.take() };
        self.first.insert(sent.frame, pending);
        // The batch's `done` is never cancelled here: a stream ends job by job, and each
        // departure is looked up by its job's id.
        let done = sent.done.clone();
        for job in sent.jobs {
            self.departures.watch(&job, &done);
            self.seq += 1;
            // As long as its route allows a worker (`Job::allowance`): a client's short deadline
            // bounds its first chunk, not how long the worker may pause mid-stream (a 300 ms
            // header got a worker pausing 1.5 s after its first chunk killed), and neither does
            // the time the job spent queued.
            let silence = job.allowance;
            let allowance = self.batch_timeout.map_or(silence, |limit| limit.max(silence));
            let past = allowance.saturating_add(HUNG_MARGIN);
            // (A stream timeout of years is as good as none, and kept from the clock's end.)
            let at = job.arrived + self.stream_timeout.saturating_add(past).min(YEAR);
            let overdue = Overdue { at, past };
            let held = Held {
                job: Some(job),
                frame: sent.frame,
                seq: self.seq,
                gathered: Gathered::default(),
                streamed: false,
                silence,
                overdue,
                cancelled: false,
            };
            self.held.insert(held.job.as_ref().expect("just held").id, held);
        }
    }

    /// The worker's clocks as the jobs it holds set them, in one pass over them:
    ///
    /// - `silence`: how long the worker may send nothing (without `--batch-timeout-ms`), the
    ///   longest its jobs' routes allow a worker. A worker that streams steadily is not hung for
    ///   its pace; one that freezes is found within about a job's time to first chunk, whether
    ///   or not its streams started or were answered early.
    /// - `overdue`: when the earliest held job is overdue ([`Held::overdue`]). Past its stream
    ///   timeout its client has had its answer, and a worker that still holds it (one that does
    ///   not listen for `cancel`, or ignores it) kept its seat for ever, however often it sent a
    ///   sign of life, which resets the silence clock: no batch again, nothing logged.
    /// - `stream_end`: when the earliest stream still going runs out of its stream timeout
    ///   ([`State::ends`]). The answer notices that only when its client takes the next event;
    ///   a client that stalls (a full window) left the worker streaming on, uncancelled, until
    ///   it was found overdue and killed.
    fn clocks(&self) -> Clocks {
        let mut clocks = Clocks { silence: Duration::ZERO, overdue: None, stream_end: None };
        for held in self.held.values() {
            clocks.silence = clocks.silence.max(held.silence);
            let earlier = clocks.overdue.filter(|overdue| overdue.at <= held.overdue.at);
            clocks.overdue = Some(earlier.unwrap_or(held.overdue));
            let going = held.job.as_ref().filter(|job| job.stream.is_some());
            if let Some(job) = going.filter(|job| !job.left.is_cancelled()) {
                let end = self.ends(job);
                clocks.stream_end = Some(clocks.stream_end.map_or(end, |at| at.min(end)));
            }
        }
        clocks
    }

    /// When a streamed job's stream timeout runs out: from its arrival at this stage, at or
    /// after the answer's own clock.
    fn ends(&self, job: &Job) -> Instant {
        job.arrived + self.stream_timeout.min(YEAR)
    }

    /// Ends, for the worker, the streams whose time is out at `now`: as if their clients had
    /// left (the departures then tell a worker that listens). Their clients still get the
    /// stream timeout's error event when they next read.
    fn end_streams(&self, now: Instant) {
        for job in self.held.values().filter_map(|held| held.job.as_ref()) {
            if job.stream.is_some() && self.ends(job) <= now {
                job.left.cancel();
            }
        }
    }

    /// Tells the worker (if it listens) that nobody waits for `id` any more. (The answer's side
    /// counts why a stream ended early; the connection only for a slow client.)
    fn cancel(&mut self, outbox: &mut Outbox, id: JobId) {
        let Some(held) = self.held.get_mut(&id) else { return };
        // A job still waited for is not told, whatever came under its id: a pipeline that lists
        // a stage twice brings the request back under the same id, and the departure of its
        // first step's job may come only while the second step's is held.
        let waited = held.job.as_ref().is_some_and(|job| !job.left.is_cancelled());
        // Nobody will have this job's answer, nor is it ever sent again (no retry for a job
        // whose client left or whose deadline passed): its payload goes now, not when the
        // worker ends the job. A joining worker that pulls and never ends a job held every
        // payload until it was found overdue, minutes on (960 of 256 KiB, 248 MiB).
        let gone = |job: &Job| job.is_abandoned() || job.is_expired(Instant::now());
        if let Some(job) = held.job.as_mut().filter(|job| !waited && gone(job)) {
            job.payload = Payload::default();
            held.gathered = Gathered::default();
        }
        if self.cancels && !held.cancelled && !waited {
            held.cancelled = true;
            outbox.send(ProxyMessage::Cancel(Cancel { ids: vec![id] }));
        }
    }

    /// The first chunk or result of a batch (`frame`, of those waiting for theirs in `first`):
    /// the stage learns its time to first chunk. Over the fields it reads, so that a caller
    /// holding one of `held`'s entries need not look it up again.
    fn heard_from(
        first: &mut HashMap<u64, Pending>,
        joins: bool,
        seat: &WorkerSeat<'_>,
        frame: u64,
    ) {
        if let Some(pending) = first.remove(&frame) {
            seat.first_chunk(pending.weight, pending.size, pending.sent.elapsed(), joins);
        }
    }

    fn chunks(
        &mut self,
        outbox: &mut Outbox,
        seat: &WorkerSeat<'_>,
        chunks: Chunks,
    ) -> Result<(), Ended> {
        // The whole frame is checked before any chunk is used: none of a frame that breaks a
        // rule is.
        // Named by its place in the frame, not its job's id, which is its own client's: the
        // message reaches every client the worker held.
        if let Some(index) =
            chunks.chunks.iter().position(|chunk| !self.held.contains_key(&chunk.id))
        {
            return Err(protocol_error(format!(
                "the chunk at index {index} of the frame is for a job not held"
            )));
        }
        let mut slow = Vec::new();
        let mut broken = Vec::new();
        let mut late = Vec::new();
        let now = Instant::now();
        for chunk in chunks.chunks {
            // Its batch's first chunk came now, whatever becomes of it: a broken one, or one for
            // a job answered already, had been skipped here, and the batch's time to first
            // chunk taken at its `end` (a whole stream's time, learnt by admission).
            let held = self.held.get_mut(&chunk.id).expect("checked above");
            Self::heard_from(&mut self.first, self.joins, seat, held.frame);
            let Some(job) = held.job.as_ref() else { continue };
            // Checked as an `ok` result's data is: a chunk that is not one well-formed msgpack
            // value fails its job alone, rather than reach the client as a broken answer.
            if let Err(e) = msgpack::check(&chunk.data) {
                let why = format!("a chunk of the worker's output is not one msgpack value: {e}");
                let job = held.job.take().expect("checked above");
                answer(job, Outcome::BadOutput(why), Instant::now());
                broken.push(chunk.id);
                continue;
            }
            match &job.stream {
                // A first chunk at or past the job's deadline opens no stream: its client gets
                // the 408 its deadline says and the worker is told to stop, as for a result that
                // late (`settle::answer_result`), whether or not the client's timer has fired
                // yet (a chunk a millisecond late had opened a 200 stream before the timer's).
                Some(sink) if !sink.started() && job.is_expired(now) => {
                    let job = held.job.take().expect("checked above");
                    answer(job, Outcome::Expired, now);
                    metrics().late_results.inc();
                    late.push(chunk.id);
                }
                // Ended for the worker at its stream timeout (`end_streams`): its client gets the
                // timeout's error event next, nothing more (pushed, a stalled client's buffer
                // could fill and count it `slow_client` as well as `deadline`).
                Some(_) if job.left.is_cancelled() => {}
                Some(sink) => match sink.push(chunk.data) {
                    // Streamed once a chunk reached its client, not when one came for a client
                    // that had left: its cancel's acknowledgement then counted as a late result.
                    Ok(()) => {
                        held.streamed = true;
                        metrics().chunks_sent.with_label_values(&[seat.stage_name()]).inc();
                    }
                    // Answered at once, not after the frame: a later, smaller chunk of the same
                    // job in this frame would fit the buffer and reach the client past the gap.
                    Err(Refused::SlowClient) => {
                        let job = held.job.take().expect("checked above");
                        answer(job, Outcome::SlowClient, Instant::now());
                        metrics().stream_cut(crate::metrics::StreamCut::SlowClient).inc();
                        slow.push(chunk.id);
                    }
                    // The client left: its `left` token tells the worker.
                    Err(Refused::Gone) => {}
                },
                // A one-shot client that left, or has its 408: nobody will have these chunks.
                // Gathered all the same, a worker that does not listen for `cancel` had the
                // proxy hold up to 64 MiB a job for nobody (1.3 GB for a batch of 16).
                None if job.left.is_cancelled() || job.is_expired(now) => {
                    held.gathered = Gathered::default();
                }
                None => {
                    if held.gathered.push(&chunk.data) {
                        // The stage's output as well: the rate of this counter is its
                        // throughput (tokens a second), whoever asked for a stream.
                        metrics().chunks_sent.with_label_values(&[seat.stage_name()]).inc();
                    } else {
                        // Not kept until the worker ends the job: it would pass 64 MiB.
                        held.gathered = Gathered::default();
                        let job = held.job.take().expect("checked above");
                        answer(job, Outcome::Failed(TOO_LARGE.into()), Instant::now());
                    }
                }
            }
        }
        for id in slow.into_iter().chain(broken).chain(late) {
            self.cancel(outbox, id);
        }
        Ok(())
    }

    fn results(&mut self, seat: &WorkerSeat<'_>, results: Results) -> Result<(), Ended> {
        // The whole frame is checked before any result is used, as for a plain worker: a frame
        // that breaks a rule closes the connection, and its jobs are retried or answered 500
        // with the others the worker held.
        let mut seen = HashSet::with_capacity(results.results.len());
        for (index, result) in results.results.iter().enumerate() {
            let what = match self.held.get(&result.id) {
                None => "is for a job not held",
                Some(_) if !seen.insert(result.id) => "answers a job answered before in the frame",
                // (Any status answers a cancel, an `ok` without data too.)
                Some(held)
                    if result.status == ResultStatus::Ok
                        && result.data.is_none()
                        && !held.cancelled =>
                {
                    "is ok without data"
                }
                Some(_) => continue,
            };
            return Err(protocol_error(format!("the result at index {index} of the frame {what}")));
        }
        let now = Instant::now();
        for result in results.results {
            let held = self.held.remove(&result.id).expect("checked above");
            // A job the worker answered `expired` before any chunk of it came: skipped, its
            // deadline passed before the worker got to it. No first answer, and no work: learned
            // so, a slowed model's own expiries had taught it that batches cost nothing.
            let skipped = result.status == ResultStatus::Expired
                && !held.streamed
                && held.gathered.count == 0;
            if skipped {
                let weight = held.job.as_ref().map_or(0, |job| job.weight as usize);
                if let Some((_, _, busy)) = &mut self.busy {
                    *busy = busy.saturating_sub(weight);
                }
            }
            if held.cancelled || skipped {
                // The worker acknowledging a cancel (its client left, or its deadline passed before
                // any chunk), or skipping the job, is no first answer: counted, a client that got
                // nothing showed as a time to first chunk. The batch is still waited on while
                // another of its jobs is held; once none is, its time is a lower bound of its first
                // chunk's (`no_first_chunk`).
                let frame = held.frame;
                if !self.held.values().any(|other| other.frame == frame) {
                    if let Some(pending) = self.first.remove(&frame) {
                        seat.no_first_chunk(pending.weight, pending.sent.elapsed(), self.joins);
                    }
                }
            } else {
                Self::heard_from(&mut self.first, self.joins, seat, held.frame);
            }
            let Some(job) = held.job else { continue };
            let acknowledged = result.status == ResultStatus::End && result.data.is_none();
            if held.cancelled && !held.streamed && acknowledged {
                // The worker acknowledging the cancel of a job whose client has no stream open:
                // no result (nobody waits for one, and it carries none), so never a late one.
                // Counted as the job's expiry or its client's departure is; each deadline
                // missed before a first chunk had also read as a late result. (A stream's end
                // goes on as below: its client still reads the events before it.)
                answer(job, Outcome::Expired, now);
                continue;
            }
            let outcome = match (result.status, result.data) {
                // Its data would be dropped unseen: the worker meant a last chunk, or an `ok`.
                (ResultStatus::End, Some(_)) => Outcome::BadOutput(
                    "the worker ended the stream with data; an end carries none (send the data \
                     as a chunk, or end with ok)"
                        .into(),
                ),
                (ResultStatus::End, None) if job.stream.is_some() => Outcome::Ended,
                (ResultStatus::End, None) => {
                    Outcome::Done(held.gathered.array(None).expect("nothing added"), None)
                }
                (ResultStatus::Ok, Some(data)) => match output(data, result.content_type) {
                    // Gathered with chunks, the output is one of an array's values: no longer
                    // raw bytes of their own; refused as the chunks are where it passes what
                    // one answer holds (it had doubled the buffer, to 128 MiB and more).
                    Outcome::Done(data, _) if job.stream.is_none() && held.gathered.count > 0 => {
                        match held.gathered.array(Some(&data)) {
                            Some(answer) => Outcome::Done(answer, None),
                            None => Outcome::Failed(TOO_LARGE.into()),
                        }
                    }
                    other => other,
                },
                // A cancelled job's (any other was refused with the frame above).
                (ResultStatus::Ok, None) => Outcome::Expired,
                (ResultStatus::Invalid, _) => Outcome::Invalid(reason(result.message)),
                (ResultStatus::Error, _) => Outcome::Failed(reason(result.message)),
                (ResultStatus::Expired, _) => Outcome::Expired,
            };
            answer_result(job, outcome, now);
        }
        Ok(())
    }

    /// Every job still held when the connection ended: at shutdown answered 503; otherwise a job
    /// not streamed yet is handed back (retried or 500, as for a plain worker), and one that
    /// streamed ends with `worker_died` — its client has seen part of an answer.
    fn settle(self, outbox: &Outbox, seat: &WorkerSeat<'_>, ended: &Ended) {
        let now = Instant::now();
        let State { held, mut first, .. } = self;
        let mut held: Vec<Held> = held.into_values().collect();
        held.sort_by_key(|held| held.seq);
        // The batches still waiting for their first chunk: their spans say how they ended.
        if let Ended::Failed { reason, why } = ended {
            for span in first.values_mut().filter_map(|pending| pending.span.as_mut()) {
                trace::worker_failed(span, Some(*reason), why);
            }
        }
        let mut orphans = Vec::new();
        let told = format!("the worker failed: {}", super::words::told_clients(&ended.to_string()));
        for Held { job, frame, streamed, .. } in held {
            let Some(job) = job else { continue };
            if matches!(ended, Ended::Stopped) {
                answer(job, Outcome::ShuttingDown, now);
            } else if streamed {
                answer(job, Outcome::WorkerLost(told.clone()), now);
            } else {
                let reached = outbox.delivery(frame) != Delivery::None;
                let orphan = Orphan { job, reached };
                let span = first.get_mut(&frame).and_then(|pending| pending.span.as_mut());
                if let Some(span) = span.filter(|_| orphan.goes_back(now)) {
                    trace::retried(span, &orphan.job.id.to_string());
                }
                orphans.push(orphan);
            }
        }
        if !orphans.is_empty() {
            give_back(seat, orphans, &ended.to_string(), now);
        }
    }
}

/// Why a one-shot client's answer gathered from chunks was refused. (Only a native request of one
/// item can stream: the advice says so, as a multi-item or client-protocol request cannot.)
const TOO_LARGE: &str = "the stream is larger than one answer can carry (64 MiB); a native \
                         request of one item may ask for it as a stream (Accept: \
                         text/event-stream)";

/// A one-shot client's chunks, gathered into one answer: a msgpack array of them, its values
/// written one after another as they come (held apart, each chunk's own allocation and handle
/// cost more than a one-byte chunk: five million of them took 496 MiB for a 10 MB answer), with
/// room kept in front for the array's head.
#[derive(Debug)]
struct Gathered {
    /// [`Gathered::HEAD`] bytes of room, then the chunks.
    bytes: Vec<u8>,
    count: u32,
}

impl Default for Gathered {
    fn default() -> Self {
        Gathered { bytes: vec![0; Self::HEAD], count: 0 }
    }
}

impl Gathered {
    /// The longest msgpack array head (array32).
    const HEAD: usize = 5;

    /// Most bytes of chunks one answer holds: a frame's.
    const MOST: usize = MAX_FRAME_BYTES;

    /// Appends `chunk`; false, appending nothing, where the chunks would pass [`Self::MOST`].
    /// The buffer grows by doubling, as a `Vec` does, but never past what one answer may hold:
    /// checked after the copy, and doubled past it, a job's buffer had reached 128 MiB, its
    /// freed smaller ones held a while more by the allocator (200 MiB for one job, not 64).
    fn push(&mut self, chunk: &[u8]) -> bool {
        let needed = self.bytes.len() + chunk.len();
        if needed - Self::HEAD > Self::MOST {
            return false;
        }
        if needed > self.bytes.capacity() {
            let room = (self.bytes.capacity() * 2).clamp(needed, Self::MOST + Self::HEAD);
            self.bytes.reserve_exact(room - self.bytes.len());
        }
        self.bytes.extend_from_slice(chunk);
        self.count = self.count.saturating_add(1);
        true
    }

    /// The array of the chunks, and `last` after them if given (an `ok` result's data); None
    /// where `last` would pass [`Self::MOST`].
    fn array(mut self, last: Option<&[u8]>) -> Option<Bytes> {
        if let Some(last) = last {
            if !self.push(last) {
                return None;
            }
        }
        let mut head = Vec::with_capacity(Self::HEAD);
        rmp::encode::write_array_len(&mut head, self.count).expect("a Vec takes any write");
        let start = Self::HEAD - head.len();
        self.bytes[start..Self::HEAD].copy_from_slice(&head);
        Some(Bytes::from(self.bytes).slice(start..))
    }
}

#[cfg(test)]
mod tests;
