//! The stage queue under tokio's paused clock: every timer rule is checked without sleeping. The
//! races between admission and a worker taking a batch run on real threads, with no timer at all.

use std::time::Duration;

use bytes::Bytes;
use corral_protocol::JobId;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::job::Reply;
use crate::traffic::Class;

const WAIT: Duration = Duration::from_millis(10);

fn stage(max_batch_size: usize, capacity: usize) -> Stage {
    let settings = BatchSettings {
        max_batch_size,
        max_wait: WAIT,
        max_batch_bytes: 100,
        max_job_bytes: 1 << 20,
        max_batch_weight: None,
        policy: Policy::Fixed,
        prefetch: false,
        batch_timeout: None,
    };
    Stage::new("default", settings, capacity)
}

fn job(payload: &'static [u8], timeout: Duration) -> (Job, oneshot::Receiver<Reply>) {
    let now = Instant::now();
    Job::new(JobId::new(), Bytes::from_static(payload), now, now + timeout)
}

fn submit(stage: &Stage, payload: &'static [u8]) -> oneshot::Receiver<Reply> {
    let (job, answer) = job(payload, Duration::from_secs(5));
    stage.submit(job).expect("queue has room");
    answer
}

fn payloads(batch: &[Job]) -> Vec<&[u8]> {
    // Test payloads are held in one segment.
    batch.iter().map(|j| &j.payload.segments()[0][..]).collect()
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_goes_at_once() {
    let stage = stage(3, 10);
    let _answers: Vec<_> = [b"a", b"b", b"c", b"d"].map(|p| submit(&stage, p)).into();
    let start = Instant::now();
    let batch = stage.next_batch().await;
    assert_eq!(payloads(&batch), [b"a", b"b", b"c"]);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_worker_bounding_its_batches_gets_none_larger_and_no_wait_for_more() {
    // Its hello's `max_batch` (a joining worker's `max_running`): a batch of 2 is full for it,
    // and goes at once, as a batch of the stage's 8 would.
    let stage = stage(8, 10);
    let seat = stage.worker_joined();
    seat.take_at_most(2);
    let _answers: Vec<_> = [b"a", b"b", b"c", b"d", b"e"].map(|p| submit(&stage, p)).into();
    let start = Instant::now();
    assert_eq!(payloads(&seat.next_batch().await), [b"a", b"b"]);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Its room for joins is bounded alike, whatever it offers.
    assert_eq!(payloads(&seat.next_join(5).await), [b"c", b"d"]);
    // And the bound outlives the batch: free again, it still gets no more.
    seat.released(4, 4, Duration::from_millis(1), true);
    let _more: Vec<_> = [b"f", b"g"].map(|p| submit(&stage, p)).into();
    assert_eq!(payloads(&seat.next_batch().await), [b"e", b"f"]);
    seat.finished(2, 2, Duration::from_millis(1));
    assert_eq!(payloads(&seat.next_batch().await), [b"g"]);
}

#[tokio::test(start_paused = true)]
async fn a_partial_batch_goes_at_max_wait_from_the_oldest_arrival() {
    let stage = stage(8, 10);
    let start = Instant::now();
    let _a = submit(&stage, b"a");
    tokio::time::advance(Duration::from_millis(6)).await;
    let _b = submit(&stage, b"b");
    let batch = stage.next_batch().await;
    assert_eq!(payloads(&batch), [b"a", b"b"]);
    // Counted from a's arrival, not restarted by b's.
    assert_eq!(start.elapsed(), WAIT);
}

#[tokio::test(start_paused = true)]
async fn an_idle_worker_wakes_for_the_first_arrival() {
    let stage = std::sync::Arc::new(stage(2, 10));
    let waiting = tokio::spawn({
        let stage = stage.clone();
        async move { stage.next_batch().await.len() }
    });
    tokio::task::yield_now().await;
    let _a = submit(&stage, b"a");
    let _b = submit(&stage, b"b");
    assert_eq!(waiting.await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_expired_job_is_answered_and_never_dispatched() {
    let stage = stage(8, 10);
    let (short, mut expired) = job(b"late", Duration::from_millis(5));
    stage.submit(short).unwrap();
    // Past its deadline before any worker asks (no batch is held past one: the next test).
    tokio::time::sleep(Duration::from_millis(6)).await;
    let _fresh = submit(&stage, b"fresh");
    let batch = stage.next_batch().await;
    assert_eq!(payloads(&batch), [b"fresh"]);
    assert_eq!(expired.try_recv().map(|r| r.outcome), Ok(Outcome::Expired));
}

#[tokio::test(start_paused = true)]
async fn no_batch_is_held_past_the_deadline_of_a_job_it_would_take() {
    // A minute's wait: the later job, due in 100 ms, goes out with its batch-mate in time
    // (halfway to its deadline, no cost learned yet), not answered 408 at the end of the wait.
    let settings = BatchSettings { max_wait: Duration::from_secs(60), ..stage(8, 10).settings };
    let stage = Stage::new("default", settings, 10);
    let start = Instant::now();
    let _first = submit(&stage, b"first");
    let (due, mut answer) = job(b"due", Duration::from_millis(100));
    stage.submit(due).unwrap();
    let batch = stage.next_batch().await;
    assert_eq!(payloads(&batch), [&b"first"[..], &b"due"[..]]);
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert!(answer.try_recv().is_err(), "not answered: sent to the worker");
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_job_is_never_dispatched() {
    let stage = stage(8, 10);
    drop(submit(&stage, b"gone"));
    let _kept = submit(&stage, b"kept");
    assert_eq!(payloads(&stage.next_batch().await), [b"kept"]);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_but_first_clears_out_dead_jobs() {
    let stage = stage(8, 2);
    let _a = submit(&stage, b"a");
    drop(submit(&stage, b"gone"));
    let _c = submit(&stage, b"c"); // fits: "gone" made room
    let (d, _answer) = job(b"d", Duration::from_secs(1));
    assert!(matches!(stage.submit(d), Err(Shed::QueueFull { .. })));
    assert_eq!(stage.queued(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_queue_s_bytes_are_bounded_but_an_empty_queue_takes_any_one_request() {
    let stage = stage(8, 10).with_capacity_bytes(10);
    let _big = submit(&stage, &[1; 12]); // over the bound, but alone: served, not shed forever
    let (small, _answer) = job(b"s", Duration::from_secs(1));
    assert!(matches!(stage.submit(small), Err(Shed::QueueFull { .. })));
    let batch = stage.next_batch().await;
    let _a = submit(&stage, &[2; 6]);
    let (b, _answer) = job(&[3; 6], Duration::from_secs(1));
    assert!(matches!(stage.submit(b), Err(Shed::QueueFull { .. })), "6 + 6 bytes > 10");
    stage.requeue(batch); // a retry bypasses the bound, as it does the count
    assert_eq!(stage.queued(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_batch_stays_within_its_byte_budget() {
    let stage = stage(8, 10);
    let big: &'static [u8] = &[7; 60];
    let _answers = [submit(&stage, big), submit(&stage, big), submit(&stage, b"x")];
    assert_eq!(stage.next_batch().await.len(), 1, "60 + 60 > 100 bytes");
    assert_eq!(stage.next_batch().await.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn workers_are_counted_while_seated() {
    let stage = stage(1, 1);
    let seat = stage.worker_joined();
    assert_eq!(stage.workers(), 1);
    drop(seat);
    assert_eq!(stage.workers(), 0);
}

fn adaptive_stage(max_batch_size: usize) -> std::sync::Arc<Stage> {
    let settings = BatchSettings {
        max_batch_size,
        max_wait: Duration::from_millis(100),
        max_batch_bytes: 1 << 20,
        max_job_bytes: 1 << 20,
        max_batch_weight: None,
        policy: Policy::Adaptive,
        prefetch: false,
        batch_timeout: None,
    };
    std::sync::Arc::new(Stage::new("default", settings, 10_000))
}

/// A worker whose batches take 20 ms + 2 ms per job (in paused time, exactly: tokio's timer
/// counts whole milliseconds, so the tests' durations are whole milliseconds too); it notes the
/// size of each batch in `sizes` if given.
fn scripted_worker(
    stage: std::sync::Arc<Stage>,
    sizes: Option<std::sync::Arc<Mutex<Vec<usize>>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let seat = stage.worker_joined();
        loop {
            let batch = seat.next_batch().await;
            if let Some(sizes) = &sizes {
                sizes.lock().unwrap().push(batch.len());
            }
            let started = Instant::now();
            let took = Duration::from_millis(20 + 2 * batch.len() as u64);
            tokio::time::sleep(took).await;
            seat.finished(batch.len(), batch.len(), started.elapsed());
            for job in batch {
                job.answer(Outcome::Done(Bytes::new(), None));
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_learned_cost_converges_on_a_scripted_worker() {
    let stage = adaptive_stage(32);
    let worker = scripted_worker(stage.clone(), None);
    // Open-loop arrivals at a varying rate, so that batches of several sizes are seen.
    let mut answers = Vec::new();
    for i in 0..600u64 {
        answers.push(submit(&stage, b"x"));
        let gap = if (i / 100) % 2 == 0 { 1 } else { 7 };
        tokio::time::sleep(Duration::from_millis(gap)).await;
    }
    for answer in answers {
        assert_eq!(answer.await.unwrap().outcome, Outcome::Done(Bytes::new(), None));
    }
    let cost = stage.cost().expect("batches were recorded");
    let (overhead, per_item) =
        (cost.overhead.as_secs_f64() * 1e3, cost.per_item.as_secs_f64() * 1e3);
    assert!((overhead - 20.0).abs() < 0.01, "overhead {overhead} ms");
    assert!((per_item - 2.0).abs() < 0.01, "per item {per_item} ms");
    worker.abort();
}

#[tokio::test(start_paused = true)]
async fn a_batch_whose_jobs_the_worker_skipped_teaches_no_cost() {
    // A worker answers `expired` at once the jobs whose deadline passed before it got to them
    // (a batch sent ahead, behind a model that became slower): learned as a batch of 4 that
    // cost a millisecond, it had told admission the slowed model was fast again.
    let stage = adaptive_stage(4);
    let seat = stage.worker_joined();
    for _ in 0..3 {
        seat.finished(4, 4, Duration::from_millis(750));
    }
    let learned = stage.cost().expect("batches were recorded");
    seat.finished(4, 0, Duration::from_millis(1));
    assert_eq!(stage.cost(), Some(learned));
}

#[tokio::test(start_paused = true)]
async fn a_lone_closed_loop_client_never_waits_for_batch_mates() {
    let stage = adaptive_stage(32);
    let worker = scripted_worker(stage.clone(), None);
    for _ in 0..50 {
        let answer = submit(&stage, b"x");
        let sent = Instant::now();
        answer.await.unwrap();
        // Answered after exactly one batch of one: 22 ms, no batch window.
        assert_eq!(sent.elapsed(), Duration::from_millis(22));
        tokio::time::sleep(Duration::from_millis(3)).await; // the client's think time
    }
    worker.abort();
}

#[tokio::test(start_paused = true)]
async fn adaptive_batches_busy_open_loop_traffic() {
    let stage = adaptive_stage(32);
    let sizes = std::sync::Arc::new(Mutex::new(Vec::new()));
    let worker = scripted_worker(stage.clone(), Some(sizes.clone()));
    // A job every 4 ms against a 20 ms overhead: several arrive per overhead, so batches form.
    let mut answers = Vec::new();
    for _ in 0..400 {
        answers.push(submit(&stage, b"x"));
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    for answer in answers {
        answer.await.unwrap();
    }
    let sizes = sizes.lock().unwrap();
    let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    assert!(mean > 3.0, "mean batch size {mean}");
    worker.abort();
}

fn group(stage: &Stage, len: usize) -> Vec<oneshot::Receiver<Reply>> {
    let (jobs, answers) = (0..len).map(|_| job(b"g", Duration::from_secs(5))).unzip();
    stage.submit_all(jobs).expect("queue has room");
    answers
}

#[tokio::test(start_paused = true)]
async fn a_request_that_fits_in_a_batch_is_not_split() {
    let stage = stage(4, 100);
    let _a = submit(&stage, b"a");
    let _group = group(&stage, 4);
    // The group does not fit next to "a" but fits in a batch of its own.
    assert_eq!(payloads(&stage.next_batch().await), [b"a"]);
    assert_eq!(payloads(&stage.next_batch().await), [b"g"; 4]);
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_a_batch_is_split_in_order() {
    let stage = stage(4, 100);
    let _a = submit(&stage, b"a");
    let _group = group(&stage, 6);
    assert_eq!(payloads(&stage.next_batch().await), [b"a", b"g", b"g", b"g"]);
    assert_eq!(payloads(&stage.next_batch().await), [b"g"; 3]);
}

#[tokio::test(start_paused = true)]
async fn a_request_is_admitted_whole_or_not_at_all() {
    let stage = stage(4, 5);
    let _a = submit(&stage, b"a");
    let (jobs, _answers): (Vec<_>, Vec<_>) =
        (0..5).map(|_| job(b"g", Duration::from_secs(5))).unzip();
    assert!(matches!(stage.submit_all(jobs), Err(Shed::QueueFull { .. })));
    assert_eq!(stage.queued(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_batch_goes_ahead_only_when_the_stage_is_saturated_and_it_can_wait() {
    let stage = stage(2, 100);
    let busy = stage.worker_joined();
    let _answers: Vec<_> = [b"a", b"b", b"c"].map(|p| submit(&stage, p)).into();
    assert_eq!(busy.next_batch().await.len(), 2);
    // One queued job is not a full batch: nothing goes ahead yet.
    let ahead = busy.next_batch_ahead();
    tokio::pin!(ahead);
    assert!(futures_util::poll!(&mut ahead).is_pending());
    // An idle worker joins: it, not the busy one, must get the next batch.
    let idle = stage.worker_joined();
    let _d = submit(&stage, b"d");
    assert!(futures_util::poll!(&mut ahead).is_pending());
    assert_eq!(payloads(&idle.next_batch().await), [b"c", b"d"]);
    // Every worker is busy and a full batch is queued, but no batch cost is known yet.
    let _more: Vec<_> = [b"e", b"f"].map(|p| submit(&stage, p)).into();
    assert!(futures_util::poll!(&mut ahead).is_pending());
    // Once it is (1 s per batch), the full batch goes ahead: its jobs have 5 s to live.
    idle.finished(2, 2, Duration::from_secs(1));
    let _g = submit(&stage, b"g");
    let _again = idle.next_batch().await;
    let _h = submit(&stage, b"h");
    assert_eq!(payloads(&ahead.await), [b"g", b"h"]);
}

#[tokio::test(start_paused = true)]
async fn a_job_that_cannot_wait_out_the_current_batch_does_not_go_ahead() {
    let stage = stage(1, 100);
    let busy = stage.worker_joined();
    let teacher = stage.worker_joined();
    let _a = submit(&stage, b"a");
    let _ = busy.next_batch().await;
    // Admitted while no batch cost is known yet.
    let (short, _answer) = job(b"short", Duration::from_millis(500));
    stage.submit(short).unwrap();
    // Now the stage learns that a batch takes 1 s; the teacher leaves.
    teacher.finished(1, 1, Duration::from_secs(1));
    drop(teacher);
    // Saturated, but "short" could not wait out "a" (1 s) and still make its 500 ms deadline.
    let ahead = busy.next_batch_ahead();
    tokio::pin!(ahead);
    assert!(futures_util::poll!(&mut ahead).is_pending());
}

#[tokio::test(start_paused = true)]
async fn a_job_due_just_after_the_batch_ahead_would_end_does_not_go_ahead() {
    // The worker's batch ends at 1 s and the one sent ahead at 2 s; a job due at 2.05 s has
    // less than admission's margin (5% of its 2.05 s) to spare, and had been sent ahead.
    let tight = std::pin::pin!(stage_with_one_busy_worker(Duration::from_millis(2050)));
    assert!(futures_util::poll!(tight).is_pending());
    // With room to spare (due at 2.5 s), the same goes ahead.
    let roomy = stage_with_one_busy_worker(Duration::from_millis(2500)).await;
    assert_eq!(roomy.len(), 1);
}

/// A stage whose one worker has a 1 s batch under way, a job of `timeout` queued behind it,
/// and the cost learned: what goes ahead of it.
async fn stage_with_one_busy_worker(timeout: Duration) -> Vec<Job> {
    let stage = stage(1, 100);
    let busy = stage.worker_joined();
    let teacher = stage.worker_joined();
    let _a = submit(&stage, b"a");
    let _ = busy.next_batch().await;
    let (job, _answer) = job(b"queued", timeout);
    stage.submit(job).unwrap();
    teacher.finished(1, 1, Duration::from_secs(1));
    drop(teacher);
    busy.next_batch_ahead().await
}

#[tokio::test(start_paused = true)]
async fn closed_loop_clients_are_waited_for_and_batches_fill() {
    // 32 clients, each sending its next request 1 ms after its answer, against one worker with
    // room for 32: without learning the returns, the clients split into groups that take turns,
    // each group's batch paying the 20 ms overhead.
    let stage = adaptive_stage(32);
    let sizes = std::sync::Arc::new(Mutex::new(Vec::new()));
    let worker = scripted_worker(stage.clone(), Some(sizes.clone()));
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let stage = stage.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i)).await; // staggered starts
                for _ in 0..40 {
                    submit(&stage, b"x").await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let sizes = sizes.lock().unwrap();
    let settled = &sizes[sizes.len() - 20..sizes.len() - 1];
    assert!(settled.iter().all(|&size| size == 32), "batch sizes {sizes:?}");
    worker.abort();
}

#[tokio::test(start_paused = true)]
async fn admission_counts_the_batch_a_worker_took_and_the_one_sent_ahead() {
    // One job per batch, 300 ms each, 1 s to live (950 ms with admission's margin): three fit.
    let stage = stage(1, 100);
    let seat = stage.worker_joined();
    seat.finished(1, 1, Duration::from_millis(300));
    let admit = || {
        let (job, answer) = job(b"x", Duration::from_secs(1));
        stage.submit(job).map(|()| answer)
    };
    let _first = admit().unwrap();
    assert_eq!(seat.next_batch().await.len(), 1);
    // The taken batch is on the worker's seat, not nowhere: two more fit behind it, not three.
    let _second = admit().unwrap();
    let _third = admit().unwrap();
    assert!(matches!(admit(), Err(Shed::DeadlineUnreachable { .. })));
    // The same for a batch sent ahead: it leaves the queue onto the seat, and still counts.
    assert_eq!(seat.next_batch_ahead().await.len(), 1);
    assert!(matches!(admit(), Err(Shed::DeadlineUnreachable { .. })));
    // Once the worker answers, it works on the batch sent ahead, from now: with one queued
    // behind it, one more fits.
    tokio::time::advance(Duration::from_millis(300)).await;
    seat.finished(1, 1, Duration::from_millis(300));
    assert_eq!(stage.busy_workers(), 1);
    let _fourth = admit().unwrap();
    assert!(matches!(admit(), Err(Shed::DeadlineUnreachable { .. })));
}

/// Teaches the stage through `seat` that batches cost 50 ms + 2 ms per job and that every
/// answered client comes back 30 ms later; leaves the seat busy with the last returns.
async fn learn_slow_returns(stage: &Stage, seat: &WorkerSeat<'_>) {
    for round in 0..20 {
        let size = if round % 2 == 0 { 8 } else { 16 };
        seat.finished(size, size, Duration::from_millis(50 + 2 * size as u64));
        tokio::time::advance(Duration::from_millis(30)).await;
        let returned: Vec<_> = (0..size).map(|_| submit(stage, b"x")).collect();
        assert_eq!(seat.next_batch().await.len(), size);
        drop(returned);
    }
}

#[tokio::test(start_paused = true)]
async fn a_free_worker_holds_jobs_for_returns_at_most_max_wait_however_many_workers_answer() {
    let stage = adaptive_stage(32);
    let max_wait = stage.settings().max_wait;
    let [a, b, c] = [(); 3].map(|()| stage.worker_joined());
    learn_slow_returns(&stage, &a).await;
    // b and c take 16 jobs each; then two jobs queue while all three workers are busy.
    for seat in [&b, &c] {
        let _answers: Vec<_> = (0..16).map(|_| submit(&stage, b"x")).collect();
        assert_eq!(seat.next_batch().await.len(), 16);
    }
    let _queued = [submit(&stage, b"q"), submit(&stage, b"q")];
    tokio::time::advance(Duration::from_millis(150)).await;
    // a answers its 16 jobs and is free: their clients are expected back within max_wait.
    a.finished(16, 16, Duration::from_millis(82));
    let free = Instant::now();
    let released = async {
        let batch = a.next_batch().await;
        (batch.len(), Instant::now())
    };
    // Meanwhile b and c answer too, each announcing returns due later still; none come back.
    let others_answer = async {
        for seat in [&b, &c] {
            tokio::time::sleep(max_wait * 9 / 10).await;
            seat.finished(16, 16, Duration::from_millis(82));
        }
    };
    let ((jobs, at), ()) = tokio::join!(released, others_answer);
    assert_eq!(jobs, 2);
    let held = at - free;
    assert!(held <= max_wait, "held {held:?} after the worker became free");
}

/// Admission against a worker taking a batch on another thread, many times over (real threads,
/// no timers: a batch costs 30 s, far longer than a trial can stall). One job per batch, one
/// worker, busy with a batch already if `busy`, and one job queued that
/// `take` takes. A probe fits (in `probe_timeout`) only if the batch being taken is counted
/// nowhere — neither queued nor on the worker's seat — so every probe must be refused.
fn race_admission_against(
    busy: bool,
    take: impl Fn(&WorkerSeat<'_>) -> bool + Sync,
    probe_timeout: Duration,
) {
    use futures_util::FutureExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    for _ in 0..2000 {
        let stage = stage(1, 100);
        let seat = stage.worker_joined();
        seat.finished(1, 1, Duration::from_secs(30));
        let mut answers = Vec::new();
        for _ in 0..=usize::from(busy) {
            let (queued, answer) = job(b"queued", Duration::from_secs(1000));
            stage.submit(queued).unwrap();
            answers.push(answer);
        }
        if busy {
            assert_eq!(seat.next_batch().now_or_never().map(|batch| batch.len()), Some(1));
        }
        let taken = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !take(&seat) {}
                taken.store(true, Ordering::Release);
            });
            while !taken.load(Ordering::Acquire) {
                let (probe, answer) = job(b"probe", probe_timeout);
                assert!(stage.submit(probe).is_err(), "admitted while a batch was being taken");
                answers.push(answer);
            }
        });
    }
}

#[test]
fn admission_sees_a_batch_as_it_is_taken() {
    use futures_util::FutureExt;
    // Queued or taken, the job is one batch ahead of the probe: 60 s > 47.5 s (its timeout
    // less admission's margin); counted nowhere, the probe would fit in 30 s.
    let take = |seat: &WorkerSeat<'_>| seat.next_batch().now_or_never().is_some();
    race_admission_against(false, take, Duration::from_secs(50));
}

#[test]
fn admission_sees_a_batch_as_it_is_sent_ahead() {
    use futures_util::FutureExt;
    // Queued or sent ahead, the job is a batch behind the worker's current one and ahead of the
    // probe: 90 s > 76 s; counted nowhere, the probe would fit in 60 s.
    let take = |seat: &WorkerSeat<'_>| seat.next_batch_ahead().now_or_never().is_some();
    race_admission_against(true, take, Duration::from_secs(80));
}

/// A job of a class (and tenant, and weight; 0: weighed by the stage) with a 5 s deadline.
fn classed(
    payload: &'static [u8],
    class: Class,
    tenant: Option<&str>,
    weight: u32,
) -> (Job, oneshot::Receiver<Reply>) {
    let (mut job, answer) = job(payload, Duration::from_secs(5));
    job.class = class;
    job.tenant = tenant.map(|t| crate::traffic::Tenant::of(t.as_bytes()));
    job.weight = weight;
    (job, answer)
}

#[tokio::test(start_paused = true)]
async fn a_high_job_evicts_a_queued_low_one_which_is_answered_preempted_at_once() {
    let stage = stage(8, 2);
    let (early, _early) = classed(b"low-early", Class::Low, None, 1);
    stage.submit(early).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let (late, mut late_answer) = classed(b"low-late", Class::Low, None, 1);
    stage.submit(late).unwrap();
    let (low, _low) = classed(b"low", Class::Low, None, 1);
    assert!(matches!(stage.submit(low), Err(Shed::QueueFull { .. })), "low evicts nothing");
    let (high, _high) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
    // The latest deadline went, answered before any worker looked at the queue.
    match late_answer.try_recv().map(|reply| reply.outcome) {
        Ok(Outcome::Preempted { retry_after }) => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("expected preempted, got {other:?}"),
    }
    assert_eq!(payloads(&stage.next_batch().await), [b"high" as &[u8], b"low-early"]);
}

#[tokio::test(start_paused = true)]
async fn eviction_happens_only_if_it_makes_room() {
    let stage = stage(8, 2);
    let (normal, _n) = classed(b"normal", Class::Normal, None, 1);
    stage.submit(normal).unwrap();
    let (low, mut low_answer) = classed(b"low", Class::Low, None, 1);
    stage.submit(low).unwrap();
    // Three high jobs at once need three places: evicting both queued jobs would not do.
    let (a, _a) = classed(b"h1", Class::High, None, 1);
    let (b, _b) = classed(b"h2", Class::High, None, 1);
    let (c, _c) = classed(b"h3", Class::High, None, 1);
    assert!(
        matches!(stage.submit_all(vec![a, b, c]), Err(Shed::QueueFull { .. })),
        "3 > capacity 2"
    );
    assert!(low_answer.try_recv().is_err(), "nothing was evicted for a request that cannot fit");
    assert_eq!(stage.queued(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_high_job_overtakes_queued_low_ones() {
    let stage = stage(2, 10);
    let _lows: Vec<_> = [b"l1", b"l2", b"l3"]
        .map(|p| {
            let (job, answer) = classed(p, Class::Low, None, 1);
            stage.submit(job).unwrap();
            answer
        })
        .into();
    let (high, _h) = classed(b"h", Class::High, None, 1);
    stage.submit(high).unwrap();
    assert_eq!(payloads(&stage.next_batch().await), [b"h" as &[u8], b"l1"]);
    assert_eq!(stage.queued_by_class(), [2, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_share_is_refused_and_others_are_not() {
    let stage = stage(8, 10).with_tenant_share(0.3); // 3 jobs each
    let mut answers = Vec::new();
    for _ in 0..3 {
        let (job, answer) = classed(b"a", Class::Normal, Some("flood"), 1);
        stage.submit(job).unwrap();
        answers.push(answer);
    }
    let (fourth, _f) = classed(b"a", Class::Normal, Some("flood"), 1);
    assert!(matches!(stage.submit(fourth), Err(Shed::TenantQuota { .. })));
    let (other, _o) = classed(b"b", Class::Normal, Some("quiet"), 1);
    stage.submit(other).unwrap();
    let (nameless, _n) = classed(b"c", Class::Normal, None, 1);
    stage.submit(nameless).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_batch_stays_within_its_weight_budget_and_a_heavy_job_goes_alone() {
    let settings = BatchSettings { max_batch_weight: Some(10), ..*stage(8, 10).settings() };
    let stage = Stage::new("default", settings, 20);
    let mut answers = Vec::new();
    for (payload, weight) in [(b"a", 4), (b"b", 4), (b"c", 4), (b"d", 25), (b"e", 1)] {
        let (job, answer) = classed(payload, Class::Normal, None, weight);
        stage.submit(job).unwrap();
        answers.push(answer);
    }
    assert_eq!(payloads(&stage.next_batch().await), [b"a" as &[u8], b"b"]);
    assert_eq!(payloads(&stage.next_batch().await), [b"c" as &[u8]]);
    assert_eq!(payloads(&stage.next_batch().await), [b"d" as &[u8]], "heavier than the budget");
    assert_eq!(payloads(&stage.next_batch().await), [b"e" as &[u8]]);
}

#[tokio::test(start_paused = true)]
async fn the_workers_weight_rule_weighs_jobs_the_client_did_not() {
    let stage = stage(8, 10);
    let rule = Some(WeightRule::parse("/text").unwrap());
    stage.declare(Declared { weight: rule, ..Declared::default() });
    let payload: &'static [u8] = b"\x81\xa4text\xa5hello"; // {"text": "hello"}
    let (ruled, _r) = classed(payload, Class::Normal, None, 0);
    let (given, _g) = classed(payload, Class::Normal, None, 2);
    stage.submit(ruled).unwrap();
    stage.submit(given).unwrap();
    let batch = stage.next_batch().await;
    assert_eq!(batch.iter().map(|j| j.weight).collect::<Vec<_>>(), [5, 2]);
}

#[tokio::test(start_paused = true)]
async fn admission_counts_only_the_jobs_that_go_before() {
    // One worker, one job per batch, 1 s a batch; deadlines 5 s (4.75 s with the margin).
    let stage = std::sync::Arc::new(stage(1, 100));
    let seat = stage.worker_joined();
    seat.finished(1, 1, Duration::from_secs(1));
    let mut answers = Vec::new();
    for _ in 0..4 {
        let (job, answer) = classed(b"low", Class::Low, None, 1);
        stage.submit(job).unwrap();
        answers.push(answer);
    }
    let (low, _l) = classed(b"low", Class::Low, None, 1);
    assert!(matches!(stage.submit(low), Err(Shed::DeadlineUnreachable { .. })));
    // A high job goes before the four: it is predicted to finish in a second.
    let (high, _h) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
    drop(seat);
}

/// A stage that learned batches cost 20 ms + 0.1 ms a unit of weight (from lone jobs of weight
/// 500 and 1,000), its one worker idle.
fn learned_by_weight(max_batch_weight: Option<usize>) -> Stage {
    let settings =
        BatchSettings { max_batch_weight, max_batch_bytes: 1 << 20, ..*stage(32, 100).settings() };
    let stage = Stage::new("default", settings, 1000);
    let seat = stage.worker_joined();
    for round in 0..10u64 {
        let weight = if round % 2 == 0 { 500 } else { 1000 };
        seat.finished(1, weight as usize, Duration::from_micros(20_000 + 100 * weight));
    }
    std::mem::forget(seat); // the worker stays, idle
    stage
}

#[tokio::test(start_paused = true)]
async fn a_heavy_job_an_idle_stage_runs_in_time_is_admitted() {
    // 120 ms alone; 500 ms to live. Counted as 32 (or 10) batches of the stage's full weight,
    // each paying the overhead, it was refused for good.
    for budget in [None, Some(100)] {
        let stage = learned_by_weight(budget);
        let (mut heavy, _answer) = job(b"heavy", Duration::from_millis(500));
        heavy.weight = 1000;
        assert!(stage.submit(heavy).is_ok(), "with max_batch_weight {budget:?}");
        // One that would outlast its deadline even alone is still refused, and told that no
        // retry would help: no Retry-After.
        let (mut heavier, _answer) = job(b"heavier", Duration::from_millis(500));
        heavier.weight = 10_000;
        let refused = stage.submit(heavier);
        let alone = matches!(refused, Err(Shed::DeadlineUnreachable { alone: true, .. }));
        assert!(alone, "with max_batch_weight {budget:?}: {refused:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_heavy_job_behind_a_queue_it_cannot_pass_is_refused() {
    // 640 light jobs ahead (20 batches of 32, about 460 ms), then the same 120 ms heavy job
    // with 500 ms to live: it would finish near 580 ms. Predicted with batches as wide as it,
    // shared by the whole queue, it was admitted.
    let stage = learned_by_weight(None);
    for _ in 0..640 {
        let (light, answer) = job(b"light", Duration::from_secs(60));
        stage.submit(light).unwrap();
        std::mem::forget(answer);
    }
    let (mut heavy, _answer) = job(b"heavy", Duration::from_millis(500));
    heavy.weight = 1000;
    // Alone it would make it: worth a retry once the queue has drained.
    let refused = stage.submit(heavy);
    assert!(matches!(refused, Err(Shed::DeadlineUnreachable { alone: false, .. })));
}

#[tokio::test(start_paused = true)]
async fn eviction_takes_the_latest_deadline_not_the_last_queued() {
    // "The lowest class first, the latest deadline first."
    let stage = stage(8, 2);
    let (mut patient, mut patient_answer) = job(b"low-60s", Duration::from_secs(60));
    patient.class = Class::Low;
    stage.submit(patient).unwrap();
    let (mut urgent, mut urgent_answer) = job(b"low-1s", Duration::from_secs(1));
    urgent.class = Class::Low;
    stage.submit(urgent).unwrap();
    let (high, _high) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
    let preempted = |answer: &mut oneshot::Receiver<Reply>| {
        matches!(answer.try_recv().map(|r| r.outcome), Ok(Outcome::Preempted { .. }))
    };
    assert!(preempted(&mut patient_answer), "the job with 60 s left stays");
    assert!(!preempted(&mut urgent_answer), "the job with 1 s left went");
}

#[tokio::test(start_paused = true)]
async fn a_class_ages_from_when_its_job_was_queued_not_from_its_arrival() {
    // A low request whose body took 12 s to come (aging: 5 s) enters the queue low, behind a
    // high job queued before it.
    let stage = stage(1, 10);
    let (high, _high) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
    let now = Instant::now();
    let slow_body = now - Duration::from_secs(12);
    let (mut low, _low) = Job::new(
        JobId::new(),
        Bytes::from_static(b"low"),
        slow_body,
        now + Duration::from_secs(20),
    );
    low.class = Class::Low;
    stage.submit(low).unwrap();
    assert_eq!(stage.queued_by_class(), [1, 0, 1], "high, normal, low");
    assert_eq!(payloads(&stage.next_batch().await), [b"high"]);
}

#[tokio::test(start_paused = true)]
async fn a_request_handed_back_by_a_dead_worker_is_evicted_whole() {
    // A low request of 4 jobs, taken by a worker that dies: its jobs go back as one request, and
    // a high job arriving at the full queue evicts all of them, not one.
    let stage = stage(4, 4);
    let seat = stage.worker_joined();
    let request = crate::job::new_request();
    let (jobs, mut answers): (Vec<Job>, Vec<_>) = (0..4)
        .map(|_| {
            let (mut job, answer) = job(b"low", Duration::from_secs(5));
            (job.class, job.request) = (Class::Low, request);
            (job, answer)
        })
        .unzip();
    stage.submit_all(jobs).unwrap();
    let held = seat.next_batch().await;
    assert_eq!(held.len(), 4);
    seat.requeue(held);
    let (high, _high) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
    for answer in &mut answers {
        assert!(matches!(answer.try_recv().map(|r| r.outcome), Ok(Outcome::Preempted { .. })));
    }
    assert_eq!(payloads(&seat.next_batch().await), [b"high"]);
}

/// A job with 400 ms to live: less than the 600 ms batch the probe tests' stage learned.
fn short(payload: &'static [u8]) -> (Job, oneshot::Receiver<Reply>) {
    job(payload, Duration::from_millis(400))
}

/// The probe tests' start: one batch took 600 ms, then a short job is let in as a probe.
fn probe_after_a_slow_batch(stage: &Stage, seat: &WorkerSeat<'_>) -> oneshot::Receiver<Reply> {
    seat.finished(1, 1, Duration::from_millis(600));
    let (probe, answer) = short(b"probe");
    assert!(stage.submit(probe).is_ok(), "an idle stage lets one in, as a probe");
    answer
}

#[tokio::test(start_paused = true)]
async fn one_slow_batch_does_not_lock_short_deadlines_out_for_good() {
    // One batch took 600 ms (a cold start, a pause); jobs with 400 ms to live are predicted to
    // miss, so none was admitted, no batch ran, and the cost was never learned again.
    let stage = stage(4, 100);
    let seat = stage.worker_joined();
    let _probe = probe_after_a_slow_batch(&stage, &seat);
    let (next, _next) = short(b"next");
    assert!(matches!(stage.submit(next), Err(Shed::DeadlineUnreachable { .. })));
    // The probe runs, and fast: the stage learns it, and admits short jobs again.
    let batch = seat.next_batch().await;
    assert_eq!(payloads(&batch), [b"probe"]);
    seat.finished(1, 1, Duration::from_millis(5));
    let (after, _after) = short(b"after");
    assert!(stage.submit(after).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_stage_too_slow_for_a_deadline_is_probed_at_most_once_a_second() {
    let stage = stage(4, 100);
    let seat = stage.worker_joined();
    let _probe = probe_after_a_slow_batch(&stage, &seat);
    let batch = seat.next_batch().await;
    seat.finished(batch.len(), 1, Duration::from_millis(600)); // it really is that slow
    let (again, _again) = short(b"again");
    assert!(stage.submit(again).is_err(), "idle again, but a probe went in this second");
    tokio::time::advance(Duration::from_secs(1)).await;
    let (later, _later) = short(b"later");
    assert!(stage.submit(later).is_ok(), "the next second's probe");
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_for_its_own_size_is_probed_once_the_cost_is_stale() {
    // The model took 10 ms + 100 ms an item, then became 20× faster. Only 8-item requests with
    // 500 ms come (810 ms by the old fit): all refused, nothing ran, and nothing was relearned.
    let stage = stage(8, 100);
    let seat = stage.worker_joined();
    for size in [1, 8, 1, 8] {
        seat.finished(size, size, Duration::from_millis(10 + 100 * size as u64));
    }
    // Each with its route's 5 s allowance: a worker is declared hung only past that.
    let jobs_of = |items: usize, timeout: Duration| {
        let jobs = (0..items).map(|_| job(b"i", timeout));
        let jobs = jobs.map(|(mut job, answer)| {
            job.allowance = Duration::from_secs(5);
            (job, answer)
        });
        jobs.unzip::<_, _, Vec<_>, Vec<_>>()
    };
    let eight = || jobs_of(8, Duration::from_millis(500));
    let (jobs, _answers) = eight();
    let refused = stage.submit_all(jobs);
    assert!(matches!(refused, Err(Shed::DeadlineUnreachable { alone: true, .. })), "{refused:?}");
    // Once the stage has learned nothing for 10 s, one such request goes in as a probe.
    tokio::time::advance(STALE_AFTER).await;
    let (jobs, _probe) = eight();
    assert!(stage.submit_all(jobs).is_ok(), "an idle stage with a stale cost probes it");
    let batch = seat.next_batch().await;
    assert_eq!(batch.len(), 8);
    // It really is that slow: the next such request waits another 10 s.
    seat.finished(8, 8, Duration::from_millis(810));
    tokio::time::advance(PROBE_EVERY).await;
    let (jobs, _answers) = eight();
    assert!(stage.submit_all(jobs).is_err(), "a probe was just learned");
    tokio::time::advance(STALE_AFTER).await;
    // Never one that could not make it in three times its time (810 ms of 200 ms), nor one
    // its worker would be declared hung over (810 ms past a 600 ms allowance).
    let (jobs, _answers) = jobs_of(8, Duration::from_millis(200));
    assert!(stage.submit_all(jobs).is_err(), "hopeless: not probed");
    let (mut jobs, _answers) = eight();
    jobs.iter_mut().for_each(|job| job.allowance = Duration::from_millis(600));
    assert!(stage.submit_all(jobs).is_err(), "its worker would be declared hung");
    let (jobs, _answers) = eight();
    assert!(stage.submit_all(jobs).is_ok(), "the next probe");
}

#[tokio::test(start_paused = true)]
async fn a_streaming_batch_cancelled_before_any_chunk_teaches_only_a_slower_first_chunk() {
    let stage = stage(4, 100);
    let seat = stage.worker_joined();
    seat.first_chunk(1, 1, Duration::from_millis(100), false);
    let first = |stage: &Stage| stage.lock().first.estimate().unwrap().of(1);
    // A client that left after 50 ms says nothing of the first chunk's time.
    seat.no_first_chunk(1, Duration::from_millis(50), false);
    assert_eq!(first(&stage), Duration::from_millis(100));
    // One acknowledged at 900 ms (its deadline's cancel) says it takes at least that.
    seat.no_first_chunk(1, Duration::from_millis(900), false);
    assert!(first(&stage) > Duration::from_millis(100), "{:?}", first(&stage));
}

#[test]
fn a_hello_replaces_only_what_it_declares() {
    // Worker A declares a weight rule; worker B, on the same stage, only schemas: A's rule stays
    // (B once wiped it, and every batch was weighed 1 a job).
    let stage = stage(4, 10);
    let rule = super::weight::WeightRule::parse("/t").unwrap();
    stage.declare(Declared { weight: Some(rule.clone()), ..Declared::default() });
    let schema = serde_json::json!({"type": "object"});
    stage.declare(Declared { input: Some(schema.clone()), ..Declared::default() });
    let declared = stage.declared().unwrap();
    assert_eq!((declared.weight.as_ref(), declared.input.as_ref()), (Some(&rule), Some(&schema)));
    // A new rule replaces the old one; the schemas stay.
    let other = super::weight::WeightRule::parse("/u").unwrap();
    stage.declare(Declared { weight: Some(other.clone()), ..Declared::default() });
    let declared = stage.declared().unwrap();
    assert_eq!((declared.weight.as_ref(), declared.input.as_ref()), (Some(&other), Some(&schema)));
}

#[tokio::test(start_paused = true)]
async fn a_heavy_job_queued_ahead_costs_its_weight_once() {
    // A job of weight 3,000 behind a budget of 100 goes alone: 320 ms. A light job behind it
    // is answered near 340 ms, inside its 500 ms. Counted as 30 full batches, each paying the
    // 20 ms overhead (about 900 ms), the light job was refused, as was everything behind the
    // heavy one until it left.
    let stage = learned_by_weight(Some(100));
    let (mut heavy, _heavy_answer) = job(b"heavy", Duration::from_secs(60));
    heavy.weight = 3000;
    stage.submit(heavy).unwrap();
    let (light, _answer) = job(b"light", Duration::from_millis(500));
    assert!(stage.submit(light).is_ok());
    // Behind two such heavy jobs (640 ms), the light one cannot make it.
    let (mut second, _second_answer) = job(b"heavy", Duration::from_secs(60));
    second.weight = 3000;
    stage.submit(second).unwrap();
    let (light, _answer) = job(b"light", Duration::from_millis(500));
    assert!(matches!(stage.submit(light), Err(Shed::DeadlineUnreachable { .. })));
}

#[tokio::test(start_paused = true)]
async fn eviction_counts_no_request_a_batch_has_started() {
    // Capacity 8. A low request of 8 jobs, 4 of them taken by a batch (the other 4 cannot be
    // evicted), and a normal request of 4: full. A high request of 8 was admitted, counting the
    // started low request as room; only the normal one could go, and the queue held 12.
    let stage = stage(4, 8);
    let request = crate::job::new_request();
    let lows: Vec<Job> = (0..8)
        .map(|_| {
            let (mut job, answer) = classed(b"low", Class::Low, None, 1);
            job.request = request;
            std::mem::forget(answer);
            job
        })
        .collect();
    stage.submit_all(lows).unwrap();
    assert_eq!(stage.next_batch().await.len(), 4);
    let normal = |_| classed(b"normal", Class::Normal, None, 1);
    let (normals, mut normal_answers): (Vec<Job>, Vec<_>) = (0..4).map(normal).unzip();
    stage.submit_all(normals).unwrap();
    let (highs, _high_answers): (Vec<Job>, Vec<_>) =
        (0..8).map(|_| classed(b"high", Class::High, None, 1)).unzip();
    assert!(matches!(stage.submit_all(highs), Err(Shed::QueueFull { .. })));
    assert!(normal_answers.iter_mut().all(|a| a.try_recv().is_err()), "nothing evicted");
    assert_eq!(stage.queued(), 8);
    // Four high jobs fit once the normal request is evicted.
    let (highs, _high_answers): (Vec<Job>, Vec<_>) =
        (0..4).map(|_| classed(b"high", Class::High, None, 1)).unzip();
    stage.submit_all(highs).unwrap();
    assert_eq!(stage.queued(), 8);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_says_when_it_will_have_room() {
    // One worker, batches of one job that cost a second, four jobs queued in a queue of four:
    // a request of three has room once three have left, the third taken after two seconds.
    // Retry-After had been 1 s, whatever the queue: its clients came back while it was still
    // full.
    let full = stage(1, 4);
    let seat = full.worker_joined();
    for _ in 0..10 {
        seat.finished(1, 1, Duration::from_secs(1));
    }
    let _answers: Vec<_> = (0..4).map(|_| submit(&full, b"queued")).collect();
    let three: Vec<Job> = (0..3).map(|_| job(b"three", Duration::from_secs(60)).0).collect();
    match full.submit_all(three) {
        Err(Shed::QueueFull { retry_after }) => assert_eq!(retry_after, Duration::from_secs(2)),
        other => panic!("expected queue_full, got {other:?}"),
    }
    drop(seat);
    // Jobs of weight 10, batches of at most 10: each goes alone, a second each, and eight
    // must leave, the eighth taken after seven seconds (they had been counted as weight 1, in
    // one batch of 8: 1 s).
    let settings = BatchSettings { max_batch_weight: Some(10), ..*stage(8, 8).settings() };
    let weighed = Stage::new("default", settings, 8);
    let seat = weighed.worker_joined();
    for _ in 0..10 {
        seat.finished(1, 10, Duration::from_secs(1));
    }
    let mut held = Vec::new();
    for _ in 0..8 {
        let (mut heavy, answer) = job(b"ten", Duration::from_secs(60));
        heavy.weight = 10;
        weighed.submit(heavy).unwrap();
        held.push(answer);
    }
    let eight: Vec<Job> = (0..8)
        .map(|_| {
            let (mut heavy, _) = job(b"ten", Duration::from_secs(60));
            heavy.weight = 10;
            heavy
        })
        .collect();
    match weighed.submit_all(eight) {
        Err(Shed::QueueFull { retry_after }) => assert_eq!(retry_after, Duration::from_secs(7)),
        other => panic!("expected queue_full, got {other:?}"),
    }
    drop(seat);
    // Before a cost is learned: a second.
    let fresh = stage(1, 1);
    let _queued = submit(&fresh, b"queued");
    let (extra, _answer) = job(b"one too many", Duration::from_secs(60));
    let expected = Err(Shed::QueueFull { retry_after: Duration::from_secs(1) });
    assert_eq!(fresh.submit(extra), expected);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_behind_a_busy_worker_has_room_when_batches_are_taken_not_done() {
    // One worker busy with a batch of one job (a second each), four more queued in a queue of
    // four, a request of two: the first leaves in a second, the second in two. Counted to the
    // end of the batch that takes the last, past the one sent ahead, it had been three to five
    // seconds (a probe's clients were admitted after one: the first was sent ahead at once).
    // Whether a batch will be sent ahead is not counted on (a streaming stage sends none), so
    // the stage sends batches ahead here, and its first job leaving at once is not foreseen.
    {
        let settings = BatchSettings { prefetch: true, ..*stage(1, 4).settings() };
        let full = Stage::new("default", settings, 4);
        let seat = full.worker_joined();
        for _ in 0..10 {
            seat.finished(1, 1, Duration::from_secs(1));
        }
        let queue = |payload| {
            let (job, answer) = job(payload, Duration::from_secs(60));
            full.submit(job).expect("queue has room");
            answer
        };
        let _running = queue(b"running");
        assert_eq!(seat.next_batch().await.len(), 1);
        let _answers: Vec<_> = (0..4).map(|_| queue(b"queued")).collect();
        let two: Vec<Job> = (0..2).map(|_| job(b"two", Duration::from_secs(60)).0).collect();
        match full.submit_all(two) {
            Err(Shed::QueueFull { retry_after }) => assert_eq!(retry_after, Duration::from_secs(2)),
            other => panic!("expected queue_full, got {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_queue_of_jobs_heavier_than_their_budget_says_when_one_has_gone() {
    // Jobs of weight 50,000 behind a budget of 10 each go alone: 20 ms + 500 ms. Counted as
    // 5,000 full batches each, every one paying the overhead, the queue said 105 s where it
    // had room in one job's time.
    let settings = BatchSettings { max_batch_weight: Some(10), ..*stage(8, 3).settings() };
    let stage = Stage::new("default", settings, 3);
    let seat = stage.worker_joined();
    for weight in [5, 10, 5, 10] {
        seat.finished(1, weight, Duration::from_micros(20_000 + 10 * weight as u64));
    }
    let heavy = || {
        let (mut job, answer) = job(b"heavy", Duration::from_secs(60));
        job.weight = 50_000;
        std::mem::forget(answer);
        job
    };
    for _ in 0..3 {
        stage.submit(heavy()).unwrap();
    }
    match stage.submit(heavy()) {
        Err(Shed::QueueFull { retry_after }) => assert_eq!(retry_after, Duration::from_secs(1)),
        other => panic!("expected queue_full, got {other:?}"),
    }
}

/// The Retry-After a tenant "flood" over its share is told, on a stage of one worker taking
/// batches of one job, a second each, with `queued` waiting (deadlines a minute off: none is in
/// doubt).
fn flood_told(capacity: usize, share: f64, queued: &[(Class, Option<&str>)]) -> Duration {
    let stage = stage(1, capacity).with_tenant_share(share);
    let seat = stage.worker_joined();
    for _ in 0..10 {
        seat.finished(1, 1, Duration::from_secs(1));
    }
    let mut answers = Vec::new();
    for &(class, tenant) in queued {
        let (mut job, answer) = classed(b"a", class, tenant, 1);
        job.deadline = Instant::now() + Duration::from_secs(60);
        stage.submit(job).unwrap();
        answers.push(answer);
    }
    let (next, _next) = classed(b"a", Class::Normal, Some("flood"), 1);
    match stage.submit(next) {
        Err(Shed::TenantQuota { retry_after }) => retry_after,
        other => panic!("expected tenant_quota, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_share_is_told_when_it_will_have_room() {
    // The flood holds its share of 3 and a quiet tenant has work too: the flood's next job
    // fits once one of its jobs has left, and the two take turns, so when the second batch is
    // taken, a second on. (Retry-After had been 1 s whatever the queue, and then the time the
    // second batch was done, a batch late.)
    let flood = (Class::Normal, Some("flood"));
    let queued = [flood, flood, flood, (Class::Normal, Some("quiet"))];
    assert_eq!(flood_told(10, 0.3, &queued), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_share_behind_higher_classes_is_told_to_wait_for_them() {
    // As above, with six high jobs of nobody's queued ahead of the flood's normal ones: none
    // of the flood's leaves before all six have, its first taken in the eighth batch. Its
    // Retry-After had counted only its own class's turns, and sent it back into refusals for
    // four more seconds.
    let flood = (Class::Normal, Some("flood"));
    let mut queued = vec![(Class::High, None); 6];
    queued.extend([flood, flood, flood, (Class::Normal, Some("quiet"))]);
    assert_eq!(flood_told(20, 0.15, &queued), Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn a_quiet_tenant_is_admitted_past_a_busy_tenants_backlog() {
    // Tenants take turns: a newcomer's job goes in the next batch or two, not behind a busy
    // tenant's 300 jobs (38 batches of 40 ms, 1.5 s). Counted whole, every short deadline of
    // every other tenant was refused while one tenant kept the queue full.
    let stage = stage(8, 1000);
    let seat = stage.worker_joined();
    for _ in 0..10 {
        seat.finished(8, 8, Duration::from_millis(40));
    }
    for _ in 0..300 {
        let (busy, answer) = classed(b"a", Class::Normal, Some("a"), 1);
        stage.submit(busy).unwrap();
        std::mem::forget(answer);
    }
    let short = |tenant: &str| {
        let (mut job, answer) = job(b"short", Duration::from_millis(800));
        job.tenant = Some(crate::traffic::Tenant::of(tenant.as_bytes()));
        (job, answer)
    };
    let (quiet, _quiet) = short("b");
    assert!(stage.submit(quiet).is_ok(), "one turn of a's is before it");
    // The busy tenant's own short job is behind its own backlog: refused.
    let (busy, _busy) = short("a");
    assert!(matches!(stage.submit(busy), Err(Shed::DeadlineUnreachable { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_higher_class_heavy_job_is_counted_whole_before_another_tenants_job() {
    // The tenants' turns share out their own class's work, not a higher class's: a high job of
    // 100,000 (10 s here) goes first whatever the tenants, and a 500 ms job behind it is
    // refused. Shared out, its count rounded to none, it had been costed at nothing.
    let stage = learned_by_weight(Some(100));
    let (mut heavy, _heavy) = classed(b"heavy", Class::High, None, 100_000);
    heavy.deadline += Duration::from_secs(60);
    stage.submit(heavy).unwrap();
    for _ in 0..10 {
        let (mut light, answer) = classed(b"a", Class::Normal, Some("a"), 1);
        light.deadline += Duration::from_secs(60);
        stage.submit(light).unwrap();
        std::mem::forget(answer);
    }
    let (mut quiet, _quiet) = job(b"b", Duration::from_millis(500));
    quiet.tenant = Some(crate::traffic::Tenant::of(b"b"));
    assert!(matches!(stage.submit(quiet), Err(Shed::DeadlineUnreachable { .. })));
}

/// A job given back by a worker that died holding it, as `settle::give_back` queues it: alone.
fn requeued_alone(stage: &Stage, payload: &'static [u8]) -> oneshot::Receiver<Reply> {
    let (mut job, answer) = job(payload, Duration::from_secs(30));
    job.alone = true;
    stage.requeue(vec![job]);
    answer
}

#[tokio::test(start_paused = true)]
async fn a_job_retried_alone_goes_at_once_in_a_batch_of_its_own() {
    // A long batch window: a batch of one job still goes at once, with nothing more in it.
    let settings = BatchSettings { max_wait: Duration::from_secs(10), ..*stage(8, 100).settings() };
    let stage = Stage::new("default", settings, 100);
    let _a = submit(&stage, b"a");
    let _p = requeued_alone(&stage, b"p");
    let _q = requeued_alone(&stage, b"q");
    let start = Instant::now();
    assert_eq!(payloads(&stage.next_batch().await), [b"q"]);
    assert_eq!(payloads(&stage.next_batch().await), [b"p"]);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Costed as a batch each by admission, as a job over the weight budget is.
    let _r = requeued_alone(&stage, b"r");
    assert_eq!(stage.lock().jobs.heavy_from(Class::Low), (1, 1));
    assert_eq!(payloads(&stage.next_batch().await), [b"r"]);
    // What follows waits for its batch-mates as ever (here until halfway to its deadline).
    assert_eq!(payloads(&stage.next_batch().await), [b"a"]);
    assert_eq!(start.elapsed(), Duration::from_millis(2500));
}

#[tokio::test(start_paused = true)]
async fn a_job_retried_alone_is_neither_sent_ahead_nor_joined_to_a_running_batch() {
    // Written behind a busy worker's batch, or beside a streaming worker's running jobs, a
    // poison input would kill them with it.
    let stage = stage(2, 100);
    let busy = stage.worker_joined();
    busy.finished(2, 2, Duration::from_millis(100)); // a batch's cost is known
    let _ab: Vec<_> = [b"a", b"b"].map(|p| submit(&stage, p)).into();
    assert_eq!(busy.next_batch().await.len(), 2);
    let _c = submit(&stage, b"c");
    let _p = requeued_alone(&stage, b"p");
    // A full batch's worth is queued and every worker busy: p, at the front, still waits.
    {
        let ahead = busy.next_batch_ahead();
        tokio::pin!(ahead);
        assert!(futures_util::poll!(&mut ahead).is_pending());
    }
    let join = busy.next_join(2);
    tokio::pin!(join);
    assert!(futures_util::poll!(&mut join).is_pending());
    // Once an idle worker took p, the join waiting behind it looks again at once, not at the
    // next arrival (none comes here).
    let idle = stage.worker_joined();
    assert_eq!(payloads(&idle.next_batch().await), [b"p"]);
    let joined = tokio::time::timeout(Duration::from_secs(60), join).await;
    assert_eq!(payloads(&joined.expect("the join woke")), [b"c"]);
}

#[tokio::test(start_paused = true)]
async fn a_join_behind_a_job_retried_alone_looks_again_once_a_purge_takes_it_out() {
    // Dead (its deadline passed) and purged, not taken: the join waiting behind it had slept
    // until the next arrival.
    let stage = std::sync::Arc::new(stage(2, 100));
    let busy = stage.worker_joined();
    let _ab: Vec<_> = [b"a", b"b"].map(|p| submit(&stage, p)).into();
    assert_eq!(busy.next_batch().await.len(), 2);
    let (mut doomed, _doomed) = job(b"p", Duration::from_millis(10));
    doomed.alone = true;
    stage.requeue(vec![doomed]);
    let _c = submit(&stage, b"c");
    let join = busy.next_join(2);
    tokio::pin!(join);
    assert!(futures_util::poll!(&mut join).is_pending());
    tokio::time::advance(Duration::from_millis(20)).await;
    stage.purge();
    let joined = tokio::time::timeout(Duration::from_secs(60), join).await;
    assert_eq!(payloads(&joined.expect("the join woke")), [b"c"]);
}

/// A `high` job of `weight` with 30 s to live, queued.
fn submit_high(stage: &Stage, weight: u32) -> oneshot::Receiver<Reply> {
    let (mut job, answer) = classed(b"h", Class::High, None, weight);
    job.deadline += Duration::from_secs(25);
    stage.submit(job).unwrap();
    answer
}

/// Batches of 4 of these weights, each learned to cost 50 ms (80 jobs a second).
fn fifty_ms_batches(seat: &WorkerSeat<'_>, weights: &[usize]) {
    for &weight in weights {
        seat.finished(4, weight, Duration::from_millis(50));
    }
}

/// A stage's one worker, its batches of 4 learned to cost 50 ms (80 jobs a second), kept busy
/// by closed-loop `high` clients, 4 arriving as each batch ends, for `seconds`: the worker is
/// never free for a lower class before its promotion. Ends with the worker holding a batch.
async fn flood_high(
    stage: &Stage,
    seat: &WorkerSeat<'_>,
    seconds: u64,
) -> Vec<oneshot::Receiver<Reply>> {
    fifty_ms_batches(seat, &[4; 5]);
    let mut answers = Vec::new();
    for _ in 0..seconds * 20 {
        answers.extend((0..4).map(|_| submit_high(stage, 1)));
        assert_eq!(seat.next_batch().await.len(), 4);
        tokio::time::advance(Duration::from_millis(50)).await;
        seat.finished(4, 4, Duration::from_millis(50));
    }
    // The next round of high jobs is queued; the worker takes it.
    answers.extend((0..4).map(|_| submit_high(stage, 1)));
    assert_eq!(seat.next_batch().await.len(), 4);
    answers
}

#[tokio::test(start_paused = true)]
async fn a_lower_job_that_higher_arrivals_would_pass_until_its_deadline_is_refused_at_once() {
    // The queue ahead of a low job is empty (the high ones are taken as they come), but the
    // high ones arriving as fast as the worker serves them go first until the low job's
    // promotion to high, 10 s away: with 3 s to live it is refused now, not answered 408 at 3 s.
    let stage = stage(4, 1000);
    let seat = stage.worker_joined();
    let _high = flood_high(&stage, &seat, 5).await;
    let (mut low, _low) = classed(b"low", Class::Low, None, 1);
    low.deadline -= Duration::from_secs(2); // 3 s
    match stage.submit(low) {
        Err(Shed::DeadlineUnreachable { retry_after, alone: false }) => {
            assert!(retry_after >= Duration::from_secs(5), "{retry_after:?}");
        }
        other => panic!("expected deadline_unreachable, got {other:?}"),
    }
    // A normal one is passed only until its one promotion (5 s): refused too at 3 s...
    let (mut normal, _normal) = classed(b"normal", Class::Normal, None, 1);
    normal.deadline -= Duration::from_secs(2);
    assert!(matches!(stage.submit(normal), Err(Shed::DeadlineUnreachable { .. })));
    // ...and admitted with 30 s, as is a low one: promoted, they go before later high jobs.
    for class in [Class::Normal, Class::Low] {
        let (mut patient, answer) = classed(b"patient", class, None, 1);
        patient.deadline += Duration::from_secs(25);
        stage.submit(patient).unwrap();
        std::mem::forget(answer);
    }
    // A high job is passed by nothing.
    let (high, _answer) = classed(b"high", Class::High, None, 1);
    stage.submit(high).unwrap();
}

#[tokio::test(start_paused = true)]
async fn higher_arrivals_that_stopped_hold_nothing_back() {
    let stage = stage(4, 1000);
    let seat = stage.worker_joined();
    let _high = flood_high(&stage, &seat, 5).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    let (mut low, _low) = classed(b"low", Class::Low, None, 1);
    low.deadline -= Duration::from_secs(2);
    stage.submit(low).unwrap();
}

#[tokio::test(start_paused = true)]
async fn heavy_higher_jobs_are_counted_at_their_own_cost_not_their_weight() {
    // High jobs of weight 10, 20 a second, on a model whose batch costs 50 ms whatever it
    // holds: a quarter of the worker. Read as 200 weight a second against batches of the
    // queue's mean weight (1: 80 a second), every normal job behind them was refused.
    let stage = stage(4, 1000);
    let seat = stage.worker_joined();
    fifty_ms_batches(&seat, &[10, 40, 10, 40, 20]);
    let mut answers = Vec::new();
    for _ in 0..100 {
        answers.push(submit_high(&stage, 10));
        assert_eq!(seat.next_batch().await.len(), 1);
        tokio::time::advance(Duration::from_millis(40)).await;
        seat.finished(1, 10, Duration::from_millis(50));
    }
    let (normal, _normal) = classed(b"normal", Class::Normal, None, 1);
    stage.submit(normal).unwrap();
    std::mem::forget(seat);
}

#[tokio::test(start_paused = true)]
async fn one_burst_of_higher_jobs_is_no_flood() {
    // 40 high jobs at once after a quiet spell: half a second of work, queued ahead. Read as
    // 40 over the instant they came (180 a second), they refused the normal jobs behind them.
    let stage = stage(4, 1000);
    let seat = stage.worker_joined();
    fifty_ms_batches(&seat, &[4; 5]);
    let burst: Vec<_> = (0..40).map(|_| submit_high(&stage, 1)).collect();
    let (mut normal, _normal) = classed(b"normal", Class::Normal, None, 1);
    normal.deadline -= Duration::from_secs(2); // 3 s
    stage.submit(normal).unwrap();
    drop(burst);
    std::mem::forget(seat);
}

#[tokio::test(start_paused = true)]
async fn a_lower_job_seated_in_a_batch_a_moment_ago_says_the_higher_classes_leave_room() {
    // High jobs came as fast as the worker served them, but a batch just took a normal job in:
    // the higher classes are not holding normal jobs back, and one with 3 s to live is
    // admitted. (Closed loops just short of saturation, read as a flood, had such jobs
    // refused that were served in 120 ms.)
    let stage = stage(4, 1000);
    let seat = stage.worker_joined();
    let _high = flood_high(&stage, &seat, 5).await;
    // Three high jobs and a normal one fill a batch; then the flood goes on.
    let mut high: Vec<_> = (0..3).map(|_| submit_high(&stage, 1)).collect();
    let (mut patient, _patient) = classed(b"patient", Class::Normal, None, 1);
    patient.deadline += Duration::from_secs(25);
    stage.submit(patient).unwrap();
    for round in 0..3 {
        tokio::time::advance(Duration::from_millis(50)).await;
        seat.finished(4, 4, Duration::from_millis(50));
        let batch = seat.next_batch().await;
        assert_eq!(batch.iter().any(|job| job.class == Class::Normal), round == 0);
        high.extend((0..4).map(|_| submit_high(&stage, 1)));
    }
    let (mut normal, _normal) = classed(b"normal", Class::Normal, None, 1);
    normal.deadline -= Duration::from_secs(2); // 3 s
    stage.submit(normal).unwrap();
    std::mem::forget(seat);
}

#[tokio::test(start_paused = true)]
async fn a_request_left_out_of_every_batch_beside_one_high_job_still_ages() {
    // A low request of 4 jobs, batches of 4, one high job queued before each batch: each batch
    // went out with room and no high job left, which had counted as the low class served, and
    // the request never aged (a probe's, with a 2 s deadline at an aging of 0.2 s: 408).
    let stage = stage(4, 100);
    let seat = stage.worker_joined();
    let low = (0..4).map(|_| classed(b"low", Class::Low, None, 1));
    let (jobs, _answers): (Vec<Job>, Vec<_>) = low
        .map(|(mut job, answer)| {
            job.deadline += Duration::from_secs(55);
            (job, answer)
        })
        .unzip();
    stage.submit_all(jobs).unwrap();
    let start = Instant::now();
    let taken = loop {
        let _high = submit_high(&stage, 1);
        let batch = seat.next_batch().await;
        if payloads(&batch).contains(&&b"low"[..]) {
            break payloads(&batch).len();
        }
        assert_eq!(payloads(&batch), [b"h"], "the low request does not fit beside it");
        let waited = start.elapsed();
        assert!(waited < DEFAULT_AGING * 3, "not promoted after {waited:?}");
        tokio::time::advance(Duration::from_millis(100)).await;
        seat.finished(1, 1, Duration::from_millis(100));
    };
    // Promoted to high after two periods, it goes before the high job queued after it.
    assert_eq!(taken, 4);
    assert!(start.elapsed() >= DEFAULT_AGING * 2);
}

#[tokio::test(start_paused = true)]
async fn requests_behind_a_busy_worker_with_nothing_higher_queued_keep_their_class() {
    // A slow batch of low jobs, more low ones queued behind it, nothing higher: the class was
    // served, and its wait is the worker's, not the higher classes'. They had been promoted all
    // the same, and a slow first stage sent them into the next as high.
    let stage = Arc::new(stage(4, 100));
    let seat = stage.worker_joined();
    let lows: Vec<_> = (0..5).map(|_| classed(b"low", Class::Low, None, 1)).collect();
    let (jobs, _answers): (Vec<Job>, Vec<_>) = lows
        .into_iter()
        .map(|(mut job, answer)| {
            job.deadline += Duration::from_secs(55);
            (job, answer)
        })
        .unzip();
    for job in jobs {
        stage.submit(job).unwrap();
    }
    assert_eq!(seat.next_batch().await.len(), 4);
    tokio::time::advance(DEFAULT_AGING * 5).await;
    assert_eq!(stage.queued_by_class(), [1, 0, 0], "low still");
    // A high job whose client left before any batch took it holds nothing back once it is gone.
    let (mut gone, answer) = classed(b"gone", Class::High, None, 1);
    gone.deadline += Duration::from_secs(25);
    stage.submit(gone).unwrap();
    drop(answer);
    stage.purge();
    tokio::time::advance(DEFAULT_AGING * 5).await;
    assert_eq!(stage.queued_by_class(), [1, 0, 0], "low still, the high job gone");
    // A high job that comes holds it back from then: two periods on, it competes as high.
    let _high = submit_high(&stage, 1);
    tokio::time::advance(DEFAULT_AGING * 2).await;
    assert_eq!(stage.queued_by_class(), [0, 0, 2]);
    std::mem::forget(seat);
}

/// A stage whose one worker is busy with a batch of one low job: nothing is taken meanwhile.
async fn busy_with_a_low_batch(stage: &Stage) -> (WorkerSeat<'_>, oneshot::Receiver<Reply>) {
    let seat = stage.worker_joined();
    let (mut first, answer) = classed(b"first", Class::Low, None, 1);
    first.deadline += Duration::from_secs(55);
    stage.submit(first).unwrap();
    assert_eq!(seat.next_batch().await.len(), 1);
    (seat, answer)
}

fn queued(stage: &Stage, name: &'static [u8], class: Class) -> oneshot::Receiver<Reply> {
    let (mut job, answer) = classed(name, class, None, 1);
    job.deadline += Duration::from_secs(55);
    stage.submit(job).unwrap();
    answer
}

#[tokio::test(start_paused = true)]
async fn a_promotion_due_before_a_higher_job_left_unbatched_is_not_lost() {
    // Held back by a high job for 1.5 periods, nothing looking meanwhile; the high job's client
    // leaves and a purge takes it out: the low request had been due a period in, and its clock
    // stopped with the promotion never made.
    let stage = Arc::new(stage(4, 100));
    let (seat, _first) = busy_with_a_low_batch(&stage).await;
    let _low = queued(&stage, b"low", Class::Low);
    drop(queued(&stage, b"high", Class::High));
    tokio::time::advance(DEFAULT_AGING * 3 / 2).await;
    stage.purge();
    assert_eq!(stage.queued_by_class(), [0, 1, 0]);
    std::mem::forget(seat);
}

#[tokio::test(start_paused = true)]
async fn higher_work_put_back_holds_back_from_then_not_from_an_earlier_promotion() {
    // A normal and a low request behind a busy worker; nothing looks for 12 s (aging 5 s). A
    // high job is put back (its worker died): the low request, due at 5 s, was promoted at the
    // next look with the normal class's clock taken back to 5 s, and both went high at once.
    let stage = stage(4, 100);
    let (seat, _first) = busy_with_a_low_batch(&stage).await;
    let _normal = queued(&stage, b"normal", Class::Normal);
    let _low = queued(&stage, b"low", Class::Low);
    tokio::time::advance(DEFAULT_AGING * 12 / 5).await;
    let (mut high, _high) = classed(b"high", Class::High, None, 1);
    high.deadline += Duration::from_secs(55);
    stage.requeue(vec![high]);
    assert_eq!(stage.queued_by_class(), [0, 2, 1]);
    std::mem::forget(seat);
}
