//! Settling the jobs a worker held: pairing a `results` frame with its batch, answering each job,
//! and handing back the jobs of a worker that failed — to the queue for another worker, or 500.

use std::collections::HashMap;

use corral_protocol::{JobId, ResultStatus, Results};
use tokio::time::Instant;
use tracing::debug;

use crate::http::format;
use crate::job::{Job, Outcome};
use crate::metrics::{metrics, Place};
use crate::msgpack;
use crate::stage::WorkerSeat;

/// Why a results frame cannot be trusted, and every job of its batch, handed back.
pub type Untrusted = (String, Vec<Job>);

/// What a client is told for an `invalid` or `error` result that carries no message.
pub const NO_REASON: &str = "the worker gave no reason";

/// Pairs each job of a batch with its outcome. The whole frame is checked before any job is
/// answered: a result for an unknown or repeated id, a missing result, or an `ok` without data
/// hands every job of the batch back to the caller, which closes the connection, since the worker
/// can no longer be trusted. An `ok` whose data is not exactly one well-formed msgpack value (one
/// skip-pass, as for request bodies) fails that job alone ([`Outcome::BadOutput`]): the worker
/// kept the protocol, its model's output is broken.
///
/// `sent_after` is the batch sent ahead, if any: a result for one of its jobs is named as an
/// answer out of order rather than an unknown id.
pub fn pair(
    jobs: Vec<Job>,
    results: Results,
    sent_after: &[Job],
) -> Result<Vec<(Job, Outcome)>, Untrusted> {
    // Each job with its place in the batch: jobs handed back go back in the batch's order.
    let mut pending: HashMap<JobId, (usize, Job)> =
        jobs.into_iter().enumerate().map(|(at, job)| (job.id, (at, job))).collect();
    let mut answers: Vec<(usize, Job, Outcome)> = Vec::with_capacity(pending.len());
    let mut problem = None;
    // A result is named by its place in the frame, not by its job's id: the message reaches
    // every client of the batch, and a job's id is its own client's (`x-request-id`).
    for (index, result) in results.results.into_iter().enumerate() {
        let Some((at, job)) = pending.remove(&result.id) else {
            let what = if sent_after.iter().any(|job| job.id == result.id) {
                "is for a job of the batch sent after the one being answered: answer batches in \
                 the order they came, each in its own frame"
            } else if answers.iter().any(|(_, job, _)| job.id == result.id) {
                "answers a job answered before in the frame"
            } else {
                "is for a job id not in the batch"
            };
            problem = Some(format!("the result at index {index} of the frame {what}"));
            break;
        };
        let outcome = match (result.status, result.data) {
            (ResultStatus::Ok, Some(data)) => output(data, result.content_type),
            // Any status answers a cancel (PROTOCOL.md), an `ok` without data too: nobody waits
            // for its data.
            (ResultStatus::Ok, None) if job.left.is_cancelled() => Outcome::Expired,
            (ResultStatus::Ok, None) => {
                problem =
                    Some(format!("the result at index {index} of the frame is ok without data"));
                answers.push((at, job, Outcome::WorkerLost(String::new())));
                break;
            }
            (ResultStatus::Invalid, _) => Outcome::Invalid(reason(result.message)),
            (ResultStatus::Error, _) => Outcome::Failed(reason(result.message)),
            (ResultStatus::Expired, _) => Outcome::Expired,
            // The usual answer to a `cancel`, which a worker that declared it is sent streaming
            // or not (PROTOCOL.md): nobody waits for it. Taken for a broken frame, it had cost
            // the worker its connection and its batch-mates their answers. With data too: any
            // status answers a cancel.
            (ResultStatus::End, _) if job.left.is_cancelled() => Outcome::Expired,
            (ResultStatus::End, _) => {
                problem = Some(format!(
                    "the result at index {index} of the frame ends a stream that was never started"
                ));
                answers.push((at, job, Outcome::WorkerLost(String::new())));
                break;
            }
        };
        answers.push((at, job, outcome));
    }
    if problem.is_none() && !pending.is_empty() {
        problem = Some(format!("{} job(s) of the batch have no result", pending.len()));
    }
    match problem {
        None => Ok(answers.into_iter().map(|(_, job, outcome)| (job, outcome)).collect()),
        Some(why) => {
            let mut jobs: Vec<(usize, Job)> =
                answers.into_iter().map(|(at, job, _)| (at, job)).collect();
            jobs.extend(pending.into_values());
            jobs.sort_unstable_by_key(|(at, _)| *at);
            Err((why, jobs.into_iter().map(|(_, job)| job).collect()))
        }
    }
}

