//! How batches leave the queue: the pulls of idle workers (a batch now), of busy ones (a batch
//! sent ahead) and of streaming ones (jobs joining a running batch), each waiting under the
//! release policy until a batch is worth taking, then taking it — live jobs only, in the lanes'
//! order, within the batch bounds — and marking the worker's seat in the same locked step.

use tokio::time::Instant;

use super::policy::{self, Release};
use super::{bury, weight_of, Queue, Seat, Stage};
use crate::job::{Job, Outcome};
use crate::metrics::metrics;

/// What a pull found when it looked at the queue ([`Stage::take_when`]).
enum Look {
    /// A batch, already on the worker's seat (empty: everything it reached was dead; look again).
    Took(Vec<Job>),
    /// Nothing worth taking before this instant (None: before the next arrival).
    Until(Option<Instant>),
}

impl Stage {
    /// [`Stage::next_batch_for`] a worker without a seat (free from the call on), for tests.
    #[cfg(test)]
    pub async fn next_batch(&self) -> Vec<Job> {
        self.next_batch_for(None).await
    }

    /// Waits until the policy releases a batch, then takes it: between 1 and `max_batch_size`
    /// live jobs, oldest first. The worker in `slot` (if any) is marked busy with it under the
    /// same lock, so that admission never sees the batch in neither place.
    ///
    /// Cancel-safe: jobs leave the queue only in the same synchronous step that returns them.
    pub(super) async fn next_batch_for(&self, slot: Option<usize>) -> Vec<Job> {
        let called = Instant::now();
        self.take_when(|stage, queue, now| {
            let free_since = slot.map_or(called, |slot| queue.seat(slot).free_since);
            let forecast = queue.forecast(now, stage.settings.max_wait);
            // A worker that takes fewer jobs a batch than the stage's bound: its batch is full,
            // to the policy, at its own bound.
            let settings = stage.settings_for(queue, slot);
            // A job that goes alone ([`Job::alone`]) has no batch to wait for.
            let release = if queue.jobs.alone_first() {
                Release::Now
            } else {
                policy::decide(
                    queue.view(free_since, settings.max_batch_size),
                    now,
                    &settings,
                    &forecast,
                )
            };
            match release {
                Release::Now => {
                    let batch = stage.take_up_to(queue, now, settings.max_batch_size);
                    if let (Some(slot), false) = (slot, batch.is_empty()) {
                        queue.seat(slot).busy = Some((now, weight_of(&batch)));
                    }
                    Look::Took(batch)
                }
                Release::At(at) => Look::Until(Some(at)),
                Release::Idle => Look::Until(None),
            }
        })
        .await
    }

    /// Waits until the stage is saturated — a full batch queued while every connected worker is
    /// busy — then takes that batch for the worker in `slot` to find when it is done. An idle
    /// worker always gets work before one is sent ahead, and a batch goes ahead only if each of
    /// its jobs can wait out the worker's current batch and still make its deadline (by the
    /// learned cost; with none learned yet, nothing goes ahead). The batch is recorded on the
    /// seat under the same lock that takes it. Cancel-safe like [`Stage::next_batch_for`].
    pub(super) async fn next_batch_ahead(&self, slot: usize) -> Vec<Job> {
        self.take_when(|stage, queue, now| {
            let max = stage.settings_for(queue, Some(slot)).max_batch_size;
            let budget = stage.settings.max_batch_weight;
            let full = queue.jobs.len() >= max
                || queue.jobs.bytes() >= stage.settings.max_batch_bytes
                || budget.is_some_and(|budget| queue.jobs.weight() as usize >= budget);
            let all_busy = queue.seats.iter().flatten().all(|seat| seat.busy.is_some());
            let (true, true, Some(cost)) = (full, all_busy, queue.cost.estimate()) else {
                return Look::Until(None);
            };
            // A job that goes alone waits for an idle worker: sent ahead, it would be written
            // behind the worker's batch, and the batch behind it; a poison input killing that
            // worker takes down whatever was written to it.
            if queue.jobs.alone_first() {
                return Look::Until(None);
            }
            let mut free_at = now;
            if let Some(Some(Seat { busy: Some((since, weight)), .. })) = queue.seats.get(slot) {
                free_at = free_at.max(*since + cost.of(*weight));
            }
            let done_by = free_at + cost.of(stage.batch_weight(queue));
            // With admission's margin, as a batch's wait keeps one: on the learned cost alone,
            // a job whose deadline came just after was sent ahead, and the slightest slower
            // batch answered it 408.
            // The margin of the job's whole time, from the oldest arrival, as admission's is.
            let since = queue.jobs.oldest().map_or(now, |job| job.arrived);
            let late = |deadline: Instant| {
                deadline
                    < done_by + super::admission::margin(deadline.saturating_duration_since(since))
            };
            if queue.jobs.earliest_deadline(max).is_some_and(late) {
                return Look::Until(None);
            }
            let batch = stage.take_up_to(queue, now, max);
            if !batch.is_empty() {
                queue.seat(slot).ahead = weight_of(&batch);
            }
            Look::Took(batch)
        })
        .await
    }

