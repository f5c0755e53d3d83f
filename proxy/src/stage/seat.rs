//! A connected worker's place in its stage ([`WorkerSeat`]): it pulls batches through it, and
//! the stage knows from the seats which workers are busy, since when, and with how many jobs —
//! what admission predicts from and what the cost model learns from.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Declared, Parts, Seat, Stage};
use crate::job::Job;
use crate::metrics::metrics;

impl Stage {
    /// Seats a connected worker; it counts (and its batches are tracked for admission) until the
    /// returned seat is dropped.
    pub fn worker_joined(&self) -> WorkerSeat<'_> {
        self.worker_joined_on(None)
    }

    /// [`Stage::worker_joined`], for a worker on device `gpu`.
    pub fn worker_joined_on(&self, gpu: Option<u32>) -> WorkerSeat<'_> {
        let mut queue = self.lock();
        let slot = match queue.seats.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                queue.seats.push(None);
                queue.devices.push(None);
                queue.seats.len() - 1
            }
        };
        queue.seats[slot] = Some(Seat::free(Instant::now()));
        queue.devices[slot] = gpu;
        self.joined_once.store(true, Ordering::Relaxed);
        drop(queue);
        // A worker joined: an earlier one's refusal no longer says why the stage has none.
        self.exits().refused = None;
        WorkerSeat { stage: self, slot }
    }

    /// Connected workers.
    pub fn workers(&self) -> usize {
        self.lock().seats.iter().flatten().count()
    }

    /// Connected workers holding a batch.
    pub fn busy_workers(&self) -> usize {
        self.lock().seats.iter().flatten().filter(|seat| seat.busy.is_some()).count()
    }
}

/// A connected worker's place in its stage: it pulls batches through its seat, so the stage
/// knows which workers are busy, since when, and with how many jobs.
pub struct WorkerSeat<'a> {
    stage: &'a Stage,
    slot: usize,
}

impl WorkerSeat<'_> {
    /// Bounds the batches this worker is sent to `most` jobs (its hello's `max_batch`).
    pub fn take_at_most(&self, most: usize) {
        self.stage.lock().seat(self.slot).max_batch = most.max(1);
    }

    /// What the worker's hello declared, as `parts` ([`Stage::tensor_conflict`],
    /// [`Stage::forget_all_but`]) and its own `declared` (what the stage's are laid from again
    /// when a worker leaves, [`Stage::forget_departed`]).
    pub fn declares(&self, parts: Parts, declared: Option<Arc<Declared>>) {
        self.stage.lock().seat(self.slot).declares = parts;
        if let Some(declared) = declared {
            self.stage.declarers().joined(self.slot, declared);
        }
    }

    /// For an idle worker: [`Stage::next_batch_for`] this worker, which is then busy with it.
    /// Cancel-safe.
    pub async fn next_batch(&self) -> Vec<Job> {
        self.stage.next_batch_for(Some(self.slot)).await
    }

    /// For a worker that holds a batch already: [`Stage::next_batch_ahead`], the batch to send
    /// ahead of time. Cancel-safe.
    pub async fn next_batch_ahead(&self) -> Vec<Job> {
        self.stage.next_batch_ahead(self.slot).await
    }

    /// For a streaming worker with room for `max` more jobs: [`Stage::next_join`]. Cancel-safe.
    pub async fn next_join(&self, max: usize) -> Vec<Job> {
        self.stage.next_join(self.slot, max).await
    }

    /// A streaming batch of `size` jobs, `weight` in all, sent its first chunk (or first result)
    /// `took` after it was sent: what admission and the policy learn for a streaming stage is the
    /// time to first chunk, and what the statistics count as its execution (a stream lasts as
    /// long as its client reads; a joining worker's batches overlap). The worker stays busy
    /// until it holds no job ([`WorkerSeat::released`]).
    pub fn first_chunk(&self, weight: usize, size: usize, took: Duration, joining: bool) {
        let mut queue = self.stage.lock();
        // A joining worker takes new jobs within a step: it is as busy as its first chunk.
        queue.learn_first(weight, took, joining, Instant::now());
        queue.executions.finished(size, took);
        drop(queue);
        let stage = [self.stage.name.as_str()];
        metrics().time_to_first_chunk.with_label_values(&stage).observe(took.as_secs_f64());
    }

    /// A streaming batch of `weight` none of whose jobs sent a chunk: each was cancelled (its
    /// client left, its deadline passed) and acknowledged, the last `took` after the batch was
    /// sent. No time to first chunk (its clients got none), but a lower bound of it: learned
    /// only where longer than predicted. Where first chunks had grown slower than the deadlines
    /// asked, every batch ended so, and with nothing learned admission let every request wait
    /// out its deadline rather than refuse it at once.
    pub fn no_first_chunk(&self, weight: usize, took: Duration, joining: bool) {
        let mut queue = self.stage.lock();
        let predicted = queue.first.estimate().or(queue.cost.estimate()).map(|c| c.of(weight));
        if predicted.is_some_and(|predicted| took > predicted) {
            queue.learn_first(weight, took, joining, Instant::now());
        }
    }

    /// A streaming worker holds no job any more: it is idle, after `took` busy with `size` jobs.
    /// A worker that does not join was unavailable all that time: that is its batches' cost for
    /// the policy and for predicting when it is free (its clients, too, come back now).
    pub fn released(&self, size: usize, weight: usize, took: Duration, joining: bool) {
        let mut queue = self.stage.lock();
        let now = Instant::now();
        let seat = queue.seat(self.slot);
        *seat = seat.freed(now);
        // Weight 0: the worker skipped every job it held, expired ([`crate::worker::settle::ran`]).
        if !joining && weight > 0 {
            queue.cost.record(weight, took);
            queue.learned = Some(now);
        }
        queue.returns.answered(now, size);
    }

    /// [`Stage::requeue`].
    pub fn requeue(&self, jobs: Vec<Job>) {
        self.stage.requeue(jobs);
    }

    pub fn stage_name(&self) -> &str {
        &self.stage.name
    }

    /// The worker answered its oldest batch, of `size` jobs, after `took`: it moves on to the
    /// batch sent ahead or is idle again, and the cost model learns that `weight` (the jobs it
    /// ran, [`crate::worker::settle::ran`]) took that long.
    pub fn finished(&self, size: usize, weight: usize, took: Duration) {
        let mut queue = self.stage.lock();
        let now = Instant::now();
        let seat = queue.seat(self.slot);
        match seat.ahead {
            0 => *seat = seat.freed(now),
            ahead => *seat = Seat { busy: Some((now, ahead)), ahead: 0, ..*seat },
        }
        // A batch whose every job the worker skipped, expired, says nothing of what one costs.
        if weight > 0 {
            queue.learn_first(weight, took, true, now);
        }
        queue.returns.answered(now, size);
        queue.executions.finished(size, took);
        let stage = [self.stage.name.as_str()];
        metrics().batch_seconds.with_label_values(&stage).observe(took.as_secs_f64());
    }
}

impl Drop for WorkerSeat<'_> {
    fn drop(&mut self) {
        // Its declarations go first: once the seat is free a newcomer may take it and record
        // its own under it, which clearing after would have taken away.
        self.stage.declarers().left(self.slot);
        self.stage.lock().seats[self.slot] = None;
    }
}
