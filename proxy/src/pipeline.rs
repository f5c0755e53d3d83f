//! A pipeline: the stages a route's jobs go through, in order. The output of stage k is the input
//! of stage k+1; each stage queues and batches on its own, with its own workers.
//!
//! The request's handler carries its jobs from stage to stage: it submits them to a stage, waits
//! for their answers, and submits the outputs to the next. A job keeps its id and its deadline the
//! whole way, and its priority class goes on as it reached it: a later stage takes the request in
//! at the highest class its jobs reached on the stage before (`job::Reply::class`). The first stage
//! that does not answer every job of the request with a result (a 422, a 500, a 408, or a shed at
//! admission) ends the request there: its answer goes to the client at once and no later stage sees
//! its jobs. The jobs of a multi-item request move together, stage by stage, so that they stay
//! batch-mates (see [`Stage::submit_all`]).

use std::sync::Arc;

use bytes::Bytes;
use corral_protocol::{JobId, Payload};
use futures_util::future::join_all;
use http::HeaderValue;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use crate::job::{Job, Outcome, Reply, SentSlot};
use crate::stage::{Declared, Departure, Shed, Stage};
use crate::stream::ChunkSink;
use crate::traffic::{Class, Traffic};
use crate::{timing, trace};

pub struct Pipeline {
    pub stages: Vec<Arc<Stage>>,
}

/// One job's input to a stage: its id, its payload (one msgpack value) and, for raw bytes (a
/// payload that is one msgpack `bin`), their media type. A stage's output that the worker named
/// a media type for is raw bytes to the next stage, with that type.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub id: JobId,
    pub payload: Payload,
    pub content_type: Option<HeaderValue>,
}

impl Input {
    /// A msgpack (or transcoded JSON) input.
    pub fn new(id: JobId, payload: impl Into<Payload>) -> Self {
        Self { id, payload: payload.into(), content_type: None }
    }

    /// What the input adds to a batch frame, as its job will count it ([`Job::size`]).
    pub fn size(&self) -> usize {
        self.payload.len() + self.content_type.as_ref().map_or(0, HeaderValue::len)
    }
}

impl Pipeline {
    pub fn first(&self) -> &Arc<Stage> {
        &self.stages[0]
    }

    /// Most jobs one request may carry: what the smallest queue on the way can take at once.
    pub fn capacity(&self) -> usize {
        self.stages.iter().map(|stage| stage.capacity()).min().unwrap_or(0)
    }

    /// The stage whose answers go to the client (the only one that may stream).
    pub fn last(&self) -> &Arc<Stage> {
        self.stages.last().expect("a pipeline has at least one stage")
    }

    /// What a v2, KServe v1 or OpenAI request is read against ([`Ends`]), read once as it comes.
    pub fn declared_ends(&self) -> Ends {
        let (first, epoch) = self.stages[0].declared_marked();
        // A one-stage pipeline's outputs are those of the epoch its rows are marked with (its
        // jobs run only while that epoch holds): read in the same step.
        let last = match self.stages.len() {
            1 => first.clone(),
            _ => self.last().declared(),
        };
        Ends { first, last, epoch }
    }

    /// Runs the jobs through every stage but the last, for a streamed answer from the last one.
    /// `Ok(Ok(at_last))`: what the last stage takes; `Ok(Err(outcomes))`: an earlier stage
    /// ended the request.
    pub async fn run_before_last(
        &self,
        mut jobs: Vec<Input>,
        deadline: Instant,
        retries: u32,
        mut traffic: Traffic,
    ) -> Result<Result<AtLast, Vec<Outcome>>, Shed> {
        // The first stage's jobs enter its queue now, with the body in: its reading is the
        // edge's time, not the queue's (`queue;dur` and `corral_queue_wait_seconds` had
        // counted a slow upload as queueing, and the batch window had opened before it ended).
        let mut entered = Instant::now();
        for pair in self.stages.windows(2) {
            let (stage, next) = (&pair[0], &pair[1]);
            let ids: Vec<JobId> = jobs.iter().map(|input| input.id).collect();
            let (outcomes, reached) =
                run_stage(stage, jobs, entered, deadline, retries, traffic).await?;
            jobs = match hand_over(stage, next, ids, outcomes) {
                Ok(inputs) => inputs,
                Err(outcomes) => return Ok(Err(outcomes)),
            };
            // It goes on at the class it reached there, and ages on the next stage as any
            // request queued there does: only while the higher classes hold it back. (Aged by the
            // whole time since its first queue, worker time included, a generation stage of two
            // aging periods had every low request come into the next as high, and a tenant's
            // backlog that waited behind itself come in promoted.)
            traffic.class = reached;
            // Its rows were read against the first stage's tensors alone.
            traffic.tensors = None;
            entered = Instant::now();
        }
        Ok(Ok(AtLast { inputs: jobs, entered, traffic }))
    }

