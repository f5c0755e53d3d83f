//! What a batch costs, learned online: a least-squares fit of batch duration against batch size
//! over the most recent batches (`duration ≈ overhead + per_item × size`), the estimate
//! BentoML's adaptive dispatcher also keeps (its `CorkDispatcher`).
//!
//! The sums are kept incrementally over a sliding window, so recording a batch and reading the
//! fit are both O(1) under the stage lock.

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
    sum_n: f64,
    sum_d: f64,
    sum_nn: f64,
    sum_nd: f64,
}

impl CostModel {
    /// Remembers that a batch of `size` jobs took `took` (send to results, as the proxy saw it).
    pub fn record(&mut self, size: usize, took: Duration) {
        let sample = (size as f64, took.as_secs_f64());
        self.add(sample, 1.0);
        self.samples.push_back(sample);
        if self.samples.len() > WINDOW {
            let old = self.samples.pop_front().expect("window is not empty");
            self.add(old, -1.0);
        }
    }

    fn add(&mut self, (n, d): (f64, f64), sign: f64) {
        self.sum_n += sign * n;
        self.sum_d += sign * d;
        self.sum_nn += sign * n * n;
        self.sum_nd += sign * n * d;
    }

    /// The current fit, once any batch has been seen. While every batch seen had the same size
    /// the two terms cannot be told apart; the whole duration then counts as overhead, which
    /// errs toward batching (the cheaper mistake for throughput, bounded by max-wait).
    pub fn estimate(&self) -> Option<Cost> {
        let count = self.samples.len() as f64;
        if count == 0.0 {
            return None;
        }
        let mean_n = self.sum_n / count;
        let mean_d = self.sum_d / count;
        let var_n = self.sum_nn / count - mean_n * mean_n;
        let (overhead, per_item) = if var_n > 1e-9 {
            let per_item = ((self.sum_nd / count - mean_n * mean_d) / var_n).max(0.0);
            ((mean_d - per_item * mean_n).max(0.0), per_item)
        } else {
            (mean_d, 0.0)
        };
        Some(Cost {
            overhead: Duration::from_secs_f64(overhead),
            per_item: Duration::from_secs_f64(per_item),
        })
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
}
