//! What a batch costs, learned online: a least-squares fit of batch duration against batch size
//! over the most recent batches (`duration ≈ overhead + per_item × size`), the estimate
//! BentoML's adaptive dispatcher also keeps (its `CorkDispatcher`).
//!
//! The fit is made again over the window whenever a batch is recorded (O(window), once a batch)
//! and read as it is (O(1), by every admission and every batch decision) under the stage lock.
//!
//! A model whose cost changes (another process on its GPU, inputs of another kind, a slower
//! fallback path) is followed within a few batches, not a window: when [`SHIFTED_AFTER`] batches in
//! a row each took more than [`SHIFT`] times what the fit predicted (or less than its inverse), by
//! more than [`SHIFT_FLOOR`], and well beyond how far off the fit the batches the window holds are
//! ([`BEYOND`]), the window forgets the batches before them. A window of one-second batches had
//! taken a minute to follow a model that became five times slower, and admission meanwhile let in
//! jobs that almost all ended 408. The last condition keeps the rule to changes: a stage whose
//! batches vary widely (generations of any length, workers of different speeds) has shown the
//! spread already, and its window is kept whole (without it, three short generations in a row came
//! every 17 batches, and the estimate was under half the cost one batch in nine).

use std::collections::VecDeque;
use std::time::Duration;

/// Batches remembered: enough to smooth noise, few enough to follow a model that changes slowly.
const WINDOW: usize = 64;

/// How far off the fit a batch must be, as a factor either way, to count toward a shift.
const SHIFT: f64 = 2.0;

/// And by how much at least: a fast model's batches can take ten times their usual 50 µs
/// (a scheduler's pause), and a shift of a millisecond misleads no deadline.
const SHIFT_FLOOR: Duration = Duration::from_millis(2);

/// How far past the window's own spread (its batches' least and greatest ratio to the fit) a
/// batch must be: just past it, three in a row came once in 10,000 generations of random length
/// (each a minimum of 64 lengths); half as far again, about once in a million.
const BEYOND: f64 = 1.5;

/// Batches in a row, off the fit the same way, that make a shift: one is noise (a pause, a
/// cold cache); three already cost a slowed model three batches of late predictions.
const SHIFTED_AFTER: usize = 3;

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
    /// The fit as it stood before the latest run of batches off it: what each batch of a run is
    /// judged against. Judged against a fit that had taken the run in, the run tilted it: a
    /// model whose batches cost 150 ms whatever their size became 750 ms while admission, now
    /// refusing, sent fuller batches (3–4 jobs where they had been 1–3); the fit read the slow
    /// batches as a per-item cost, the fast small ones then looked as far off the other way, the
    /// run never grew three long, and for half a minute most admitted jobs ended 408.
    settled: Option<Cost>,
    /// The latest batches in a row off the fit the same way: how many, and which way
    /// (`true`: slower than predicted).
    off: (usize, bool),
}

impl CostModel {
    /// Remembers that a batch of `size` jobs took `took` (send to results, as the proxy saw it).
    pub fn record(&mut self, size: usize, took: Duration) {
        let verdict = self.settled.and_then(|fit| off(fit.of(size), took, || self.seen(fit)));
        self.samples.push_back((size as f64, took.as_secs_f64()));
        match verdict {
            Some(slower) if self.off.0 > 0 && self.off.1 == slower => self.off.0 += 1,
            Some(slower) => self.off = (1, slower),
            None => self.off = (0, false),
        }
        if self.off.0 >= SHIFTED_AFTER {
            // The model changed: what it cost before says nothing of what it costs now.
            let before = self.samples.len() - SHIFTED_AFTER;
            self.samples.drain(..before);
            self.off = (0, false);
        }
        if self.samples.len() > WINDOW {
            self.samples.pop_front();
        }
        self.fit = Some(self.fit());
        if self.off.0 == 0 {
            self.settled = self.fit;
        }
    }