    /// Runs the jobs through every stage; one outcome per job, in order. `Err` when a stage
    /// refused them at admission.
    pub async fn run(
        &self,
        jobs: Vec<Input>,
        deadline: Instant,
        retries: u32,
        traffic: Traffic,
    ) -> Result<Vec<Outcome>, Shed> {
        match self.run_before_last(jobs, deadline, retries, traffic).await? {
            Ok(AtLast { inputs, entered, traffic }) => {
                let last = run_stage(self.last(), inputs, entered, deadline, retries, traffic);
                last.await.map(|(outcomes, _)| outcomes)
            }
            Err(outcomes) => Ok(outcomes),
        }
    }
}

/// The declarations at a pipeline's ends, shared (an `Arc` each, not copied): what its first
/// stage's workers take, with the epoch of their tensors, which the request's first-stage jobs
/// are marked with (`Traffic::tensors`), and what its last stage's give.
pub struct Ends {
    pub first: Option<Arc<Declared>>,
    pub last: Option<Arc<Declared>>,
    pub epoch: u64,
}

impl Ends {
    /// The first stage's tensor inputs (none declared: empty).
    pub fn inputs(&self) -> &[corral_protocol::TensorSpec] {
        self.first.as_deref().map_or(&[], |d| &d.inputs)
    }

    /// The last stage's tensor outputs (none declared: empty).
    pub fn outputs(&self) -> &[corral_protocol::TensorSpec] {
        self.last.as_deref().map_or(&[], |d| &d.outputs)
    }
}

/// What a pipeline's last stage takes once the stages before it answered: its inputs, when
/// they reached it, and the request's traffic there (at the class it reached on the stage before).
pub struct AtLast {
    pub inputs: Vec<Input>,
    pub entered: Instant,
    pub traffic: Traffic,
}

/// The outputs of `from` as the inputs of `to`, if every job has one that fits in `to`'s batches;
/// otherwise the outcomes that answer the request (an output too large fails its job).
fn hand_over(
    from: &Stage,
    to: &Stage,
    ids: Vec<JobId>,
    outcomes: Vec<Outcome>,
) -> Result<Vec<Input>, Vec<Outcome>> {
    let limit = to.settings().max_job_bytes;
    let size = |output: &Bytes, content_type: &Option<HeaderValue>| {
        output.len() + content_type.as_ref().map_or(0, HeaderValue::len)
    };
    let fits = |outcome: &Outcome| matches!(outcome, Outcome::Done(output, named) if size(output, named) <= limit);
    if outcomes.iter().all(fits) {
        let inputs = ids.into_iter().zip(outcomes).filter_map(|(id, outcome)| match outcome {
            Outcome::Done(payload, content_type) => {
                Some(Input { id, payload: payload.into(), content_type })
            }
            _ => None,
        });
        return Ok(inputs.collect());
    }
    let outcomes = outcomes.into_iter().map(|outcome| match outcome {
        Outcome::Done(output, named) if size(&output, &named) > limit => Outcome::Failed(format!(
            "stage {:?} produced {} bytes, more than stage {:?} takes in a batch",
            from.name(),
            size(&output, &named),
            to.name()
        )),
        other => other,
    });
    Err(outcomes.collect())
}

