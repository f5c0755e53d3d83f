//! The stage queue under tokio's paused clock: every timer rule is checked without sleeping.

use std::time::Duration;

use bytes::Bytes;
use corral_protocol::JobId;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;

const WAIT: Duration = Duration::from_millis(10);

fn stage(max_batch_size: usize, capacity: usize) -> Stage {
    let settings = BatchSettings {
        max_batch_size,
        max_wait: WAIT,
        max_batch_bytes: 100,
    };
    Stage::new("default", settings, capacity)
}

fn job(payload: &'static [u8], timeout: Duration) -> (Job, oneshot::Receiver<Outcome>) {
    let now = Instant::now();
    Job::new(
        JobId::new(),
        Bytes::from_static(payload),
        now,
        now + timeout,
    )
}

fn submit(stage: &Stage, payload: &'static [u8]) -> oneshot::Receiver<Outcome> {
    let (job, answer) = job(payload, Duration::from_secs(5));
    stage.submit(job).expect("queue has room");
    answer
}

fn payloads(batch: &[Job]) -> Vec<&[u8]> {
    batch.iter().map(|j| &j.payload[..]).collect()
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
    let _fresh = submit(&stage, b"fresh");
    let batch = stage.next_batch().await;
    assert_eq!(payloads(&batch), [b"fresh"]);
    assert_eq!(expired.try_recv(), Ok(Outcome::Expired));
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
    assert!(matches!(stage.submit(d), Err(Shed::QueueFull(_))));
    assert_eq!(stage.queued(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_batch_stays_within_its_byte_budget() {
    let stage = stage(8, 10);
    let big: &'static [u8] = &[7; 60];
    let _answers = [
        submit(&stage, big),
        submit(&stage, big),
        submit(&stage, b"x"),
    ];
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
