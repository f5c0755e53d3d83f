//! How fast jobs arrive: an exponentially weighted mean of the gaps between arrivals
//! ([`Arrivals`]), and the weight that arrived over about the last second ([`Recent`]).
//!
//! Closed-loop clients arrive in bursts (a burst of replies triggers a burst of new requests),
//! so the mean gap is smoothed over a few dozen arrivals rather than the last one.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of the newest gap in the running mean.
const ALPHA: f64 = 0.05;

#[derive(Debug, Default)]
pub struct Arrivals {
    last: Option<Instant>,
    mean_gap: Option<f64>,
}

impl Arrivals {
    pub fn record(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last).as_secs_f64();
            self.mean_gap = Some(match self.mean_gap {
                None => gap,
                Some(mean) => mean + ALPHA * (gap - mean),
            });
        }
        self.last = Some(now);
    }

    /// The mean time between arrivals, once two have been seen.
    pub fn mean_gap(&self) -> Option<Duration> {
        self.mean_gap.map(Duration::from_secs_f64)
    }

    pub fn last(&self) -> Option<Instant> {
        self.last
    }
}

/// The time over which [`Recent`] counts arrivals.
const WINDOW: Duration = Duration::from_secs(1);

/// Fewer arrivals than this in about a [`WINDOW`] make no rate: one job, or a few, say nothing
/// of what follows (a single high job of weight 100,000, read as 100,000 a second, had every
/// normal job behind it refused as if a flood of them were on its way).
const FEWEST: f64 = 10.0;

/// Arrivals further apart than this end a run of them ([`Recent::rates`]).
const RUN_GAP: Duration = Duration::from_millis(250);

/// The jobs and weight that arrived over about the last [`WINDOW`], each arrival counted with a
/// weight that decays by e every window: what a rate of arrivals is read from where the mean
/// gap will not do. Read between closed-loop bursts (four jobs at once, then 50 ms of none), a
/// mean gap, or the time since the last arrival, swung with where in the burst it was read;
/// and traffic that stopped fades out of it by itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct Recent {
    last: Option<Instant>,
    /// When the current run of arrivals, none further apart than [`RUN_GAP`], began.
    since: Option<Instant>,
    jobs: f64,
    weight: f64,
}

impl Recent {
    pub fn record(&mut self, now: Instant, weight: u32) {
        if self.last.is_none_or(|last| now.saturating_duration_since(last) > RUN_GAP) {
            self.since = Some(now);
        }
        let fade = self.fade(now);
        self.jobs = self.jobs * fade + 1.0;
        self.weight = self.weight * fade + f64::from(weight);
        self.last = Some(now);
    }

    /// The jobs and the weight arriving a second, as of `now`; None while fewer than
    /// [`FEWEST`] jobs came in about the last second, and unless they have kept coming for a
    /// [`WINDOW`] and still do (no gap past [`RUN_GAP`]): a burst says nothing of what
    /// follows. Counted over the whole window, a flood that begins is read low for a second or
    /// two; counted over the time since it began, one burst of 40 jobs read as 180 a second;
    /// read as a rate at all, 40 at once on a stage serving 20 a second had the lower jobs
    /// behind them refused, though all were served within their deadline.
    pub fn rates(&self, now: Instant) -> Option<(f64, f64)> {
        let (last, since) = (self.last?, self.since?);
        let running = now.saturating_duration_since(last) <= RUN_GAP
            && last.saturating_duration_since(since) >= WINDOW;
        let fade = self.fade(now);
        let window = WINDOW.as_secs_f64();
        (running && self.jobs * fade >= FEWEST)
            .then(|| (self.jobs * fade / window, self.weight * fade / window))
    }

    /// What the counts as of the last arrival are worth at `now`.
    fn fade(&self, now: Instant) -> f64 {
        let Some(last) = self.last else { return 0.0 };
        let age = now.saturating_duration_since(last).as_secs_f64();
        (-age / WINDOW.as_secs_f64()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_steady_rate() {
        let mut arrivals = Arrivals::default();
        let start = Instant::now();
        assert_eq!(arrivals.mean_gap(), None);
        for i in 0..200 {
            arrivals.record(start + Duration::from_millis(2 * i));
        }
        let gap = arrivals.mean_gap().unwrap().as_secs_f64();
        assert!((gap - 0.002).abs() < 1e-9, "{gap}");
        assert_eq!(arrivals.last(), Some(start + Duration::from_millis(398)));
    }

    #[test]
    fn the_recent_rate_counts_the_last_second_whatever_the_bursts() {
        let mut recent = Recent::default();
        let start = Instant::now();
        assert_eq!(recent.rates(start), None);
        // 80 jobs of weight 2 a second, in bursts of four every 50 ms, for ten seconds.
        for burst in 0..200 {
            for _ in 0..4 {
                recent.record(start + Duration::from_millis(50 * burst), 2);
            }
        }
        // Read anywhere between two bursts, about 80 a second (within a burst's size).
        for after in [0, 25, 49] {
            let now = start + Duration::from_millis(50 * 199 + after);
            let (jobs, weight) = recent.rates(now).unwrap();
            assert!((76.0..=84.0).contains(&jobs), "{after} ms after a burst: {jobs}");
            assert!((weight - 2.0 * jobs).abs() < 1e-6);
        }
        // Traffic that stopped fades: three seconds later, too few to make a rate.
        assert_eq!(recent.rates(start + Duration::from_secs(13)), None);
    }

    #[test]
    fn a_few_jobs_make_no_rate_and_one_burst_no_flood() {
        let mut recent = Recent::default();
        let start = Instant::now();
        // A second of 9 jobs: too few.
        for i in 0..9 {
            recent.record(start + Duration::from_millis(125 * i), 100_000);
        }
        assert_eq!(recent.rates(start + Duration::from_millis(1000)), None);
        // 40 at once: a burst, no rate, then or a moment later.
        let later = start + Duration::from_secs(5);
        for _ in 0..40 {
            recent.record(later, 1);
        }
        assert_eq!(recent.rates(later), None);
        assert_eq!(recent.rates(later + Duration::from_millis(300)), None);
    }
}