    /// How far off `fit` (the settled one) the window's batches were, as the least and the most
    /// of their ratios of duration to prediction: of the batches before the latest run off the
    /// fit, which are what a shift would leave behind.
    fn seen(&self, fit: Cost) -> (f64, f64) {
        let settled = self.samples.len() - self.off.0;
        let ratios = self.samples.iter().take(settled).filter_map(|&(n, d)| {
            let predicted = fit.of(n as usize).as_secs_f64();
            (predicted > 0.0).then(|| d / predicted)
        });
        ratios.fold((f64::INFINITY, 0.0), |(low, high), ratio| (low.min(ratio), high.max(ratio)))
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

/// Whether a batch that took `took` is off a prediction of `predicted` enough to count toward a
/// shift, and which way (`Some(true)`: slower): by more than [`SHIFT`] times and [`SHIFT_FLOOR`],
/// and [`BEYOND`] the ratios the window has `seen` ([`CostModel::seen`]).
/// The window's spread is read (O(window)) only for a batch already off by the rest: most are not.
fn off(predicted: Duration, took: Duration, seen: impl FnOnce() -> (f64, f64)) -> Option<bool> {
    let (p, t) = (predicted.as_secs_f64(), took.as_secs_f64());
    if took.abs_diff(predicted) <= SHIFT_FLOOR || p <= 0.0 {
        return None;
    }
    // As a ratio, computed as [`CostModel::seen`] computes the window's: a batch just like one
    // there is never beyond it by a rounding.
    let ratio = t / p;
    if (SHIFT.recip()..=SHIFT).contains(&ratio) {
        return None;
    }
    let (low, high) = seen();
    if ratio > SHIFT.max(high * BEYOND) {
        Some(true)
    } else if ratio < SHIFT.recip().min(low / BEYOND) {
        Some(false)
    } else {
        None
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
    fn follows_a_model_that_becomes_slower_or_faster_within_a_few_batches() {
        // Batches of 4 at 200 ms, then the model five times slower (a batch of 1 to 4 about a
        // second): the window had averaged them in for a minute.
        let mut model = CostModel::default();
        for i in 0..WINDOW {
            model.record(1 + i % 4, ms(180.0 + 5.0 * (1 + i % 4) as f64));
        }
        for i in 0..SHIFTED_AFTER {
            let before = model.estimate().unwrap().of(2);
            assert!(before < ms(300.0), "not yet: {before:?}");
            model.record(1 + i % 4, ms(900.0 + 25.0 * (1 + i % 4) as f64));
        }
        let slow = model.estimate().unwrap().of(2);
        assert!(slow > ms(900.0) && slow < ms(1000.0), "{slow:?}");
        // And fast again.
        for i in 0..SHIFTED_AFTER {
            model.record(1 + i % 4, ms(180.0 + 5.0 * (1 + i % 4) as f64));
        }
        let fast = model.estimate().unwrap().of(2);
        assert!(fast > ms(150.0) && fast < ms(250.0), "{fast:?}");
    }

    #[test]
    fn a_shift_is_judged_against_the_fit_before_it() {
        // A model five times slower while admission, now refusing most, sends fuller batches
        // (3 and 4 jobs where they had been 2 and 3): judged against a fit that had taken the
        // first slow batch in, the third looked on the line, and the window was never cut.
        // Batches that cost 180 ms + 5 ms a job, and ones that cost 150 ms whatever their size.
        // A window not yet full, as after a start: two batches of 1, then 2, 2, 3 over again,
        // each up to 4 ms past its cost.
        type Model = fn(usize) -> f64;
        let cases: [(Model, [usize; 3]); 2] =
            [(|n| 180.0 + 5.0 * n as f64, [2, 2, 3]), (|_| 150.0, [1, 2, 3])];
        for (fast, sizes) in cases {
            let mut model = CostModel::default();
            for i in 0..52 {
                let size = if i < 2 { 1 } else { sizes[i % 3] };
                model.record(size, ms(fast(size) + (i % 5) as f64));
            }
            for size in [3, 4, 4] {
                model.record(size, ms(5.0 * fast(size)));
            }
            let cost = model.estimate().unwrap();
            for size in [1, 4] {
                let (slow, truly) = (cost.of(size), ms(5.0 * fast(size)));
                let off = slow.abs_diff(truly);
                assert!(off < ms(50.0), "{size}: {slow:?}, not {truly:?} ({cost:?})");
            }
        }
    }

    #[test]
    fn noise_is_no_shift() {
        // A fast model's batches, then three ten times slower, but by less than the floor; a
        // slow one's single outliers: the window keeps them all.
        let mut fast = CostModel::default();
        for _ in 0..WINDOW {
            fast.record(4, ms(0.05));
        }
        for _ in 0..SHIFTED_AFTER {
            fast.record(4, ms(0.5));
        }
        assert_eq!(fast.samples.len(), WINDOW);
        let mut slow = CostModel::default();
        for i in 0..3 * WINDOW {
            slow.record(4, ms(if i % 10 == 9 { 900.0 } else { 200.0 }));
        }
        assert_eq!(slow.samples.len(), WINDOW);
        // Two slow batches in a row, between fast ones, are no shift either.
        for took in [900.0, 900.0, 200.0, 900.0, 900.0, 200.0] {
            slow.record(4, ms(took));
        }
        assert_eq!(slow.samples.len(), WINDOW);
    }

    /// A xorshift stream of numbers in [0, 1): the same every run.
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn batches_that_vary_widely_keep_their_window() {
        // Generations of any length (exponential, mean 1 s) and, in a stage of one fast worker
        // and two five times slower, answers in the order they finish: three short ones in a
        // row are the spread the window has seen, no change. Each had cut the window, often
        // enough for the estimate to fall under half the cost in one batch in nine.
        let mut random = uniform(7);
        let mut lengths = CostModel::default();
        for i in 0..20_000 {
            lengths.record(8, Duration::from_secs_f64(-(1.0 - random()).ln()));
            // While the window fills, it has seen little spread (and is small, following
            // changes by itself); from then on it is never cut.
            if i >= 2 * WINDOW {
                assert_eq!(lengths.samples.len(), WINDOW, "batch {i}");
            }
        }
        let mut workers = CostModel::default();
        let mut finished: Vec<(f64, f64)> = Vec::new();
        for (speed, count) in [(0.1, 1), (0.5, 2)] {
            for _ in 0..count {
                let mut at = random() * speed;
                while at < 3_000.0 {
                    finished.push((at, speed));
                    at += speed;
                }
            }
        }
        finished.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (i, &(_, took)) in finished.iter().enumerate() {
            workers.record(8, Duration::from_secs_f64(took));
            if i >= 2 * WINDOW {
                assert_eq!(workers.samples.len(), WINDOW, "batch {i}");
            }
        }
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
