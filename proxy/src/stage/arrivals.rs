//! How fast jobs arrive: an exponentially weighted mean of the gaps between arrivals.
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
}
