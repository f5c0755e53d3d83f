//! Settling the jobs a worker held: pairing a `results` frame with its batch, answering each job,
//! and handing back the jobs of a worker that failed — to the queue for another worker, or 500.

use std::collections::HashMap;

use corral_protocol::{JobId, ResultStatus, Results};
use tokio::time::Instant;
use tracing::debug;

use crate::job::{Job, Outcome};
use crate::metrics::metrics;
use crate::stage::WorkerSeat;

/// Why a results frame cannot be trusted, and every job of its batch, handed back.
pub type Untrusted = (String, Vec<Job>);

/// Pairs each job of a batch with its outcome. The whole frame is checked before any job is
/// answered: a result for an unknown or repeated id, a missing result, or an `ok` without data
/// hands every job of the batch back to the caller, which closes the connection, since the worker
/// can no longer be trusted.
pub fn pair(jobs: Vec<Job>, results: Results) -> Result<Vec<(Job, Outcome)>, Untrusted> {
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

/// A job whose worker is gone or untrustworthy, and whether its batch ever reached that worker.
pub struct Orphan {
    pub job: Job,
    pub reached: bool,
}

/// Jobs whose worker is gone or untrustworthy, oldest first: those with time left before their
/// deadline go back to the front of the queue, in the same order, for the next idle worker. A
/// job whose batch reached the worker costs one of its retries (the worker may have run it, and
/// a poison input must not kill worker after worker); one whose batch never did costs nothing.
/// The others are answered 500 (`worker_died`).
pub fn give_back(seat: &WorkerSeat<'_>, orphans: Vec<Orphan>, why: &str) {
    let now = Instant::now();
    let mut retry = Vec::new();
    let mut retried = 0;
    for Orphan { mut job, reached } in orphans {
        let live = !job.is_expired(now) && !job.is_abandoned();
        if live && (!reached || job.retries > 0) {
            if reached {
                debug!(request_id = %job.id, "job goes back to the queue for another worker");
                job.retries -= 1;
                retried += 1;
            }
            retry.push(job);
        } else {
            debug!(request_id = %job.id, reason = why, "job failed with its worker");
            answer(job, Outcome::WorkerLost(format!("the worker failed: {why}")), now);
        }
    }
    if retried > 0 {
        metrics().retried.with_label_values(&[seat.stage_name()]).inc_by(retried);
    }
    if !retry.is_empty() {
        seat.requeue(retry);
    }
}

/// Answers a job that a worker held. Nobody listening means the client got its 408 already (a
/// late result, dropped) or disconnected (a cancelled job): either is counted.
pub fn answer(job: Job, outcome: Outcome, now: Instant) {
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