/// A request's jobs, queued on one stage: the answers to wait for, and what lives as long as
/// the wait. The one-shot path ([`run_stage`]) and the streamed one (`http::stream`) both queue
/// through [`submit`].
pub struct Queued<'a> {
    /// One per job, in the inputs' order. A caller moves them out and drops them before the
    /// rest (a purge then finds the jobs abandoned).
    pub answers: Vec<oneshot::Receiver<Reply>>,
    /// Purges the stage of the jobs if the wait is dropped before they left the queue; the
    /// caller ends it once they did (answered, or a first chunk came).
    pub departure: Departure<'a>,
    /// Cancel each job when dropped: the wait ended, whichever way (answered, deadline, or the
    /// client left and hyper dropped it), and a worker still holding the job is told to stop.
    pub left: Vec<DropGuard>,
    /// The request's queue span on this stage, when it is traced: recorded when the wait ends,
    /// or when dropped (the client left first).
    pub queue_span: Option<trace::QueueWait>,
    /// One-shot jobs only (empty for a stream, whose sink tells): one per job, in the inputs'
    /// order, holding the batch that carried it once one did, so that a job whose deadline
    /// passed in its worker is answered with that batch's timing.
    pub sent: Vec<Arc<SentSlot>>,
}

/// Makes the jobs (each with the request's deadline, retries, traffic and trace) and queues them
/// on `stage`, all or none, recording the admission in the request's trace. `stream` is the
/// chunk sink of a streamed request's one job.
pub fn submit(
    stage: &Arc<Stage>,
    inputs: Vec<Input>,
    arrived: Instant,
    deadline: Instant,
    retries: u32,
    traffic: Traffic,
    mut stream: Option<ChunkSink>,
) -> Result<Queued<'_>, Shed> {
    let mut departure = Departure::new(stage);
    let traced = timing::trace();
    let request = crate::job::new_request();
    let watch = stream.is_none();
    // A stream's batch is recorded by its sink, which its job takes.
    let stream_slot = stream.as_ref().map(ChunkSink::sent_slot);
    let mut sent = Vec::with_capacity(if watch { inputs.len() } else { 0 });
    let (jobs, answers): (Vec<Job>, Vec<_>) = inputs
        .into_iter()
        .map(|Input { id, payload, content_type }| {
            let (mut job, answer) = Job::new(id, payload, arrived, deadline);
            job.request = request;
            job.retries = retries;
            job.content_type = content_type;
            job.stream = stream.take();
            job.set_trace(traced.as_ref().map(trace::job_context));
            traffic.mark(&mut job);
            if watch {
                sent.push(job.watch_sent());
            }
            (job, answer)
        })
        .unzip();
    let left = jobs.iter().map(|job| job.left.clone().drop_guard()).collect();
    let submitted = Instant::now();
    let admitted = stage.submit_all(jobs);
    if let Some(cx) = &traced {
        trace::admission(cx, stage.name(), submitted, admitted.as_ref().err());
    }
    if let Err(shed) = admitted {
        departure.ended(); // nothing of this request was queued
        return Err(shed);
    }
    let queue_span = traced.as_ref().and_then(|cx| {
        let slots = stream_slot.map_or_else(|| sent.clone(), |slot| vec![slot]);
        trace::QueueWait::new(Some(cx), stage.name(), arrived, slots)
    });
    Ok(Queued { answers, departure, left, queue_span, sent })
}