    /// For a streaming worker that holds jobs and offered room for `max` more (`pull`): waits
    /// until live jobs are queued, and none that goes alone is at the front, then takes up to
    /// `max` of them at once — no batch window, the worker's own steps are the window — and
    /// counts them on the worker's seat. Cancel-safe.
    pub(super) async fn next_join(&self, slot: usize, max: usize) -> Vec<Job> {
        let max = max.min(self.settings.max_batch_size).min(self.lock().seat(slot).max_batch);
        self.take_when(|stage, queue, now| {
            // A job that goes alone never joins others running: it waits for an idle worker
            // (joins wait behind it, so workers drain and one comes free).
            if queue.jobs.is_empty() || queue.jobs.alone_first() {
                return Look::Until(None);
            }
            let batch = stage.take_up_to(queue, now, max);
            if !batch.is_empty() {
                let seat = queue.seat(slot);
                let (since, weight) = seat.busy.unwrap_or((now, 0));
                seat.busy = Some((since, weight + weight_of(&batch)));
            }
            Look::Took(batch)
        })
        .await
    }

    /// The wait every worker's pull goes through: under the queue lock, with dead jobs cleared
    /// off the front, `look` either takes a batch (and marks the worker's seat in the same step)
    /// or says until when nothing is worth taking; then the pull sleeps until that instant or
    /// the queue changes (an arrival, jobs given back, a job that went alone leaving the front). It registers for arrivals before looking, so none is missed in between,
    /// and jobs leave the queue only in the synchronous step that returns them: cancel-safe.
    /// A look that took nothing (every job it reached was dead) looks again at once.
    async fn take_when(
        &self,
        mut look: impl FnMut(&Self, &mut Queue, Instant) -> Look,
    ) -> Vec<Job> {
        loop {
            let arrival = self.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            let looked = {
                let mut queue = self.lock();
                let now = Instant::now();
                // (Promotions due by now are made first, in `clear_dead`.)
                self.clear_dead(&mut queue, now, false);
                look(self, &mut queue, now)
            };
            // A job that goes alone was taken off the front: the joins and batches sent ahead
            // that wait behind it look again, not at the next arrival (a quiet joining worker
            // had left the job behind it waiting past its deadline).
            if matches!(&looked, Look::Took(batch) if goes_alone(batch)) {
                self.arrivals.notify_waiters();
            }
            let wake_at = match looked {
                Look::Took(batch) if batch.is_empty() => continue,
                Look::Took(batch) => return batch,
                Look::Until(at) => at,
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = &mut arrival => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => arrival.await,
            }
        }
    }

    /// The stage's batch settings as the worker in `slot` takes batches: at most its own
    /// `max_batch` jobs, where that is fewer than the stage's.
    fn settings_for(&self, queue: &mut Queue, slot: Option<usize>) -> policy::BatchSettings {
        let own = slot.map_or(usize::MAX, |slot| queue.seat(slot).max_batch);
        let max_batch_size = self.settings.max_batch_size.min(own);
        policy::BatchSettings { max_batch_size, ..self.settings }
    }

    /// Takes the next batch off the front of the queue, in the lanes' order: up to `max` jobs
    /// (`max_batch_size`, or the worker's own bound), `max_batch_bytes` and `max_batch_weight`
    /// (a job heavier than the budget goes alone). A batch ends early rather than split a
    /// request of several jobs that would fit whole in the next batch. A job whose worker died
    /// holding it ([`Job::alone`]) is a batch of its own: retried beside others, a poison input
    /// had killed a second worker with all of them, and every one had run out of retries.
    fn take_up_to(&self, queue: &mut Queue, now: Instant, max: usize) -> Vec<Job> {
        let budget = self.settings.max_batch_weight.unwrap_or(usize::MAX);
        let byte_budget = self.settings.max_batch_bytes;
        let mut batch = Vec::with_capacity(max.min(queue.jobs.len()));
        let (mut bytes, mut weight) = (0, 0);
        let epoch = self.tensors_epoch();
        while batch.len() < max {
            let Some((next, request)) = queue.jobs.peek() else { break };
            let dead = next.is_abandoned() || next.is_expired(now);
            // Read against tensors a newcomer's replaced: not sent as rows of the old ones.
            let stale = !dead && next.tensors.is_some_and(|read| read != epoch);
            if !batch.is_empty() && !dead && !stale {
                if next.alone {
                    break;
                }
                let fits =
                    bytes + next.size() <= byte_budget && weight + next.weight as usize <= budget;
                let (room, request_weight) = (max - batch.len(), request.weight as usize);
                let fits_later = !request.started
                    && (request.jobs > room
                        || weight + request_weight > budget
                        || bytes + request.bytes > byte_budget)
                    && request.jobs <= max
                    && request_weight <= budget
                    && request.bytes <= byte_budget;
                if !fits || fits_later {
                    break;
                }
            }
            let job = queue.jobs.pop(!(dead || stale)).expect("front exists");
            if dead {
                bury(job, now);
                continue;
            }
            if stale {
                job.answer(Outcome::TensorsChanged);
                continue;
            }
            bytes += job.size();
            weight += job.weight as usize;
            let alone = job.alone;
            batch.push(job);
            if alone {
                break;
            }
        }
        queue.jobs.end_batch();
        queue.note_taken(now, &batch, max);
        if !batch.is_empty() {
            let waited = metrics().queue_wait_seconds.with_label_values(&[&self.name]);
            for job in &batch {
                waited.observe(now.saturating_duration_since(job.arrived).as_secs_f64());
            }
        }
        batch
    }
}

/// Whether `batch` is a job that goes alone ([`Job::alone`]): such a job is always a batch of
/// its own, so its first job says.
pub(crate) fn goes_alone(batch: &[Job]) -> bool {
    batch.first().is_some_and(|job| job.alone)
}
