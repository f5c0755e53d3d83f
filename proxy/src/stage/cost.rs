//! What a batch costs, learned online: a least-squares fit of batch duration against batch size
//! over the most recent batches (`duration ≈ overhead + per_item × size`), the estimate
//! BentoML's adaptive dispatcher also keeps (its `CorkDispatcher`).
//!
//! The fit is made again over the window whenever a batch is recorded (O(window), once a batch)
//! and read as it is (O(1), by every admission and every batch decision) under the stage lock.

use std::collections::VecDeque;
use std::time::Duration;

/// Batches remembered: enough to smooth noise, few enough to follow a model that changes.
const WINDOW: usize = 64;

/// A learned batch cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// What every batch pays whatever its size (call overhead, framing, kernel launch, …).
    pub overhead: Duration,
    /// What each item adds.
    pub per_item: Duration,
}

impl Cost {
    /// Expected duration of a batch of `size` items.
    pub fn of(&self, size: usize) -> Duration {
        // Saturating: a weighted queue's size can pass u32 (weights up to 10^6 a job).
        let size = u32::try_from(size).unwrap_or(u32::MAX);
        self.overhead.saturating_add(self.per_item.saturating_mul(size))
    }
}

#[derive(Debug, Default)]
pub struct CostModel {
    samples: VecDeque<(f64, f64)>,
    /// The fit of the samples, made when one is recorded (read far more often than recorded).
    fit: Option<Cost>,
}

impl CostModel {
    /// Remembers that a batch of `size` jobs took `took` (send to results, as the proxy saw it).
    pub fn record(&mut self, size: usize, took: Duration) {
        self.samples.push_back((size as f64, took.as_secs_f64()));
        if self.samples.len() > WINDOW {
            self.samples.pop_front();
        }
        self.fit = Some(self.fit());
    }

    /// The current fit, once any batch has been seen. While every batch seen had the same size
    /// the two terms cannot be told apart; the whole duration then counts as overhead, which
    /// errs toward batching (the cheaper mistake for throughput, bounded by max-wait).
    pub fn estimate(&self) -> Option<Cost> {
        self.fit
    }

    /// Least squares over the window, in two passes (means, then deviations from them), afresh
    /// each time: O([`WINDOW`]) a batch. Running sums, added to and taken from as the window
    /// moved, kept the rounding of every batch ever seen: after batches weighing tens of
    /// millions (n² past 2⁵³) their leftovers passed for a spread of sizes, and the fit
    /// predicted batches at up to 35× their cost for good.
    fn fit(&self) -> Cost {
        let count = self.samples.len() as f64;
        let mean_n = self.samples.iter().map(|&(n, _)| n).sum::<f64>() / count;
        let mean_d = self.samples.iter().map(|&(_, d)| d).sum::<f64>() / count;
        let (mut var_n, mut cov) = (0.0, 0.0);
        for &(n, d) in &self.samples {
            var_n += (n - mean_n) * (n - mean_n);
            cov += (n - mean_n) * (d - mean_d);
        }
        let (overhead, per_item) = if var_n > 1e-9 * count {
            let per_item = (cov / var_n).max(0.0);
            ((mean_d - per_item * mean_n).max(0.0), per_item)
        } else {
            (mean_d, 0.0)
        };
        Cost {
            overhead: Duration::try_from_secs_f64(overhead).unwrap_or(Duration::MAX),
            per_item: Duration::try_from_secs_f64(per_item).unwrap_or(Duration::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1000.0)
    }

    #[test]
    fn knows_nothing_before_the_first_batch() {
        assert_eq!(CostModel::default().estimate(), None);
    }

    #[test]
    fn recovers_overhead_and_per_item_cost() {
        let mut model = CostModel::default();
        for n in 1..=32 {
            model.record(n, ms(2.0 + 0.2 * n as f64));
        }
        let cost = model.estimate().unwrap();
        assert!((cost.overhead.as_secs_f64() * 1e3 - 2.0).abs() < 1e-6, "{cost:?}");
        assert!((cost.per_item.as_secs_f64() * 1e3 - 0.2).abs() < 1e-6, "{cost:?}");
        assert!((cost.of(10).as_secs_f64() * 1e3 - 4.0).abs() < 1e-6);
    }

    #[test]
    fn follows_a_model_that_changes() {
        let mut model = CostModel::default();
        for i in 0..WINDOW {
            model.record(1 + i % 8, ms(10.0));
        }
        for i in 0..WINDOW {
            model.record(1 + i % 8, ms(1.0 + 0.5 * (1 + i % 8) as f64));
        }
        let cost = model.estimate().unwrap();
        assert!((cost.overhead.as_secs_f64() * 1e3 - 1.0).abs() < 1e-6, "{cost:?}");
    }

    #[test]
    fn one_batch_size_counts_as_overhead() {
        let mut model = CostModel::default();
        model.record(1, ms(3.0));
        model.record(1, ms(5.0));
        let cost = model.estimate().unwrap();
        assert_eq!((cost.overhead, cost.per_item), (ms(4.0), Duration::ZERO));
    }

    #[test]
    fn a_size_past_u32_saturates_rather_than_wrap() {
        let cost = Cost { overhead: ms(1.0), per_item: Duration::from_nanos(1) };
        let past = (u32::MAX as usize) + 10;
        assert!(cost.of(past) >= cost.of(u32::MAX as usize - 1), "{:?}", cost.of(past));
        let slow = Cost { overhead: Duration::MAX, per_item: Duration::MAX };
        assert_eq!(slow.of(2), Duration::MAX);
    }

    #[test]
    fn heavy_batches_once_seen_do_not_skew_the_fit_for_good() {
        // Batches of very different weights up to 32 × 10⁶ (x-corral-weight near its cap), then
        // only batches of weight 100,000 that truly take 20 ms + 0.1 µs a unit: 30 ms.
        let took = |n: usize| Duration::from_secs_f64(0.020 + 1e-7 * n as f64);
        for seed in 1..=20u64 {
            let mut model = CostModel::default();
            let mut x: u64 = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = 1 + (x % 32_000_000) as usize;
                model.record(n, took(n));
            }
            for _ in 0..WINDOW {
                model.record(100_000, took(100_000));
            }
            let predicted = model.estimate().unwrap().of(100_000);
            let off = (predicted.as_secs_f64() - 0.030).abs();
            assert!(off < 1e-6, "seed {seed}: {predicted:?}, not 30 ms");
        }
    }
}