/// The weight of the jobs a worker ran of a batch it answered: not those it answered
/// `expired`, which it skipped (their deadline passed before it got to them). What the batch's
/// duration is learned for: a batch sent ahead whose jobs all expired while it waited is
/// answered at once, and learned as a full batch it had taught a model that had become five
/// times slower that batches cost almost nothing (its own expiries, in a loop).
pub fn ran(answers: &[(Job, Outcome)]) -> usize {
    let ran = answers.iter().filter(|(_, outcome)| !matches!(outcome, Outcome::Expired));
    ran.map(|(job, _)| job.weight as usize).sum()
}

/// An `ok` result's data and content type: the job's answer if the data is exactly one
/// well-formed msgpack value; a model's broken output fails that job alone (`bad_output`).
///
/// A `content_type` must be a media type ([`format::media_type`]): one that is not (a typo such
/// as `image png`, a control character, more than 1 KiB) is a broken output too, so that the
/// mistake shows on the first request rather than as raw bytes of no type. It names the type of
/// raw bytes, so it is kept only with data that is one msgpack `bin`, and dropped otherwise.
pub fn output(data: bytes::Bytes, content_type: Option<String>) -> Outcome {
    if let Err(e) = msgpack::check(&data) {
        return Outcome::BadOutput(format!(
            "the worker's output for this job is not one well-formed msgpack value: {e}"
        ));
    }
    let Some(named) = content_type else {
        return Outcome::Done(data, None);
    };
    // With data that is not one `bin` the type names nothing, and is ignored, checked or not
    // (PROTOCOL.md): such a job had failed `bad_output` for a type no client would have seen.
    if msgpack::bin_contents(&data).is_none() {
        return Outcome::Done(data, None);
    }
    match format::media_type(&named) {
        // `*/*` or `image/*` passes as tokens, but names no type: a response's Content-Type
        // must name one (RFC 9110 8.3), and it had been sent to the client as it was.
        Some(_) if format::is_range(&named) => Outcome::BadOutput(format!(
            "the worker's content_type for this job is a range of media types, not one: {:?}",
            named.chars().take(100).collect::<String>()
        )),
        Some(media_type) => Outcome::Done(data, Some(media_type)),
        None => {
            let shown: String = named.chars().take(100).collect();
            let most = format::MAX_MEDIA_TYPE;
            // A long one may well be a media type (a long parameter): "not a media type" misled.
            Outcome::BadOutput(if named.len() > most {
                format!(
                    "the worker's content_type for this job is {} bytes, longer than the {most} \
                     a media type may have: {shown:?}…",
                    named.len()
                )
            } else {
                format!(
                    "the worker's content_type for this job is not a media type (type/subtype): \
                     {shown:?}"
                )
            })
        }
    }
}

/// The message of an `invalid` or `error` result; a missing or empty one becomes [`NO_REASON`],
/// so that the client is never answered with an empty message.
pub fn reason(message: Option<String>) -> String {
    message.filter(|m| !m.is_empty()).unwrap_or_else(|| NO_REASON.to_string())
}

/// A job whose worker is gone or untrustworthy, and whether its batch ever reached that worker.
pub struct Orphan {
    pub job: Job,
    pub reached: bool,
}

impl Orphan {
    /// Whether [`give_back`] at `now` puts the job back in the queue (else it is answered).
    pub fn goes_back(&self, now: Instant) -> bool {
        let live = !self.job.is_expired(now) && !self.job.is_abandoned();
        live && (!self.reached || self.job.retries > 0)
    }
}

