//! The streaming pull loop's bookkeeping, driven directly: chunks for a client that fell behind,
//! how long a worker may stay silent, and which departures reach the worker as cancels.

use std::time::Duration;

use bytes::Bytes;
use corral_protocol::{Chunk, Chunks, JobId, JobResult, ResultStatus, Results};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use super::*;
use crate::job::Reply;
use crate::stage::{BatchSettings, Policy};

fn stage() -> Stage {
    let settings = BatchSettings {
        max_batch_size: 8,
        max_wait: Duration::ZERO,
        max_batch_bytes: 1 << 20,
        max_job_bytes: 1 << 20,
        max_batch_weight: None,
        policy: Policy::Fixed,
        prefetch: false,
        batch_timeout: None,
    };
    Stage::new("default", settings, 100)
}

fn state(cancels: bool) -> State {
    State {
        held: HashMap::new(),
        busy: None,
        joins: false,
        first: HashMap::new(),
        seq: 0,
        departures: Departures::new(cancels),
        cancels,
        stream_timeout: Duration::from_secs(300),
        batch_timeout: None,
        alone: false,
    }
}

/// An outbox whose worker end is kept (and never read): frames to it are only queued.
fn outbox() -> (Outbox, UnixStream) {
    let (proxy_end, worker_end) = UnixStream::pair().expect("a socket pair");
    let (_read, write) = proxy_end.into_split();
    (Outbox::new(write), worker_end)
}

static SERVED: std::sync::LazyLock<crate::supervisor::Served> =
    std::sync::LazyLock::new(Default::default);

fn by() -> Worker<'static> {
    Worker { stage: "default", pid: 1, shared: None, served: &SERVED }
}

fn job(arrived: Instant, budget: Duration) -> (Job, oneshot::Receiver<Reply>) {
    Job::new(JobId::new(), Bytes::from_static(b"\xc0"), arrived, arrived + budget)
}

/// A `bin 8` of `n` bytes of `tag`: one msgpack value of `n + 2` bytes.
fn bin(tag: u8, n: u8) -> Bytes {
    let mut value = vec![0xc4, n];
    value.extend(std::iter::repeat_n(tag, n.into()));
    Bytes::from(value)
}

fn frame(id: JobId, chunks: &[Bytes]) -> Chunks {
    Chunks { chunks: chunks.iter().map(|data| Chunk { id, data: data.clone() }).collect() }
}

#[tokio::test]
async fn a_chunk_refused_for_a_slow_client_ends_its_stream_there() {
    // One frame carries chunk 1, refused (the client has not read chunk 0 and the two pass the
    // bound), and chunk 2, small enough to fit: the client must not get 2 after the gap.
    let stage = stage();
    let seat = stage.worker_joined();
    let (mut outbox, _worker) = outbox();
    let (sink, mut source) = crate::stream::channel(150);
    let (mut job, reply) = job(Instant::now(), Duration::from_secs(5));
    job.stream = Some(sink);
    let id = job.id;
    let mut state = state(false);
    state.hold(&mut outbox, vec![job], &by());
    assert!(state.chunks(&mut outbox, &seat, frame(id, &[bin(0, 98)])).is_ok());
    assert!(state.chunks(&mut outbox, &seat, frame(id, &[bin(1, 98), bin(2, 8)])).is_ok());
    let mut seen = Vec::new();
    while let Some(chunk) = source.try_next() {
        seen.push(chunk[2]);
    }
    assert_eq!(seen, [0], "the chunks the client got");
    assert_eq!(reply.await.expect("answered").outcome, Outcome::SlowClient);
}

#[tokio::test(start_paused = true)]
async fn a_worker_may_stay_silent_as_long_as_its_jobs_routes_allow_however_long_they_queued() {
    // A job that waited 4 s of its 5 in the queue is sent with 1 s left (`timeout_ms`). Its
    // worker may still be silent the job's whole 5 s: with the time left, a job queued behind a
    // long batch got a worker that paused between chunks killed as hung.
    let (mut outbox, _worker) = outbox();
    let arrived = Instant::now();
    let (job, _reply) = job(arrived, Duration::from_secs(5));
    tokio::time::advance(Duration::from_secs(4)).await;
    let mut state = state(false);
    state.hold(&mut outbox, vec![job], &by());
    assert_eq!(state.clocks().silence, Duration::from_secs(5));
}

