//! A pipeline: the stages a route's jobs go through, in order. The output of stage k is the input
//! of stage k+1; each stage queues and batches on its own, with its own workers.
//!
//! The request's handler carries its jobs from stage to stage: it submits them to a stage, waits
//! for their answers, and submits the outputs to the next. A job keeps its id and its deadline
//! the whole way. The first stage that does not answer every job of the request with a result
//! (a 422, a 500, a 408, or a shed at admission) ends the request there: its answer goes to the
//! client at once and no later stage sees its jobs. The jobs of a multi-item request move
//! together, stage by stage, so that they stay batch-mates (see [`Stage::submit_all`]).

use std::sync::Arc;

use bytes::Bytes;
use corral_protocol::JobId;
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::job::{Job, Outcome};
use crate::stage::{Shed, Stage};

pub struct Pipeline {
    pub name: String,
    pub stages: Vec<Arc<Stage>>,
}

impl Pipeline {
    pub fn first(&self) -> &Stage {
        &self.stages[0]
    }

    /// Most jobs one request may carry: what the smallest queue on the way can take at once.
    pub fn capacity(&self) -> usize {
        self.stages.iter().map(|stage| stage.capacity()).min().unwrap_or(0)
    }

    /// Runs the jobs through every stage; one outcome per job, in order. `Err` when a stage
    /// refused them at admission.
    pub async fn run(
        &self,
        jobs: Vec<(JobId, Bytes)>,
        arrived: Instant,
        deadline: Instant,
        retries: u32,
    ) -> Result<Vec<Outcome>, Shed> {
        let ids: Vec<JobId> = jobs.iter().map(|(id, _)| *id).collect();
        let mut jobs = jobs;
        let mut entered = arrived;
        for (k, stage) in self.stages.iter().enumerate() {
            let outcomes = run_stage(stage, jobs, entered, deadline, retries).await?;
            let Some(next) = self.stages.get(k + 1) else {
                return Ok(outcomes);
            };
            // An output too large for the next stage's batches fails its job here.
            let limit = next.settings().max_batch_bytes;
            let outcomes: Vec<Outcome> = outcomes
                .into_iter()
                .map(|outcome| match outcome {
                    Outcome::Done(output) if output.len() > limit => Outcome::Failed(format!(
                        "stage {:?} produced {} bytes, more than stage {:?} takes in a batch",
                        stage.name(),
                        output.len(),
                        next.name()
                    )),
                    other => other,
                })
                .collect();
            let passed = outcomes.iter().all(|outcome| matches!(outcome, Outcome::Done(_)));
            if !passed {
                return Ok(outcomes);
            }
            let inputs = ids
                .iter()
                .zip(outcomes)
                .map(|(id, outcome)| match outcome {
                    Outcome::Done(output) => (*id, output),
                    _ => unreachable!("every outcome was checked to be a result"),
                })
                .collect();
            jobs = inputs;
            // The next stage's batch window counts from the jobs' arrival there.
            entered = Instant::now();
        }
        unreachable!("a pipeline has at least one stage")
    }
}

/// Queues the jobs on one stage (all or none) and waits, until the shared deadline at most, for
/// each answer. A job still unanswered at the deadline is [`Outcome::Expired`].
///
/// Waiting here is what makes 408 hold wherever a job is, queued or inside a worker; and if the
/// client leaves, hyper drops this future with the receivers, so the queue skips the jobs.
async fn run_stage(
    stage: &Stage,
    payloads: Vec<(JobId, Bytes)>,
    arrived: Instant,
    deadline: Instant,
    retries: u32,
) -> Result<Vec<Outcome>, Shed> {
    let (jobs, answers): (Vec<Job>, Vec<_>) = payloads
        .into_iter()
        .map(|(id, payload)| {
            let (mut job, answer) = Job::new(id, payload, arrived, deadline);
            job.retries = retries;
            (job, answer)
        })
        .unzip();
    stage.submit_all(jobs)?;
    let waits = answers.into_iter().map(|answer| async move {
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_elapsed) => Outcome::Expired,
            Ok(Ok(outcome)) => outcome,
            // Only a bug drops a job unanswered; say so rather than hang or guess.
            Ok(Err(_dropped)) => {
                Outcome::WorkerLost("the job was dropped without an answer".into())
            }
        }
    });
    Ok(join_all(waits).await)
}