/// Jobs whose worker is gone or untrustworthy, oldest first: those with time left before their
/// deadline go back to the front of the queue, in the same order, for the next idle worker. A
/// job whose batch reached the worker costs one of its retries (the worker may have run it, and
/// a poison input must not kill worker after worker) and goes on alone ([`Job::alone`]: which of
/// the batch's jobs killed it nobody can tell); one whose batch never did costs nothing.
/// The others are answered 500 (`worker_died`), or 408 where their deadline has passed.
pub fn give_back(seat: &WorkerSeat<'_>, orphans: Vec<Orphan>, why: &str, now: Instant) {
    let mut retry = Vec::new();
    let mut retried = 0;
    let told = format!("the worker failed: {}", super::words::told_clients(why));
    for orphan in orphans {
        let goes_back = orphan.goes_back(now);
        let Orphan { mut job, reached } = orphan;
        if goes_back {
            if reached {
                debug!(request_id = %job.id, "job goes back to the queue for another worker");
                job.retries -= 1;
                job.alone = true;
                retried += 1;
            }
            retry.push(job);
        } else {
            debug!(request_id = %job.id, reason = why, "job failed with its worker");
            // Past its deadline, whether or not its client's timer has fired yet, the client
            // gets the 408 its deadline says, as a late result does (`answer_result`): a worker
            // dying a millisecond after it had answered 500 `worker_died` or 408 by which ran
            // first, the 500 in no expiry count. A stream that has begun is past that.
            let outcome = if job.is_expired(now) && !streamed(&job) {
                Outcome::Expired
            } else {
                Outcome::WorkerLost(told.clone())
            };
            answer(job, outcome, now);
        }
    }
    if retried > 0 {
        metrics().retried.with_label_values(&[seat.stage_name()]).inc_by(retried);
    }
    if !retry.is_empty() {
        seat.requeue(retry);
    }
}

/// Answers a job that a worker held. Nobody listening means the client got its 408 already or
/// disconnected (a cancelled job): either is counted, now that the worker has given the job back;
/// so is a stream the connection ended at its timeout, though its client may still be there.
pub fn answer(job: Job, outcome: Outcome, now: Instant) {
    // A stream that had chunks ended for its client as a 200 (its timeout's error event, or the
    // client leaving): past its deadline, the job is cancelled, not a 408 nor a late result.
    let streamed = streamed(&job);
    let expired = job.is_expired(now) && !streamed;
    // A stream the connection ended at its timeout while its client was not reading
    // (`streaming::State::end_streams`): its answer still reaches the client, yet the job was
    // cancelled in the worker all the same, and had been in no count.
    let ended_for_the_worker = streamed && job.left.is_cancelled();
    // A worker may skip a job as expired a little before the proxy's own clock says so (its
    // deadline is sent as time left, read on another clock): its client gets that 408 now,
    // and the expiry is counted as one the proxy saw would be (it had been in no count).
    let said_expired = matches!(outcome, Outcome::Expired);
    // Ended by its answer with an error its client got (a chunk with no JSON form): nobody
    // waits any more, yet no client left; it had been counted cancelled.
    let ended_here = job.stream.as_ref().is_some_and(|stream| stream.ended_here());
    if job.answer(outcome) {
        if ended_for_the_worker || (said_expired && streamed) {
            // A stream the worker gave up on after chunks: its client had a 200 stream, ended
            // by an error event; cancelled, as a streamed job past its deadline is.
            metrics().cancelled(Place::Worker).inc();
        } else if said_expired {
            metrics().expired(Place::Worker).inc();
        }
        return;
    }
    if ended_here {
        return;
    }
    let count =
        if expired { metrics().expired(Place::Worker) } else { metrics().cancelled(Place::Worker) };
    count.inc();
}

/// Answers a job with the result its worker sent: one that came after the job's deadline is
/// also a late result (a job given back because its worker failed is not: no result came).
/// A result at or past the deadline is late whether or not its client's timer has fired yet:
/// the client gets the 408 its deadline says. (The timer has a millisecond's grain and its
/// handler may not have run: a result a millisecond or two late had gone out as a 200, in no
/// count, beside results as late answered 408 and counted.) A stream that has begun is past
/// that: its client has a 200 already. (A stream's first chunk is held to the deadline alike,
/// where it comes: `streaming::State::chunks`.)
pub fn answer_result(job: Job, outcome: Outcome, now: Instant) {
    let late = is_late(&job, &outcome, now);
    let outcome = if late { Outcome::Expired } else { outcome };
    // Either way `answer` counts the 408 as an expiry in the worker: the client is told now,
    // or was told by its own timer.
    answer(job, outcome, now);
    if late {
        metrics().late_results.inc();
    }
}

/// Whether `outcome` came for `job` at or past its deadline, a result its client must not get:
/// not the worker's own `expired` (a job it skipped brought no result: nothing ran), nor a
/// stream's end once its client has a 200.
fn is_late(job: &Job, outcome: &Outcome, now: Instant) -> bool {
    job.is_expired(now) && !streamed(job) && !matches!(outcome, Outcome::Expired)
}