#[tokio::test]
async fn jobs_the_worker_skipped_expired_are_no_first_chunk_nor_work() {
    // A streaming worker answers `expired` at once the jobs whose deadline passed before it
    // got to them: learned, a slowed model's own expiries had taught it that batches cost
    // nothing, a first chunk coming at once.
    let stage = stage();
    let seat = stage.worker_joined();
    let (mut outbox, _worker) = outbox();
    let (a, _a_reply) = job(Instant::now(), Duration::from_secs(5));
    let (b, _b_reply) = job(Instant::now(), Duration::from_secs(5));
    let skipped = |job: &Job| JobResult {
        id: job.id,
        status: ResultStatus::Expired,
        data: None,
        message: None,
        content_type: None,
    };
    let results = Results { results: vec![skipped(&a), skipped(&b)] };
    let mut state = state(false);
    state.hold(&mut outbox, vec![a, b], &by());
    assert!(state.results(&seat, results).is_ok());
    assert!(state.first.is_empty(), "the batch still waits for a first chunk");
    let (since, size, weight) = state.busy.expect("the worker was busy");
    assert_eq!((size, weight), (2, 0), "the jobs it skipped count as work");
    seat.released(size, weight, since.elapsed(), false);
    assert_eq!(stage.cost(), None, "a cost was learned of no work");
}

#[tokio::test]
async fn a_departure_under_the_id_of_a_job_still_waited_for_is_not_told() {
    // A pipeline that lists a stage twice brings a request back under the same id: the
    // departure of its first step's job must not cancel the second step's.
    let (mut outbox, _worker) = outbox();
    let (live, _live_reply) = job(Instant::now(), Duration::from_secs(5));
    let (gone, _gone_reply) = job(Instant::now(), Duration::from_secs(5));
    let (live_id, gone_id) = (live.id, gone.id);
    gone.left.cancel();
    let mut state = state(true);
    state.hold(&mut outbox, vec![live, gone], &by());
    state.cancel(&mut outbox, live_id);
    state.cancel(&mut outbox, gone_id);
    assert!(!state.held[&live_id].cancelled, "a job still waited for was cancelled");
    assert!(state.held[&gone_id].cancelled, "a job whose client left was not");
}

#[tokio::test]
async fn an_answer_gathered_past_one_frame_is_failed_and_its_chunks_let_go() {
    let stage = stage();
    let seat = stage.worker_joined();
    let (mut outbox, _worker) = outbox();
    let (job, reply) = job(Instant::now(), Duration::from_secs(5));
    let id = job.id;
    let mut state = state(false);
    state.hold(&mut outbox, vec![job], &by());
    // One MiB `bin 32`, the same buffer each time: 65 of them pass the 64 MiB of one answer.
    let mut value = vec![0xc6];
    value.extend_from_slice(&(1u32 << 20).to_be_bytes());
    value.resize(5 + (1 << 20), 0);
    let chunk = Bytes::from(value);
    let chunks = vec![chunk; 65];
    assert!(state.chunks(&mut outbox, &seat, frame(id, &chunks)).is_ok());
    let Outcome::Failed(why) = reply.await.expect("answered").outcome else { panic!() };
    assert!(why.contains("larger than one answer"), "{why}");
    assert!(state.held[&id].gathered.count == 0, "the gathered chunks are kept");
}

#[tokio::test(start_paused = true)]
async fn chunks_for_a_one_shot_client_that_left_or_had_its_408_are_not_gathered() {
    // A worker that does not listen for `cancel` streams on: the proxy held up to 64 MiB a job
    // of chunks nobody would have (1.3 GB for a batch of 16 past its deadline).
    let stage = stage();
    let seat = stage.worker_joined();
    let (mut outbox, _worker) = outbox();
    let (waiting, _waiting_reply) = job(Instant::now(), Duration::from_secs(60));
    let (left, _left_reply) = job(Instant::now(), Duration::from_secs(60));
    let (expiring, _expiring_reply) = job(Instant::now(), Duration::from_secs(1));
    let ids = [waiting.id, left.id, expiring.id];
    let mut state = state(false);
    state.hold(&mut outbox, vec![waiting, left, expiring], &by());
    let all = |state: &mut State, outbox: &mut Outbox| {
        let chunks = ids.iter().map(|&id| Chunk { id, data: bin(0, 8) }).collect();
        assert!(state.chunks(outbox, &seat, Chunks { chunks }).is_ok());
    };
    all(&mut state, &mut outbox);
    assert!(ids.iter().all(|id| state.held[id].gathered.count == 1), "each waited for");
    state.held[&ids[1]].job.as_ref().unwrap().left.cancel();
    state.cancel(&mut outbox, ids[1]);
    tokio::time::advance(Duration::from_secs(2)).await;
    all(&mut state, &mut outbox);
    let gathered: Vec<u32> = ids.iter().map(|id| state.held[id].gathered.count).collect();
    assert_eq!(gathered, [2, 0, 0], "the chunks kept for the one still waited for, alone");
}

