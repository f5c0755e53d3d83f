//! Closed-loop returns: clients whose answers just went out often send their next request at
//! once (a client with a fixed number of requests in flight, a batch job, an SDK with a
//! concurrency limit). Under such traffic a worker that finishes a batch finds only the jobs that
//! queued while it worked; the clients it just answered come back a moment later, too late for
//! the batch. With one worker and 32 such clients the stage settles into two half batches taking
//! turns, each paying the model's per-call overhead (measured with the embeddings model: 74% of
//! the throughput full batches give).
//!
//! So the stage learns, per answered batch, what fraction of its jobs came back as new arrivals
//! within the batch window and how soon; right after a batch is answered, the policy may wait
//! that long for them ([`super::policy`] decides whether it pays). Under open-loop traffic the
//! "returns" are simply the arrivals expected right after a batch, which the same rule weighs.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of the newest sample in the running means: returns change with the client mix, so a
/// few batches of history suffice.
const ALPHA: f64 = 0.2;

/// How many mean return delays after an answer its returns are still expected: return delays
/// have a long tail on a busy machine (the client shares the cores with the model), and waiting
/// for a late one is cheap next to a model call, which the policy checks anyway.
const DUE: f64 = 4.0;

/// Arrivals up to this many batch windows after an answer count as its returns.
const COUNTED: u32 = 4;

#[derive(Debug, Default)]
pub struct Returns {
    /// The latest batch answered: when, how many jobs, how many arrivals since.
    latest: Option<Answered>,
    /// Mean fraction of a batch's jobs that came back within the window.
    ratio: f64,
    /// Mean time from a batch's answer to an arrival counted as a return, in seconds.
    delay: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Answered {
    at: Instant,
    jobs: usize,
    returned: usize,
}

/// Jobs expected back soon from the latest answered batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    pub jobs: f64,
    /// By when they should have arrived (`DUE` mean return delays after the answer).
    pub by: Instant,
}

impl Returns {
    /// A batch of `jobs` was answered at `at`; the previous one's returns are final.
    pub fn answered(&mut self, at: Instant, jobs: usize) {
        if let Some(previous) = self.latest.take() {
            let sample = (previous.returned as f64 / previous.jobs as f64).min(1.0);
            self.ratio += ALPHA * (sample - self.ratio);
        }
        self.latest = (jobs > 0).then_some(Answered { at, jobs, returned: 0 });
    }

    /// A job arrived at `at`: a return if it came within `COUNTED` windows of the latest answer.
    /// Late returns count towards the ratio (and lengthen the mean delay), so that a few slow
    /// clients do not make the policy give up on the rest; the wait itself stays within one
    /// window ([`Returns::expected`]).
    pub fn arrived(&mut self, at: Instant, window: Duration) {
        let Some(latest) = self.latest.as_mut() else { return };
        let since = at.saturating_duration_since(latest.at);
        if since > window * COUNTED || latest.returned >= latest.jobs {
            return;
        }
        latest.returned += 1;
        let since = since.as_secs_f64();
        self.delay = Some(match self.delay {
            None => since,
            Some(mean) => mean + ALPHA * (since - mean),
        });
    }

    /// Jobs still expected back from the latest answered batch as of `now` (at least one), and by
    /// when; never later than `window` after the answer.
    pub fn expected(&self, now: Instant, window: Duration) -> Option<Expected> {
        let latest = self.latest?;
        let delay = Duration::from_secs_f64(self.delay? * DUE);
        let by = latest.at + delay.min(window);
        let jobs = self.ratio * latest.jobs as f64 - latest.returned as f64;
        (now < by && jobs >= 1.0).then_some(Expected { jobs, by })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(10);

    fn us(us: u64) -> Duration {
        Duration::from_micros(us)
    }

    /// Batches of `jobs` answered every 100 ms, each job back `delay` later.
    fn closed_loop(returns: &mut Returns, start: Instant, jobs: usize, delay: Duration) {
        for batch in 0..20 {
            let at = start + Duration::from_millis(100 * batch);
            returns.answered(at, jobs);
            for _ in 0..jobs {
                returns.arrived(at + delay, WINDOW);
            }
        }
    }

    #[test]
    fn learns_that_answered_clients_come_back() {
        let mut returns = Returns::default();
        let start = Instant::now();
        closed_loop(&mut returns, start, 16, us(500));
        let answered = start + Duration::from_secs(3);
        returns.answered(answered, 16);
        let expected = returns.expected(answered, WINDOW).unwrap();
        assert!(expected.jobs > 15.0 && expected.jobs <= 16.0, "{expected:?}");
        assert_eq!(expected.by, answered + us(2000), "four mean delays");
        // Each return that arrives is one fewer to expect; none once the time is up.
        returns.arrived(answered + us(400), WINDOW);
        let fewer = returns.expected(answered + us(400), WINDOW).unwrap();
        assert!((expected.jobs - fewer.jobs - 1.0).abs() < 1e-9);
        assert_eq!(returns.expected(answered + us(2000), WINDOW), None);
    }

    #[test]
    fn arrivals_long_after_an_answer_are_not_returns() {
        let mut returns = Returns::default();
        let start = Instant::now();
        closed_loop(&mut returns, start, 16, Duration::from_millis(50));
        returns.answered(start + Duration::from_secs(3), 16);
        assert_eq!(returns.expected(start + Duration::from_secs(3), WINDOW), None);
    }

    #[test]
    fn nothing_is_expected_before_anything_was_answered() {
        let mut returns = Returns::default();
        returns.arrived(Instant::now(), WINDOW);
        assert_eq!(returns.expected(Instant::now(), WINDOW), None);
    }
}
