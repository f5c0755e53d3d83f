//! A stage: a bounded queue of jobs and the idle workers that pull batches from it.
//!
//! HTTP handlers [`Stage::submit`] jobs; each worker connection, whenever its worker is idle,
//! awaits [`Stage::next_batch`], which applies the batch [`policy`] and hands over up to a batch
//! of live jobs. Jobs past their deadline are answered [`Outcome::Expired`] and jobs whose client
//! left are dropped here, so neither is ever dispatched.

pub mod arrivals;
pub mod cost;
pub mod policy;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::job::{Job, Outcome};
use arrivals::Arrivals;
use cost::CostModel;
pub use policy::{BatchSettings, Policy};
use policy::{Forecast, QueueView, Release};

/// Why jobs were not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Shed {
    /// The queue has no room for them under `--queue-capacity`.
    QueueFull,
}

pub struct Stage {
    name: String,
    settings: BatchSettings,
    capacity: usize,
    queue: Mutex<Queue>,
    /// Woken on every arrival so that waiting workers re-run the policy.
    arrivals: Notify,
    workers: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Payload bytes of the queued jobs.
    bytes: usize,
    arrivals: Arrivals,
    cost: CostModel,
}

impl Queue {
    fn push(&mut self, job: Job) {
        self.bytes += job.payload.len();
        self.jobs.push_back(job);
    }

    fn pop(&mut self) -> Option<Job> {
        let job = self.jobs.pop_front()?;
        self.bytes -= job.payload.len();
        Some(job)
    }

    /// Removes jobs that must not be dispatched: expired ones are answered, abandoned ones dropped.
    /// Only the front is cleaned on the hot path (`whole == false`): that is all the policy looks
    /// at; the whole queue is cleaned only when it looks full.
    fn drop_dead(&mut self, now: Instant, whole: bool) {
        let dead = |job: &Job| job.is_abandoned() || job.is_expired(now);
        if whole {
            let (live, gone): (VecDeque<Job>, VecDeque<Job>) =
                std::mem::take(&mut self.jobs).into_iter().partition(|j| !dead(j));
            self.jobs = live;
            self.bytes = self.jobs.iter().map(|j| j.payload.len()).sum();
            gone.into_iter().for_each(|job| bury(job, now));
            return;
        }
        while self.jobs.front().is_some_and(dead) {
            let job = self.pop().expect("front exists");
            bury(job, now);
        }
    }

    fn view(&self) -> QueueView {
        let oldest = self.jobs.front();
        QueueView {
            jobs: self.jobs.len(),
            bytes: self.bytes,
            oldest: oldest.map(|j| j.arrived),
            oldest_deadline: oldest.map(|j| j.deadline),
        }
    }

    fn forecast(&self) -> Forecast {
        Forecast {
            mean_gap: self.arrivals.mean_gap(),
            last_arrival: self.arrivals.last(),
            cost: self.cost.estimate(),
        }
    }
}

/// Ends a job that will never be dispatched.
fn bury(job: Job, now: Instant) {
    if !job.is_abandoned() && job.is_expired(now) {
        job.answer(Outcome::Expired);
    }
}

impl Stage {
    pub fn new(name: impl Into<String>, settings: BatchSettings, capacity: usize) -> Self {
        Self {
            name: name.into(),
            settings,
            capacity,
            queue: Mutex::default(),
            arrivals: Notify::new(),
            workers: AtomicUsize::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn settings(&self) -> &BatchSettings {
        &self.settings
    }

    /// Queues a job, unless the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), Shed> {
        self.submit_all(vec![job])
    }

    /// Queues jobs back to back, all or none, so that the items of one request stay in order and
    /// together (see [`Stage::take`]).
    pub fn submit_all(&self, mut jobs: Vec<Job>) -> Result<(), Shed> {
        let count = jobs.len();
        if let Some(first) = jobs.first_mut() {
            first.group_len = count;
        }
        {
            let mut queue = self.lock();
            if queue.jobs.len() + count > self.capacity {
                queue.drop_dead(Instant::now(), true);
            }
            if queue.jobs.len() + count > self.capacity {
                return Err(Shed::QueueFull);
            }
            for job in jobs {
                queue.arrivals.record(job.arrived);
                queue.push(job);
            }
        }
        self.arrivals.notify_waiters();
        Ok(())
    }

    /// Most jobs the queue holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Waits until the policy releases a batch, then takes it: between 1 and `max_batch_size`
    /// live jobs, oldest first.
    ///
    /// Cancel-safe: jobs leave the queue only in the same synchronous step that returns them.
    pub async fn next_batch(&self) -> Vec<Job> {
        loop {
            // Register for arrivals before looking at the queue, so none is missed in between.
            let arrival = self.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();

            let now = Instant::now();
            let wake_at = {
                let mut queue = self.lock();
                queue.drop_dead(now, false);
                match policy::decide(queue.view(), now, &self.settings, &queue.forecast()) {
                    Release::Now => {
                        let batch = self.take(&mut queue, now);
                        if !batch.is_empty() {
                            return batch;
                        }
                        continue;
                    }
                    Release::At(at) => Some(at),
                    Release::Idle => None,
                }
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

    /// Takes the next batch off the front of the queue. A batch ends early rather than split a
    /// multi-item request that would fit whole in the next batch.
    fn take(&self, queue: &mut Queue, now: Instant) -> Vec<Job> {
        let max = self.settings.max_batch_size;
        let mut batch = Vec::with_capacity(max.min(queue.jobs.len()));
        let mut bytes = 0;
        while batch.len() < max {
            let Some(next) = queue.jobs.front() else { break };
            let fits = bytes + next.payload.len() <= self.settings.max_batch_bytes;
            let group_fits_later = next.group_len > max - batch.len() && next.group_len <= max;
            if !batch.is_empty() && (!fits || group_fits_later) {
                break;
            }
            let job = queue.pop().expect("front exists");
            if job.is_abandoned() || job.is_expired(now) {
                bury(job, now);
                continue;
            }
            bytes += job.payload.len();
            batch.push(job);
        }
        batch
    }

    /// Teaches the cost model: a batch of `size` jobs took `took` in a worker.
    pub fn record_batch(&self, size: usize, took: std::time::Duration) {
        self.lock().cost.record(size, took);
    }

    /// The batch cost learned so far.
    pub fn cost(&self) -> Option<cost::Cost> {
        self.lock().cost.estimate()
    }

    /// Jobs waiting in the queue (live or not yet cleaned up).
    pub fn queued(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Counts a connected worker until the returned guard is dropped.
    pub fn worker_joined(&self) -> WorkerSeat<'_> {
        self.workers.fetch_add(1, Ordering::Relaxed);
        WorkerSeat(self)
    }

    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding this lock would be a bug in the few lines above; the queue is
        // still consistent (every mutation is a single push/pop), so keep serving.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A connected worker's place in its stage's count.
pub struct WorkerSeat<'a>(&'a Stage);

impl Drop for WorkerSeat<'_> {
    fn drop(&mut self) {
        self.0.workers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