#[test]
fn a_gathered_answer_never_holds_more_than_one_frame_s_room() {
    // Checked after the copy and doubled past the bound, one job's buffer had reached 128 MiB
    // (and the allocator held the smaller ones it left a while more).
    let mut gathered = Gathered::default();
    let chunk = vec![0xc0; (1 << 20) - 1]; // a MiB less one byte of nils, 2^20 - 1 values
    while gathered.push(&chunk) {
        assert!(gathered.bytes.capacity() <= Gathered::MOST + Gathered::HEAD);
    }
    assert_eq!(gathered.count, 64, "as many as fit");
    assert!(gathered.bytes.len() - Gathered::HEAD + chunk.len() > Gathered::MOST);
    assert!(gathered.push(&[0xc0; 64]), "a smaller one still fits");
    // An `ok` result's data after the chunks is held to the same bound (appended unchecked,
    // it had doubled the buffer past it).
    let full = Gathered { bytes: gathered.bytes.clone(), count: gathered.count };
    assert!(full.array(Some(&[0xc0])).is_none(), "one more value than an answer holds");
    let mut some = Gathered::default();
    assert!(some.push(&[0xc0; 1000]));
    assert!(some.array(Some(&vec![0xc0; Gathered::MOST - 1000])).is_some(), "up to the bound");
}

#[test]
fn gathered_chunks_are_one_msgpack_array_whatever_its_head() {
    for count in [0usize, 1, 15, 16, 70_000] {
        let mut gathered = Gathered::default();
        (0..count).for_each(|i| assert!(gathered.push(&rmp_serde::to_vec(&(i % 100)).unwrap())));
        let array: Vec<u64> =
            rmp_serde::from_slice(&gathered.array(Some(&[0x07])).unwrap()).unwrap();
        assert_eq!(array.len(), count + 1);
        assert_eq!(array[count], 7);
        assert!(array[..count].iter().enumerate().all(|(i, &v)| v == (i % 100) as u64));
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_chunk_past_the_deadline_opens_no_stream_before_the_clients_timer_fires() {
    // The client's timer has not fired (its `left` token is not cancelled): the chunk came a
    // moment past the deadline. It had opened a 200 stream; the client gets its 408, the chunk
    // is not pushed, the worker is told to stop, and the chunk counts as a late result.
    let stage = stage();
    let seat = stage.worker_joined();
    let (mut outbox, _worker) = outbox();
    let (sink, mut source) = crate::stream::channel(1 << 20);
    let (mut late_job, mut reply) = job(Instant::now(), Duration::from_secs(1));
    late_job.stream = Some(sink);
    let id = late_job.id;
    let mut state = state(true);
    state.hold(&mut outbox, vec![late_job], &by());
    let late = || metrics().late_results.get();
    let before = late();
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(state.chunks(&mut outbox, &seat, frame(id, &[bin(0, 8)])).is_ok());
    assert_eq!(reply.try_recv().expect("answered at once").outcome, Outcome::Expired);
    assert!(source.try_next().is_none(), "no chunk reached the client");
    assert!(state.held[&id].cancelled, "the worker is told to stop");
    assert!(late() > before, "counted late");
    // A chunk in time opens the stream as ever.
    let (sink, mut source) = crate::stream::channel(1 << 20);
    let (mut timely, _reply) = job(Instant::now(), Duration::from_secs(1));
    timely.stream = Some(sink);
    let id = timely.id;
    state.hold(&mut outbox, vec![timely], &by());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(state.chunks(&mut outbox, &seat, frame(id, &[bin(1, 8)])).is_ok());
    assert_eq!(source.try_next().expect("pushed")[2], 1);
}