/// Whether a chunk of the job went to its streaming client: it has a 200 already.
fn streamed(job: &Job) -> bool {
    job.stream.as_ref().is_some_and(|stream| stream.started())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use corral_protocol::JobResult;
    use tokio::sync::oneshot;

    use super::*;
    use crate::job::Reply;
    use crate::stage::{BatchSettings, Policy, Stage};

    fn stage() -> Stage {
        let settings = BatchSettings {
            max_batch_size: 8,
            max_wait: Duration::ZERO,
            max_batch_bytes: 1000,
            max_job_bytes: 1 << 20,
            max_batch_weight: None,
            policy: Policy::Fixed,
            prefetch: true,
            batch_timeout: None,
        };
        Stage::new("default", settings, 100)
    }

    fn orphan(
        payload: &'static [u8],
        retries: u32,
        reached: bool,
    ) -> (Orphan, oneshot::Receiver<Reply>) {
        let now = Instant::now();
        let (mut job, answer) =
            Job::new(JobId::new(), Bytes::from_static(payload), now, now + Duration::from_secs(5));
        job.retries = retries;
        (Orphan { job, reached }, answer)
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_workers_batches_go_back_oldest_first() {
        let stage = stage();
        let seat = stage.worker_joined();
        // The batch the worker held (a, b), then the batch sent ahead (c), which it never read.
        let (a, _a) = orphan(b"a", 1, true);
        let (b, _b) = orphan(b"b", 1, true);
        let (c, _c) = orphan(b"c", 1, false);
        let (d, _d) = orphan(b"d", 1, false);
        give_back(&seat, vec![a, b, c, d], "died", Instant::now());
        // The jobs the worker had in hand go alone (one of them may have killed it), each having
        // spent a retry; those it never read go together, as they came, and spent none.
        for (payloads, retries) in
            [(vec![b"a"], vec![0]), (vec![b"b"], vec![0]), (vec![b"c", b"d"], vec![1, 1])]
        {
            let batch = seat.next_batch().await;
            assert_eq!(batch.iter().map(|job| job.retries).collect::<Vec<_>>(), retries);
            assert_eq!(payloads_of(batch), payloads);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_the_worker_never_saw_costs_nothing_even_without_retries() {
        let stage = stage();
        let seat = stage.worker_joined();
        let (unseen, mut unseen_answer) = orphan(b"unseen", 0, false);
        let (seen, seen_answer) = orphan(b"seen", 0, true);
        give_back(&seat, vec![unseen, seen], "died", Instant::now());
        assert!(matches!(seen_answer.await.map(|r| r.outcome), Ok(Outcome::WorkerLost(_))));
        assert!(unseen_answer.try_recv().is_err(), "not answered: queued again");
        assert_eq!(payloads_of(seat.next_batch().await), [b"unseen"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_whose_worker_dies_at_its_deadline_is_a_408_though_the_client_still_waits() {
        // The client's own timer had not run yet: the job was answered 500 `worker_died`, a
        // run or two in ten where the worker died as the deadline passed.
        let stage = stage();
        let seat = stage.worker_joined();
        let (held, answer) = orphan(b"held", 1, true);
        let at_deadline = held.job.deadline;
        give_back(&seat, vec![held], "died", at_deadline);
        assert_eq!(answer.await.map(|r| r.outcome), Ok(Outcome::Expired));
    }

    #[test]
    fn a_job_skipped_as_expired_after_its_408_is_no_late_result() {
        let past = Instant::now() + Duration::from_secs(6);
        let (skipped, _) = orphan(b"skipped", 0, true);
        assert!(!is_late(&skipped.job, &Outcome::Expired, past), "skipped: nothing ran");
        let done = Outcome::Done(Bytes::from_static(b"\xc0"), None);
        assert!(is_late(&skipped.job, &done, past), "a result after the deadline is late");
        assert!(!is_late(&skipped.job, &done, Instant::now()), "one before it is not");
    }

    #[tokio::test]
    async fn a_result_past_the_deadline_is_a_408_though_the_client_still_waits() {
        // The client's timer has not fired yet (its handler has not run): it still listens.
        let (ran, mut client) = orphan(b"ran", 0, true);
        let late = metrics().late_results.get();
        let expired = metrics().expired(Place::Worker).get();
        let done = Outcome::Done(Bytes::from_static(b"\xc0"), None);
        answer_result(ran.job, done, Instant::now() + Duration::from_secs(6));
        assert!(matches!(client.try_recv().map(|r| r.outcome), Ok(Outcome::Expired)));
        assert!(metrics().late_results.get() > late, "counted late");
        assert!(metrics().expired(Place::Worker).get() > expired, "and expired");
        // Before its deadline, the result is the answer.
        let (ran, mut client) = orphan(b"ran", 0, true);
        let done = Outcome::Done(Bytes::from_static(b"\xc0"), None);
        answer_result(ran.job, done, Instant::now());
        assert!(matches!(client.try_recv().map(|r| r.outcome), Ok(Outcome::Done(..))));
    }

    fn payloads_of(batch: Vec<Job>) -> Vec<Vec<u8>> {
        batch.iter().map(|job| job.payload.contiguous().to_vec()).collect()
    }

    fn job() -> Job {
        let now = Instant::now();
        Job::new(JobId::new(), Bytes::from_static(b"\xc0"), now, now + Duration::from_secs(5)).0
    }

    fn result(job: &Job, status: ResultStatus, data: Option<&'static [u8]>) -> JobResult {
        JobResult {
            id: job.id,
            status,
            data: data.map(Bytes::from_static),
            message: None,
            content_type: None,
        }
    }

    /// The outcomes of `pair`, in the batch's order.
    fn outcomes(jobs: Vec<Job>, results: Vec<JobResult>) -> Vec<Outcome> {
        let order: Vec<JobId> = jobs.iter().map(|job| job.id).collect();
        let answers =
            pair(jobs, Results { results }, &[]).unwrap_or_else(|(why, _)| panic!("{why}"));
        let mut by_id: HashMap<JobId, Outcome> =
            answers.into_iter().map(|(job, outcome)| (job.id, outcome)).collect();
        order.iter().map(|id| by_id.remove(id).unwrap()).collect()
    }

    #[test]
    fn the_jobs_a_worker_skipped_expired_are_not_what_it_ran() {
        let mut jobs: Vec<Job> = (0..4).map(|_| job()).collect();
        jobs[3].weight = 5;
        let results = vec![
            result(&jobs[0], ResultStatus::Expired, None),
            result(&jobs[1], ResultStatus::Ok, Some(b"\xc0")),
            result(&jobs[2], ResultStatus::Invalid, None),
            result(&jobs[3], ResultStatus::Ok, Some(b"\xc0")),
        ];
        let answers =
            pair(jobs, Results { results }, &[]).unwrap_or_else(|(why, _)| panic!("{why}"));
        assert_eq!(ran(&answers), 1 + 1 + 5);
        let jobs: Vec<Job> = (0..2).map(|_| job()).collect();
        let results = jobs.iter().map(|job| result(job, ResultStatus::Expired, None)).collect();
        let answers =
            pair(jobs, Results { results }, &[]).unwrap_or_else(|(why, _)| panic!("{why}"));
        assert_eq!(ran(&answers), 0);
    }

    #[test]
    fn output_that_is_not_one_msgpack_value_fails_that_job_alone() {
        let jobs: Vec<Job> = (0..4).map(|_| job()).collect();
        let results = vec![
            result(&jobs[0], ResultStatus::Ok, Some(b"\x92\x01\x02")), // [1, 2]
            result(&jobs[1], ResultStatus::Ok, Some(b"\x01\x02")),     // 1, then a stray byte
            result(&jobs[2], ResultStatus::Ok, Some(b"\x92\x01")),     // [1, …: truncated
            result(&jobs[3], ResultStatus::Ok, Some(b"")),             // nothing at all
        ];
        let outcomes = outcomes(jobs, results);
        assert_eq!(outcomes[0], Outcome::Done(Bytes::from_static(b"\x92\x01\x02"), None));
        for (outcome, expected) in
            outcomes[1..].iter().zip(["1 bytes after the value", "truncated", "empty"])
        {
            let Outcome::BadOutput(why) = outcome else { panic!("{outcome:?}") };
            assert!(why.contains("not one well-formed msgpack value"), "{why}");
            assert!(why.contains(expected), "{why}");
        }
    }

    #[test]
    fn a_content_type_is_kept_with_raw_bytes_dropped_elsewhere_and_checked() {
        let jobs: Vec<Job> = (0..5).map(|_| job()).collect();
        let named = |job: &Job, data: &'static [u8], content_type: &str| JobResult {
            content_type: Some(content_type.into()),
            ..result(job, ResultStatus::Ok, Some(data))
        };
        let results = vec![
            named(&jobs[0], b"\xc4\x03PNG", "image/png"),
            named(&jobs[1], b"\x92\x01\x02", "image/png"), // [1, 2]: not raw bytes
            named(&jobs[2], b"\xc4\x03PNG", "image png"),
            result(&jobs[3], ResultStatus::Ok, Some(b"\xc4\x03PNG")),
            // Not raw bytes: the type is ignored, not checked (it had failed the job).
            named(&jobs[4], b"\x92\x01\x02", "image png"),
        ];
        let outcomes = outcomes(jobs, results);
        let png = Bytes::from_static(b"\xc4\x03PNG");
        assert_eq!(outcomes[0], Outcome::Done(png.clone(), Some("image/png".parse().unwrap())));
        assert_eq!(outcomes[1], Outcome::Done(Bytes::from_static(b"\x92\x01\x02"), None));
        let Outcome::BadOutput(why) = &outcomes[2] else { panic!("{:?}", outcomes[2]) };
        assert!(why.contains("not a media type") && why.contains("image png"), "{why}");
        assert_eq!(outcomes[3], Outcome::Done(png, None));
        assert_eq!(outcomes[4], Outcome::Done(Bytes::from_static(b"\x92\x01\x02"), None));
    }

    #[test]
    fn a_range_of_media_types_names_none_and_fails_its_job() {
        // `*/*` had gone to the client as its answer's Content-Type.
        for range in ["*/*", "image/*", "*/png; q=1"] {
            let Outcome::BadOutput(why) =
                output(Bytes::from_static(b"\xc4\x01x"), Some(range.into()))
            else {
                panic!("{range}")
            };
            assert!(why.contains("a range of media types, not one"), "{why}");
        }
        for named in ["a/b; x=*", "application/vnd.a*b", "image/png*"] {
            let kept = output(Bytes::from_static(b"\xc4\x01x"), Some(named.into()));
            assert!(matches!(kept, Outcome::Done(_, Some(_))), "{named}");
        }
    }

    #[test]
    fn a_content_type_too_long_says_its_length_not_that_it_is_no_media_type() {
        let raw = Bytes::from_static(b"\xc4\x03PNG");
        let long = format!("a/{}", "b".repeat(format::MAX_MEDIA_TYPE - 1));
        let Outcome::BadOutput(why) = output(raw.clone(), Some(long)) else { panic!() };
        assert!(why.contains("1025 bytes, longer than the 1024"), "{why}");
        assert!(!why.contains("not a media type"), "{why}");
        let most = format!("a/{}", "b".repeat(format::MAX_MEDIA_TYPE - 2));
        assert!(matches!(output(raw, Some(most)), Outcome::Done(_, Some(_))));
    }

    #[test]
    fn a_missing_or_empty_message_becomes_no_reason() {
        let jobs: Vec<Job> = (0..4).map(|_| job()).collect();
        let mut results = vec![
            result(&jobs[0], ResultStatus::Invalid, None),
            result(&jobs[1], ResultStatus::Error, None),
            result(&jobs[2], ResultStatus::Error, None),
            result(&jobs[3], ResultStatus::Invalid, None),
        ];
        results[2].message = Some(String::new());
        results[3].message = Some("expected 64 pixels".into());
        assert_eq!(
            outcomes(jobs, results),
            [
                Outcome::Invalid(NO_REASON.into()),
                Outcome::Failed(NO_REASON.into()),
                Outcome::Failed(NO_REASON.into()),
                Outcome::Invalid("expected 64 pixels".into()),
            ]
        );
    }

    #[test]
    fn an_untrusted_frame_hands_its_batch_back_in_the_batchs_order() {
        for results_for in [vec![5, 2, 7], vec![3, 3], vec![]] {
            let jobs: Vec<Job> = (0..8).map(|_| job()).collect();
            let order: Vec<JobId> = jobs.iter().map(|job| job.id).collect();
            let results = results_for
                .iter()
                .map(|&at| result(&jobs[at], ResultStatus::Ok, Some(b"\x01")))
                .collect();
            let (_, back) = pair(jobs, Results { results }, &[]).expect_err("a result is missing");
            let back: Vec<JobId> = back.iter().map(|job| job.id).collect();
            assert_eq!(back, order, "results for {results_for:?}");
        }
    }
}