/// Queues the jobs on one stage (all or none) and waits, until the shared deadline at most, for
/// each answer. A job still unanswered at the deadline is [`Outcome::Expired`]: with the batch it
/// rode if a worker held it then (its `server-timing` has `queue` and `batch`, up to the
/// deadline), without one if it never left the queue.
///
/// Waiting here is what makes 408 hold wherever a job is, queued or inside a worker; and if the
/// client leaves, hyper drops this future with the receivers, so the queue skips the jobs.
async fn run_stage(
    stage: &Arc<Stage>,
    inputs: Vec<Input>,
    arrived: Instant,
    deadline: Instant,
    retries: u32,
    traffic: Traffic,
) -> Result<(Vec<Outcome>, Class), Shed> {
    let class = traffic.class;
    let mut queued = submit(stage, inputs, arrived, deadline, retries, traffic, None)?;
    let answers = std::mem::take(&mut queued.answers);
    let sent = std::mem::take(&mut queued.sent);
    let waits = answers.into_iter().zip(sent).map(|(answer, sent)| async move {
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_elapsed) => {
                let batch = sent.get().map(|sent| (sent, Instant::now()));
                Reply { outcome: Outcome::Expired, batch, class }
            }
            Ok(Ok(reply)) => reply,
            // Only a bug drops a job unanswered; say so rather than hang or guess.
            Ok(Err(_dropped)) => Reply {
                outcome: Outcome::WorkerLost("the job was dropped without an answer".into()),
                batch: None,
                class,
            },
        }
    });
    let replies = join_all(waits).await;
    // A job answered 408 while still queued is gone for its client: purged now (as when the
    // client leaves), so that it leaves the queue's depth, the prediction and `/readyz`, and
    // counts as expired at once, not when a later sweep finds it — with no worker connected,
    // never. Whether it was ever sent does not tell: a job given back by a worker that died
    // waits in the queue again (it had stayed there, aging to `high`). The purge is bounded
    // (`Stage::purge`), and finds nothing to do for a job a worker holds.
    if replies.iter().any(|reply| reply.outcome == Outcome::Expired) {
        stage.purge();
    }
    queued.departure.ended();
    timing::record(arrived, &replies);
    if let Some(span) = queued.queue_span.take() {
        span.record(replies.iter().filter_map(|reply| reply.batch.map(|(sent, _)| sent)));
    }
    // The highest its jobs reached: a request's jobs are promoted together while queued, but
    // one taken before a promotion kept the class it had.
    let reached = replies.iter().map(|reply| reply.class).max().unwrap_or(class);
    Ok((replies.into_iter().map(|reply| reply.outcome).collect(), reached))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stage::{BatchSettings, Policy};

    fn stage(name: &str, max_job_bytes: usize) -> Stage {
        let settings = BatchSettings {
            max_batch_size: 8,
            max_wait: Duration::from_millis(10),
            // Only the one-job bound decides what a stage takes from the one before.
            max_batch_bytes: 1,
            max_job_bytes,
            max_batch_weight: None,
            policy: Policy::Fixed,
            prefetch: false,
            batch_timeout: None,
        };
        Stage::new(name, settings, 100)
    }

    fn done(bytes: &'static [u8]) -> Outcome {
        Outcome::Done(Bytes::from_static(bytes), None)
    }

    #[test]
    fn results_that_fit_become_the_next_stage_inputs_with_the_same_ids() {
        let (from, to) = (stage("a", 100), stage("b", 4));
        let ids = vec![JobId::new(), JobId::new()];
        let inputs = hand_over(&from, &to, ids.clone(), vec![done(b"ab"), done(b"abcd")]).unwrap();
        assert_eq!(
            inputs,
            vec![
                Input::new(ids[0], Bytes::from_static(b"ab")),
                Input::new(ids[1], Bytes::from_static(b"abcd"))
            ]
        );
    }

    #[test]
    fn raw_bytes_with_a_media_type_are_raw_bytes_to_the_next_stage() {
        let (from, to) = (stage("a", 100), stage("b", 100));
        let id = JobId::new();
        let png = Bytes::from_static(b"\xc4\x03PNG");
        let named = Some(HeaderValue::from_static("image/png"));
        let outcome = Outcome::Done(png.clone(), named.clone());
        let inputs = hand_over(&from, &to, vec![id], vec![outcome]).unwrap();
        assert_eq!(inputs, vec![Input { id, payload: png.into(), content_type: named }]);
    }

    #[test]
    fn the_media_type_counts_toward_what_the_next_stage_takes() {
        let (from, to) = (stage("a", 100), stage("b", 12));
        let named = Some(HeaderValue::from_static("image/png")); // 9 bytes
        let outcome = Outcome::Done(Bytes::from_static(b"\xc4\x03PNG"), named); // 5 bytes
        let outcomes = hand_over(&from, &to, vec![JobId::new()], vec![outcome]).unwrap_err();
        assert!(matches!(&outcomes[0], Outcome::Failed(_)), "{outcomes:?}");
    }

    #[test]
    fn an_output_too_large_for_the_next_stage_fails_its_job_and_ends_the_request() {
        let (from, to) = (stage("a", 100), stage("b", 4));
        let ids = vec![JobId::new(), JobId::new()];
        let outcomes = hand_over(&from, &to, ids, vec![done(b"abcde"), done(b"ok")]).unwrap_err();
        assert!(matches!(&outcomes[0], Outcome::Failed(why) if why.contains("5 bytes")));
        assert_eq!(outcomes[1], done(b"ok"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_answered_408_in_the_queue_leaves_it_at_once() {
        // No worker: nothing else would sweep the queue. The expired jobs stayed counted in
        // its depth (and `/readyz`, and the prediction) for as long as the outage lasted.
        let queue = Arc::new(stage("a", 100));
        let now = Instant::now();
        let inputs = vec![Input::new(JobId::new(), Bytes::from_static(b"\x01")); 3];
        let deadline = now + Duration::from_millis(100);
        let outcomes = run_stage(&queue, inputs, now, deadline, 0, Traffic::default()).await;
        assert_eq!(outcomes.unwrap().0, vec![Outcome::Expired; 3]);
        assert_eq!(queue.queued(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_client_left_leaves_the_queue_at_once() {
        // The counters are the process's, shared with tests running beside this one: the
        // end-to-end test (tests/test_overload.py) checks them.
        let queue = Arc::new(stage("a", 100)); // no worker: the jobs stay queued
        let now = Instant::now();
        let inputs = vec![Input::new(JobId::new(), Bytes::from_static(b"\x01")); 2];
        let deadline = now + Duration::from_secs(5);
        let mut wait = Box::pin(run_stage(&queue, inputs, now, deadline, 0, Traffic::default()));
        assert!(futures_util::poll!(wait.as_mut()).is_pending());
        assert_eq!(queue.queued(), 2);
        drop(wait); // the client left: hyper drops the handler's future
        assert_eq!(queue.queued(), 0, "purged at once, not at the deadline");
    }

    /// A request of `jobs` one-byte inputs run through stages `a` then `b` (60 s to live), as
    /// its handler runs it.
    fn run_through(
        a: &Arc<Stage>,
        b: &Arc<Stage>,
        jobs: usize,
        traffic: Traffic,
    ) -> tokio::task::JoinHandle<Result<Vec<Outcome>, Shed>> {
        let pipeline = Pipeline { stages: vec![a.clone(), b.clone()] };
        let inputs = vec![Input::new(JobId::new(), Bytes::from_static(b"\x01")); jobs];
        let deadline = Instant::now() + Duration::from_secs(60);
        tokio::spawn(async move { pipeline.run(inputs, deadline, 0, traffic).await })
    }

    /// Queues a high job of `stage`'s own (its answer kept by the caller): higher work that
    /// holds a lower class back.
    fn high_job(stage: &Stage) -> oneshot::Receiver<Reply> {
        let now = Instant::now();
        let (mut job, answer) =
            Job::new(JobId::new(), Bytes::from_static(b"\x04"), now, now + Duration::from_secs(60));
        job.class = Class::High;
        stage.submit(job).unwrap();
        answer
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_stage_takes_the_request_at_the_class_it_reached_on_the_stage_before() {
        // Low, held back two aging periods by a high job in the first stage's queue: high
        // there, and high on the second (each stage had started it low again).
        let (a, b) = (Arc::new(stage("a", 100)), Arc::new(stage("b", 100)));
        let (seat_a, seat_b) = (a.worker_joined(), b.worker_joined());
        let _high = high_job(&a);
        let run = run_through(&a, &b, 1, Traffic { class: Class::Low, ..Traffic::default() });
        while a.queued() < 2 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(crate::stage::DEFAULT_AGING * 2).await;
        let high = seat_a.next_batch().await; // one job a batch (the stages' byte bound)
        assert_eq!(high[0].payload.contiguous().as_ref(), b"\x04");
        drop(high);
        let first = seat_a.next_batch().await;
        assert_eq!(first[0].class, Class::High, "promoted while held in a's queue");
        first.into_iter().for_each(|job| assert!(job.answer(done(b"\x02"))));
        let second = seat_b.next_batch().await;
        assert_eq!(second[0].class, Class::High);
        second.into_iter().for_each(|job| assert!(job.answer(done(b"\x03"))));
        assert_eq!(run.await.unwrap().unwrap(), vec![done(b"\x03")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_taken_in_several_batches_goes_on_at_the_highest_class_its_jobs_reached() {
        // One job a batch (the stages' byte bound): the first taken low, the second promoted
        // while a high job held it back. The request goes on as high: its second job was held.
        let (a, b) = (Arc::new(stage("a", 100)), Arc::new(stage("b", 100)));
        let (seat_a, seat_b) = (a.worker_joined(), b.worker_joined());
        let run = run_through(&a, &b, 2, Traffic { class: Class::Low, ..Traffic::default() });
        let first = seat_a.next_batch().await;
        assert_eq!((first.len(), first[0].class), (1, Class::Low));
        first.into_iter().for_each(|job| assert!(job.answer(done(b"\x02"))));
        let _high = high_job(&a);
        tokio::time::advance(crate::stage::DEFAULT_AGING * 2).await;
        drop(seat_a.next_batch().await); // the high job, queued before the promotion
        let second = seat_a.next_batch().await;
        assert_eq!((second.len(), second[0].class), (1, Class::High));
        second.into_iter().for_each(|job| assert!(job.answer(done(b"\x02"))));
        for _ in 0..2 {
            let batch = seat_b.next_batch().await;
            assert_eq!(batch[0].class, Class::High);
            batch.into_iter().for_each(|job| assert!(job.answer(done(b"\x03"))));
        }
        assert_eq!(run.await.unwrap().unwrap(), vec![done(b"\x03"); 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn time_in_a_stage_s_worker_does_not_age_the_request_for_the_next() {
        // Taken at once by stage a, whose worker held it two aging periods (a generation): it
        // had come into b as high, aged by the whole time since a's queue, and gone before b's
        // normal work that no higher class had held back.
        let (a, b) = (Arc::new(stage("a", 100)), Arc::new(stage("b", 100)));
        let (seat_a, seat_b) = (a.worker_joined(), b.worker_joined());
        let run = run_through(&a, &b, 1, Traffic { class: Class::Low, ..Traffic::default() });
        let first = seat_a.next_batch().await;
        assert_eq!(first[0].class, Class::Low);
        tokio::time::advance(crate::stage::DEFAULT_AGING * 2).await;
        first.into_iter().for_each(|job| assert!(job.answer(done(b"\x02"))));
        let second = seat_b.next_batch().await;
        assert_eq!(second[0].class, Class::Low, "as it left a");
        second.into_iter().for_each(|job| assert!(job.answer(done(b"\x03"))));
        assert_eq!(run.await.unwrap().unwrap(), vec![done(b"\x03")]);
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_first_stage_s_jobs_carry_the_epoch_of_the_tensors_they_were_read_against() {
        // The epoch is the first stage's: on the second (its own epochs, 0 here), the same
        // number had marked every job stale, each answered 503 `tensors_changed`.
        let (a, b) = (Arc::new(stage("a", 100)), Arc::new(stage("b", 100)));
        let spec = corral_protocol::TensorSpec {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![2],
        };
        a.declare(crate::stage::Declared { inputs: vec![spec], ..Default::default() });
        let (_, epoch) = a.declared_marked();
        assert_ne!(epoch, b.declared_marked().1);
        let (seat_a, seat_b) = (a.worker_joined(), b.worker_joined());
        let run = run_through(&a, &b, 1, Traffic { tensors: Some(epoch), ..Traffic::default() });
        let first = seat_a.next_batch().await;
        assert_eq!(first[0].tensors, Some(epoch));
        first.into_iter().for_each(|job| assert!(job.answer(done(b"\x02"))));
        let second = tokio::time::timeout(Duration::from_secs(1), seat_b.next_batch())
            .await
            .expect("the job reaches the second stage's worker");
        assert_eq!(second[0].tensors, None);
        second.into_iter().for_each(|job| assert!(job.answer(done(b"\x03"))));
        assert_eq!(run.await.unwrap().unwrap(), vec![done(b"\x03")]);
    }

    #[test]
    fn a_failure_ends_the_request_with_every_outcome() {
        let (from, to) = (stage("a", 100), stage("b", 100));
        let ids = vec![JobId::new(), JobId::new()];
        let outcomes = vec![done(b"x"), Outcome::Invalid("bad".into())];
        assert_eq!(hand_over(&from, &to, ids, outcomes.clone()).unwrap_err(), outcomes);
    }
}
