//! What Triton's statistics extension (`GET /v2/models[/{name}]/stats`) reports of a model: the
//! counters behind it, kept apart from the Prometheus metrics because they are by model (a
//! route) where the metrics are by path label and stage, and because a client reads them as
//! running totals, not histograms.
//!
//! Two kinds, kept where they happen:
//! - [`RouteStatistics`], one per route, counts its requests as the HTTP edge answers them
//!   (whatever the protocol: a model's requests come native, v2, KServe v1 or OpenAI), with
//!   where a successful one's time went ([`crate::timing::Timing`]): its queue and its batch.
//! - [`Executions`], one per stage, counts the batches its workers finished, by size, with their
//!   time in the worker. It is updated under the stage's lock, which finishing a batch holds
//!   anyway. A stage two routes share counts both routes' batches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::stage::Stage;
use crate::timing::Timing;

/// A count and the nanoseconds it took in all: Triton's `StatisticDuration`.
#[derive(Debug, Default)]
pub struct Tally {
    count: AtomicU64,
    nanos: AtomicU64,
}

impl Tally {
    /// Wrapping past u64 (atomics do): a client reads differences between two reads.
    fn add(&self, took: Duration) {
        self.count.fetch_add(1, Relaxed);
        self.nanos.fetch_add(nanos(took), Relaxed);
    }

    /// (count, nanoseconds).
    pub fn read(&self) -> (u64, u64) {
        (self.count.load(Relaxed), self.nanos.load(Relaxed))
    }
}

/// A route's requests, as Triton counts a model's.
#[derive(Debug, Default)]
pub struct RouteStatistics {
    /// Requests answered 2xx, each from its arrival to its answer (a stream's: to its first
    /// chunk, when its head goes).
    pub success: Tally,
    /// Requests for the route (a `POST` past its head's checks) whose answer was not 2xx: a
    /// worker's 422 or 500, a 408, a 503, and a body refused before its jobs ran.
    pub fail: Tally,
    /// Successful requests' time queued, summed over their pipeline's stages, in nanoseconds
    /// (counted as `success` is: one count for the three, so that their counts never disagree,
    /// as three counters read one by one under load did; a read may still find a request's
    /// nanoseconds before its count).
    pub queue_ns: AtomicU64,
    /// Successful requests' time in their batches (in the worker and on its socket), in
    /// nanoseconds, counted as `success` is.
    pub compute_infer_ns: AtomicU64,
    /// Rows of successful requests: Triton's `inference_count`.
    pub inferences: AtomicU64,
    /// When a successful request was last answered, in milliseconds since the Unix epoch (0:
    /// never): Triton's `last_inference`.
    pub last_inference_ms: AtomicU64,
}

impl RouteStatistics {
    /// A request that ran jobs on this route was answered `status` after `took`; `timing` says
    /// where its time went and how many of its rows the worker answered with a result.
    pub fn answered(&self, status: http::StatusCode, took: Duration, timing: &Timing) {
        if !status.is_success() {
            self.fail.add(took);
            return;
        }
        self.inferences.fetch_add(u64::from(timing.rows_done), Relaxed);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        // A store: two requests answered within a millisecond of each other may land in either
        // order, and either is the last inference as well as a client can tell.
        self.last_inference_ms.store(ms, Relaxed);
        self.queue_ns.fetch_add(nanos(timing.queue), Relaxed);
        self.compute_infer_ns.fetch_add(nanos(timing.batch), Relaxed);
        self.success.add(took);
    }
}

fn nanos(took: Duration) -> u64 {
    u64::try_from(took.as_nanos()).unwrap_or(u64::MAX)
}

/// The batches of a pipeline's `stages`, summed, each stage once: a pipeline may list one twice,
/// and its count holds both passes.
pub fn executions_of(stages: &[Arc<Stage>]) -> Executions {
    let mut executions = Executions::default();
    for (i, stage) in stages.iter().enumerate() {
        if !stages[..i].iter().any(|earlier| Arc::ptr_eq(earlier, stage)) {
            executions.add(&stage.executions());
        }
    }
    executions
}

/// A stage's finished batches by size: (batches, nanoseconds in the worker) for each size seen.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Executions(BTreeMap<u32, (u64, u64)>);

impl Executions {
    /// A batch of `size` jobs kept its worker `took`.
    pub fn finished(&mut self, size: usize, took: Duration) {
        let size = u32::try_from(size).unwrap_or(u32::MAX);
        // Wrapping, as the request tallies do: a client reads differences between two reads.
        let (count, nanos) = self.0.entry(size).or_default();
        *count = count.wrapping_add(1);
        *nanos = nanos.wrapping_add(self::nanos(took));
    }

    /// `other`'s batches added to these (a route's stages, summed).
    pub fn add(&mut self, other: &Executions) {
        for (&size, &(count, nanos)) in &other.0 {
            let (c, n) = self.0.entry(size).or_default();
            *c = c.wrapping_add(count);
            *n = n.wrapping_add(nanos);
        }
    }

    /// (size, batches, nanoseconds), smallest size first.
    pub fn by_size(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.0.iter().map(|(&size, &(count, nanos))| (size, count, nanos))
    }

    /// Batches in all: Triton's `execution_count`.
    pub fn count(&self) -> u64 {
        self.0.values().fold(0, |all, (count, _)| all.wrapping_add(*count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn timing(queue_ms: u64, batch_ms: u64, rows_done: u32) -> Timing {
        Timing {
            queue: Duration::from_millis(queue_ms),
            batch: Duration::from_millis(batch_ms),
            batch_size: 4,
            rows_done,
            route: Some(0),
        }
    }

    #[test]
    fn successes_carry_their_queue_and_batch_and_failures_only_their_time() {
        let route = RouteStatistics::default();
        route.answered(StatusCode::OK, Duration::from_millis(10), &timing(3, 5, 2));
        route.answered(StatusCode::OK, Duration::from_millis(20), &timing(4, 6, 1));
        // A 422 of a request of three rows, two of which the worker answered: no inference, as
        // Triton counts the rows of successful requests only.
        let failed = timing(1, 1, 2);
        route.answered(StatusCode::UNPROCESSABLE_ENTITY, Duration::from_millis(7), &failed);
        assert_eq!(route.success.read(), (2, 30_000_000));
        assert_eq!(route.fail.read(), (1, 7_000_000));
        assert_eq!(route.queue_ns.load(Relaxed), 7_000_000);
        assert_eq!(route.compute_infer_ns.load(Relaxed), 11_000_000);
        assert_eq!(route.inferences.load(Relaxed), 3);
        assert!(route.last_inference_ms.load(Relaxed) > 0);
    }

    #[test]
    fn a_failed_request_leaves_the_last_inference() {
        let route = RouteStatistics::default();
        let shed = Timing::default();
        route.answered(StatusCode::SERVICE_UNAVAILABLE, Duration::from_millis(1), &shed);
        assert_eq!(route.fail.read(), (1, 1_000_000));
        assert_eq!(route.last_inference_ms.load(Relaxed), 0);
    }

    #[test]
    fn executions_are_counted_by_size_and_summed_over_stages() {
        let mut first = Executions::default();
        first.finished(4, Duration::from_millis(2));
        first.finished(4, Duration::from_millis(3));
        first.finished(1, Duration::from_millis(1));
        let mut second = Executions::default();
        second.finished(4, Duration::from_millis(10));
        first.add(&second);
        let sizes: Vec<_> = first.by_size().collect();
        assert_eq!(sizes, [(1, 1, 1_000_000), (4, 3, 15_000_000)]);
        assert_eq!(first.count(), 4);
    }
}
