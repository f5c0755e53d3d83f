//! When an idle worker's batch is released: the pure decision, kept apart from the queue so that
//! each rule is tested on its own with plain numbers.
//!
//! The wait is counted from the oldest queued job's arrival, never restarted per arrival: a
//! sliding window lets a steady trickle hold the first job back indefinitely.

use std::time::Duration;

use tokio::time::Instant;

/// The batch bounds of one stage.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// Most jobs in one batch.
    pub max_batch_size: usize,
    /// Longest the oldest queued job waits for batch-mates.
    pub max_wait: Duration,
    /// Most payload bytes in one batch, so that a batch frame stays under the protocol's limit.
    pub max_batch_bytes: usize,
}

/// What an idle worker should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Take a batch now.
    Now,
    /// Nothing worth taking yet; look again at this instant (or when a job arrives).
    At(Instant),
    /// The queue is empty; wait for a job.
    Idle,
}

/// What the queue looks like to the policy.
#[derive(Debug, Clone, Copy)]
pub struct QueueView {
    pub jobs: usize,
    pub bytes: usize,
    /// Arrival of the oldest queued job (None when empty).
    pub oldest: Option<Instant>,
}

/// Fixed-window release: full batches go at once, others when the oldest job has waited
/// `max_wait`.
pub fn decide(queue: QueueView, now: Instant, settings: &BatchSettings) -> Release {
    let Some(oldest) = queue.oldest else {
        return Release::Idle;
    };
    if queue.jobs >= settings.max_batch_size || queue.bytes >= settings.max_batch_bytes {
        return Release::Now;
    }
    let release_at = oldest + settings.max_wait;
    if now >= release_at {
        Release::Now
    } else {
        Release::At(release_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: BatchSettings = BatchSettings {
        max_batch_size: 4,
        max_wait: Duration::from_millis(10),
        max_batch_bytes: 1000,
    };

    fn view(jobs: usize, bytes: usize, oldest: Option<Instant>) -> QueueView {
        QueueView {
            jobs,
            bytes,
            oldest,
        }
    }

    #[test]
    fn an_empty_queue_is_idle() {
        assert_eq!(
            decide(view(0, 0, None), Instant::now(), &SETTINGS),
            Release::Idle
        );
    }

    #[test]
    fn a_full_batch_goes_at_once() {
        let now = Instant::now();
        assert_eq!(decide(view(4, 40, Some(now)), now, &SETTINGS), Release::Now);
        assert_eq!(decide(view(9, 40, Some(now)), now, &SETTINGS), Release::Now);
    }

    #[test]
    fn a_batch_full_by_bytes_goes_at_once() {
        let now = Instant::now();
        assert_eq!(
            decide(view(2, 1000, Some(now)), now, &SETTINGS),
            Release::Now
        );
    }

    #[test]
    fn a_partial_batch_waits_from_the_oldest_arrival() {
        let oldest = Instant::now();
        let now = oldest + Duration::from_millis(4);
        let expected = Release::At(oldest + Duration::from_millis(10));
        assert_eq!(decide(view(2, 20, Some(oldest)), now, &SETTINGS), expected);
    }

    #[test]
    fn a_partial_batch_goes_once_the_oldest_has_waited_max_wait() {
        let oldest = Instant::now();
        let now = oldest + Duration::from_millis(10);
        assert_eq!(
            decide(view(1, 10, Some(oldest)), now, &SETTINGS),
            Release::Now
        );
    }
}
