//! Deadline-aware admission: at arrival, predict when a job would finish, and refuse it at once
//! (503) if that is past its deadline, instead of queueing work nobody will wait for
//! (the load shedding of "The Throughput Paradox – Why a Machine Learning API Needs Load
//! Shedding").
//!
//! A job is admitted only if predicted to finish with a [`margin`] to spare. The prediction replays
//! the queue onto the workers: the jobs ahead, plus this request's, go out in full batches, each to
//! the worker that frees up first; a batch costs what the learned model says. The request's own
//! batch also carries the jobs expected to arrive behind it before it is taken
//! ([`predicted_finish_joined`]). A job heavier than a full batch is never split: `Stage::predict`
//! places it alone, after the work ahead. A busy worker frees up when its batch is expected to end.
//! With no learned cost yet, or no connected worker, there is nothing to predict from and the job
//! is admitted.
//!
//! The same replay says when a refused request may come back: a full queue, when enough jobs
//! have left to make room (`queue_full`); a tenant over its share, when enough of its own have
//! left, taking turns with the others (`tenant_quota`).

use std::time::Duration;

use tokio::time::Instant;

use super::cost::Cost;
use super::lanes::Lanes;
use super::{Queue, Stage};
use crate::job::Job;
use crate::traffic::{Class, Tenant};

/// When the last of `group` new jobs, queued behind `ahead` jobs, is expected to be answered
/// (its first chunk, for a streaming stage). `free_at` holds, per connected worker, when it can
/// take its next batch (now if idle); the batches ahead keep a worker busy `cost`, the new jobs'
/// own batch answers after `first` (the same model for plain workers).
pub fn predicted_finish(
    ahead: usize,
    group: usize,
    max_batch: usize,
    cost: Cost,
    first: Cost,
    free_at: &mut [Instant],
) -> Option<Instant> {
    predicted_finish_joined(ahead, group, max_batch, (cost, first), free_at, |_| 0)
}

/// [`predicted_finish`], the new jobs' own batch also carrying the weight `joining(taken)`
/// says will have arrived behind them by the time it is taken (up to a full batch): those
/// jobs are its batch-mates, and where each item costs, they lengthen it. Counted as the jobs
/// ahead alone, a stage whose items cost 50 ms each (batches of 8, 1 s deadlines, 1.2x load)
/// saw each new job's batch as a batch of its own few where it went out full, 400 ms: most jobs
/// it admitted ended 408, and it answered 9 a second of the 20 it could.
pub fn predicted_finish_joined(
    ahead: usize,
    group: usize,
    max_batch: usize,
    (cost, first): (Cost, Cost),
    free_at: &mut [Instant],
    joining: impl FnOnce(Instant) -> usize,
) -> Option<Instant> {
    let (taken, last_batch_size) = predicted_take(ahead, group, max_batch, cost, free_at)?;
    let last_batch_size = last_batch_size.saturating_add(joining(taken)).min(max_batch);
    Some(taken + first.of(last_batch_size))
}

/// The weight expected to arrive between `now` and `taken`, at the mean gap between
/// arrivals (None: no rate known yet, nothing is expected), each as heavy as `mean_weight`.
pub fn expected_weight(
    gap: Option<Duration>,
    now: Instant,
    taken: Instant,
    mean_weight: f64,
) -> usize {
    let Some(gap) = gap.filter(|gap| !gap.is_zero()) else { return 0 };
    let jobs = taken.saturating_duration_since(now).as_secs_f64() / gap.as_secs_f64();
    // Whole jobs only: one expected in half a gap has not arrived.
    (jobs.floor() * mean_weight.max(1.0)).min(usize::MAX as f64) as usize
}

/// How much longer a job waits for the higher classes' jobs that arrive while it waits, and
/// go before it (seconds of the workers' time). `wait` is its wait (seconds) for the work
/// queued ahead of it; `higher` holds each higher class's load (the share of the workers its
/// arrivals take: 1 keeps them busy) and how long its jobs go before the job (until it is
/// promoted into their class: those arriving after queue behind it). The job's wait `W` is
/// the work ahead plus the time spent on what overtook it,
/// `W = wait + Σ load · min(W, until)`, solved piece by piece between the promotions: a
/// higher class arriving as fast as the workers serve it holds the job back until its
/// promotion, however short the queue ahead. Counted as the queue alone, a low job beside a
/// closed loop of high ones that kept the worker busy was predicted to be taken within 150 ms,
/// admitted, and answered 408 at its 3 s deadline (with promotion after 10 s), every time.
pub fn overtaking(wait: f64, higher: &[(f64, f64)]) -> f64 {
    if higher.is_empty() {
        return 0.0;
    }
    let mut ends: Vec<f64> = higher.iter().map(|&(_, until)| until).collect();
    ends.sort_by(f64::total_cmp);
    let mut from = 0.0;
    let mut settled = wait;
    let mut waited = wait;
    for end in ends.into_iter().chain([f64::INFINITY]) {
        // Between `from` and `end`, the classes whose window is still open overtake at their
        // load; those closed before `from` added their whole window's work.
        let slope: f64 =
            higher.iter().filter(|&&(_, until)| until > from).map(|&(load, _)| load).sum();
        if slope < 1.0 {
            let w = settled / (1.0 - slope);
            if w <= end {
                waited = w.max(from);
                break;
            }
        }
        settled += higher
            .iter()
            .filter(|&&(_, until)| until > from && until <= end)
            .map(|&(load, until)| load * until)
            .sum::<f64>();
        from = end;
    }
    (waited - wait).max(0.0)
}

/// When the batch carrying the last of `group` jobs queued behind `ahead` is taken from the
/// queue, and its size: batch j goes to the j-th worker to take one, in round j / workers,
/// each round a full batch's `cost` after the one before (with equal batch costs the workers
/// take turns in the order they free up). `take_at` holds when each worker takes its next
/// batch. None: no worker.
fn predicted_take(
    ahead: usize,
    group: usize,
    max_batch: usize,
    cost: Cost,
    take_at: &mut [Instant],
) -> Option<(Instant, usize)> {
    if take_at.is_empty() || group == 0 {
        return None;
    }
    take_at.sort_unstable();
    let total = ahead + group;
    let batches = total.div_ceil(max_batch);
    let last_batch_size = total - (batches - 1) * max_batch;
    let j = batches - 1;
    let rounds_before = u32::try_from(j / take_at.len()).unwrap_or(u32::MAX);
    let taken = take_at[j % take_at.len()] + cost.of(max_batch).saturating_mul(rounds_before);
    Some((taken, last_batch_size))
}

/// Moves each worker's free time later by `heavy` jobs (their count, and their weight in all),
/// each sent alone and costed once, their time shared by the workers: as many full batches
/// each, every one paying the overhead, they had been counted 5,000 times over. In
/// nanoseconds, wide: a weight summed over the queue may pass u32 (what a Duration multiplies
/// by). Past a day it is as good as never, and kept there.
fn after_heavy(free_at: &mut [Instant], cost: Cost, (jobs, weight): (u128, u128)) {
    if jobs == 0 || free_at.is_empty() {
        return;
    }
    let nanos = cost.overhead.as_nanos() * jobs + cost.per_item.as_nanos() * weight;
    let share = nanos / free_at.len() as u128;
    let share = Duration::from_nanos(u64::try_from(share).unwrap_or(u64::MAX)).min(DAY);
    free_at.iter_mut().for_each(|at| *at += share);
}

/// What admission keeps back from a job's time budget: the prediction is an average, and the
/// answer must still travel to a client whose own timeout runs on the same budget. A job is
/// admitted only if it is predicted to finish with 5% of its timeout to spare.
pub fn margin(timeout: Duration) -> Duration {
    timeout / 20
}

/// The queued jobs' mean weight (1 with none queued).
fn mean_weight(jobs: &Lanes) -> f64 {
    if jobs.is_empty() {
        1.0
    } else {
        jobs.weight() as f64 / jobs.len() as f64
    }
}

/// `Retry-After` for a refused job: how far past its deadline it was predicted to finish,
/// rounded up to whole seconds (at least one).
pub fn retry_after(finish: Instant, deadline: Instant) -> Duration {
    let late = finish.saturating_duration_since(deadline).as_secs_f64();
    Duration::from_secs(late.ceil().max(1.0) as u64)
}

/// How recently the higher classes must have run out of queued work at a batch taken for a
/// lower job not to be counted as overtaken ([`Stage::overtaken`]).
const DRY: Duration = Duration::from_secs(1);

/// A prediction's ceiling: later than any deadline a client can ask for here, and far from
/// where an `Instant` overflows.
const DAY: Duration = Duration::from_secs(86_400);

/// The work queued before a new job of some class: the weight of the jobs that share batches,
/// and the count and weight of those heavier than the budget, which go alone.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ahead {
    pub(super) light: usize,
    pub(super) heavy: (usize, u64),
}

impl Ahead {
    /// Everything queued in `class` and above: what goes before a job of `class` at the latest.
    pub(super) fn from(jobs: &Lanes, class: Class) -> Ahead {
        let heavy = jobs.heavy_from(class);
        Ahead { light: (jobs.weight_from(class) - heavy.1) as usize, heavy }
    }

    /// What goes before a new request of `weight` from `tenant` in `class`, tenants taking
    /// turns ([`Lanes::weight_before`], with a `batch` of slack; more than is queued, where the
    /// other tenants are expected to keep their turns): the higher classes' heavy jobs all, its
    /// own class's in proportion to its part of that class (their count rounded up: a heavy job
    /// is costed only where one is counted), the rest light.
    pub(super) fn before(
        jobs: &Lanes,
        class: Class,
        tenant: Option<Tenant>,
        (weight, batch): (u64, u64),
    ) -> Ahead {
        let all = Ahead::from(jobs, class);
        let total = all.weight() as u64;
        let before = jobs.weight_before(class, tenant, weight, batch);
        if before >= total {
            let extra = usize::try_from(before - total).unwrap_or(usize::MAX);
            return Ahead { light: all.light.saturating_add(extra), heavy: all.heavy };
        }
        let (in_class, in_class_weight) = jobs.heavy_in(class);
        let higher = (all.heavy.0 - in_class, all.heavy.1 - in_class_weight);
        let class_weight = jobs.weight_in(class);
        let in_class_before = before.saturating_sub(total - class_weight);
        let share = |n: u64| {
            let n = u128::from(n) * u128::from(in_class_before);
            n.div_ceil(u128::from(class_weight.max(1))) as u64
        };
        let heavy_weight = share(in_class_weight).min(in_class_weight);
        let heavy_count = if heavy_weight > 0 { share(in_class as u64).max(1) } else { 0 };
        let heavy = (higher.0 + heavy_count as usize, higher.1 + heavy_weight);
        Ahead { light: before.saturating_sub(heavy.1) as usize, heavy }
    }

    /// All of it, as weight.
    pub(super) fn weight(self) -> usize {
        self.light + self.heavy.1 as usize
    }
}

/// Admission as the stage's queue stands: the work queued ahead of a request, when its jobs
/// would be answered behind it, and when a full queue will have room.
impl Stage {
    /// When `tenant` is predicted to hold few enough jobs to place `count` more within its share:
    /// once enough of its jobs have left, behind every job of a higher class than theirs, the
    /// tenants with work in their class taking turns (so each of its jobs leaves among as many
    /// of theirs). At least a second, and a second before a cost is learned; a constant second
    /// sent a tenant whose share took seconds to drain back in a storm, and its class left out,
    /// a tenant behind 60 high jobs was told a second where its first job left after six. Its
    /// jobs in lower classes than the first's are counted as if in that class: optimistic where
    /// they must leave too, the whole next class ahead of them.
    pub(super) fn share_in(
        &self,
        queue: &Queue,
        now: Instant,
        tenant: Tenant,
        count: usize,
        class: Class,
    ) -> Duration {
        let jobs = &queue.jobs;
        // Its jobs that must leave (all it holds, at most: holding none, it may place one
        // request past its share)...
        let held = jobs.of_tenant(tenant);
        let leave = (held + count).saturating_sub(self.tenant_limit).clamp(1, held.max(1));
        // ...after every job of a higher class than the one they wait in (the request's own
        // class says nothing of where its tenant's queued jobs are), each turn beside one of
        // every other tenant still holding work in that class.
        let waits_in = jobs.tenant_class(tenant).unwrap_or(class);
        let beside = jobs.turns_beside(waits_in, tenant, leave);
        self.gone_in(queue, now, jobs.jobs_above(waits_in) + leave + beside)
    }

    /// When the queue is predicted to have room for `count` more jobs: once enough of its jobs
    /// have left in batches (as admission replays them onto the workers), at least a second (a
    /// second, too, before a cost is learned). A constant second had the clients of a queue
    /// draining for seconds come back in a storm; the time this request's own work would end
    /// is later than the room it needs.
    pub(super) fn room_in(
        &self,
        queue: &Queue,
        now: Instant,
        count: usize,
        bytes: usize,
    ) -> Duration {
        let jobs = &queue.jobs;
        // The jobs that must leave, for its count or its bytes (at the queue's mean job size).
        let by_count = (jobs.len() + count).saturating_sub(self.capacity);
        let over_bytes = (jobs.bytes() + bytes).saturating_sub(self.capacity_bytes);
        let by_bytes = match jobs.len() {
            0 => 0,
            n => over_bytes.div_ceil((jobs.bytes() / n).max(1)),
        };
        let leave = by_count.max(by_bytes).clamp(1, jobs.len().max(1));
        self.gone_in(queue, now, leave)
    }

    /// A Retry-After for when `leave` queued jobs will have gone (their share of the queue's
    /// light and heavy jobs alike), in batches by weight as the replay sends them (counted as
    /// jobs of weight 1, a queue of jobs heavier than their batches' budget was told 1 s where
    /// it took 8), each heavy one alone and costed once, as [`Stage::predict`] costs it (as
    /// weight in full batches, each paying the overhead, a queue of jobs 5,000 budgets heavy was
    /// told 105 s where it had room in 1): at least a second, and a second before a cost is
    /// learned.
    fn gone_in(&self, queue: &Queue, now: Instant, leave: usize) -> Duration {
        let second = Duration::from_secs(1);
        let Some(cost) = queue.cost.estimate() else { return second };
        let jobs = &queue.jobs;
        // A job leaves the queue when its batch is taken (sent, or sent ahead), not when that
        // batch is done: counted to the end of the batch, and past one sent ahead, a full
        // queue was told to come back three to five times later than it had room.
        let mut take_at = queue.take_at(now, cost);
        if take_at.is_empty() {
            return second;
        }
        let share = if jobs.is_empty() { 1.0 } else { (leave as f64 / jobs.len() as f64).min(1.0) };
        let (heavy_jobs, heavy_weight) = jobs.heavy_from(Class::Low);
        let light_weight = jobs.weight().saturating_sub(heavy_weight);
        let heavy =
            ((heavy_jobs as f64 * share).ceil() as u128, (heavy_weight as f64 * share) as u128);
        after_heavy(&mut take_at, cost, heavy);
        let light = (light_weight as f64 * share).ceil() as usize;
        // Without heavy jobs, at least a unit a job, as a job's weight is.
        let light = if heavy.0 == 0 { light.max(leave) } else { light };
        let max = self.batch_weight(queue);
        let gone = match light {
            0 => take_at.iter().min().copied(),
            light => predicted_take(0, light, max, cost, &mut take_at).map(|(taken, _)| taken),
        };
        gone.map_or(second, |gone| retry_after(gone, now))
    }

    /// When `jobs` (a request's), behind the work `ahead`, would be answered (None:
    /// no worker). A job is never split: one heavier than a full batch goes in a batch of its
    /// own after the work before it, costing its weight once — not as that many full batches,
    /// each paying the overhead (a lone heavy job on an idle stage was refused so, for good),
    /// nor as wide batches that the whole queue ahead would share (it was then admitted behind
    /// a queue it could not pass). With several workers that is an upper bound: the heavy job
    /// could run beside the work before it. The heavy jobs queued ahead are costed alike, each
    /// once, their time shared by the workers (counted as weight, one of 1,000,000 behind a
    /// budget of 100 was 10,000 batches' overheads, and refused everything behind it).
    pub(super) fn predict(
        &self,
        queue: &Queue,
        now: Instant,
        cost: Cost,
        ahead: Ahead,
        jobs: &[Job],
    ) -> Option<Instant> {
        let first = queue.first_cost(cost);
        let mut free_at = queue.free_at(now, cost);
        after_heavy(&mut free_at, cost, (ahead.heavy.0 as u128, u128::from(ahead.heavy.1)));
        let max = self.batch_weight(queue);
        let weights = || jobs.iter().map(|job| job.weight as usize);
        let light: usize = weights().filter(|&weight| weight <= max).sum();
        let class = jobs.first().map_or(Class::High, |job| job.class);
        let overtaken =
            self.overtaken(queue, now, cost, class, (ahead.light, light, max), &free_at);
        free_at.iter_mut().for_each(|at| *at += overtaken);
        let ahead = ahead.light;
        if weights().all(|weight| weight <= max) {
            let mean = mean_weight(&queue.jobs);
            let gap = queue.arrivals.mean_gap();
            let joining = |taken| expected_weight(gap, now, taken, mean);
            return predicted_finish_joined(
                ahead,
                light,
                max,
                (cost, first),
                &mut free_at,
                joining,
            );
        }
        let start = match ahead + light {
            0 => *free_at.iter().min()?,
            before => predicted_finish(0, before, max, cost, cost, &mut free_at)?,
        };
        let alone = weights().filter(|&weight| weight > max);
        Some(alone.fold(start, |at, weight| at + first.of(weight)))
    }

    /// How much later the workers are free for a job of `class` queued behind `ahead` (in
    /// batches of `max`, the caller's [`Stage::batch_weight`], not walked again), for
    /// the higher classes' jobs expected to arrive and go before it ([`overtaking`]; each
    /// class at the rate its jobs were admitted over about the last second, until the job
    /// would be promoted into it, each of its jobs costing its share of a full batch of jobs of
    /// its mean weight: counted as weight in batches of the queue's mean weight, heavy high
    /// jobs at a quarter of the workers' capacity had every normal job refused).
    fn overtaken(
        &self,
        queue: &Queue,
        now: Instant,
        cost: Cost,
        class: Class,
        (ahead, group, max): (usize, usize, usize),
        free_at: &[Instant],
    ) -> Duration {
        // Higher classes that ran out of queued work at a batch taken within the last second
        // do not hold a lower job back: it is a batch's filler. Counted as a flood all the
        // same (their load measured near 1), closed loops just short of keeping the workers
        // busy had normal jobs refused that the build before served in 120 ms.
        if queue.dry[class.index()].is_some_and(|at| now.saturating_duration_since(at) < DRY) {
            return Duration::ZERO;
        }
        let aging = self.aging.as_secs_f64();
        let workers = free_at.len() as f64;
        let higher: Vec<(f64, f64)> = Class::DISPATCH_ORDER
            .into_iter()
            .filter(|&higher| higher > class)
            .filter_map(|higher| {
                let (jobs, weight) = queue.classes[higher.index()].rates(now)?;
                let mean = weight / jobs;
                let batch = self.full_batch(queue, mean);
                // A full batch of its jobs, and what each costs of it.
                let per_batch = (batch as f64 / mean.max(1.0)).max(1.0);
                let each = cost.of(batch).as_secs_f64() / per_batch;
                let promotions = (higher.index() - class.index()) as f64;
                let until = aging * promotions;
                Some((jobs * each / workers, until))
            })
            .collect();
        if higher.is_empty() || free_at.is_empty() {
            return Duration::ZERO;
        }
        let mut take_at = free_at.to_vec();
        let Some((taken, _)) = predicted_take(ahead, group.max(1), max, cost, &mut take_at) else {
            return Duration::ZERO;
        };
        let wait = taken.saturating_duration_since(now).as_secs_f64();
        Duration::from_secs_f64(overtaking(wait, &higher).min(DAY.as_secs_f64()))
    }

    /// The least time `jobs` take on this stage whatever its load and however many workers it
    /// has: their largest batch (one heavier than a batch's budget alone, else the lighter ones
    /// together up to a full batch of theirs: [`Stage::batch_jobs`] of them, within the budget),
    /// from an idle worker. Their own batch, not the queue's (whose mean weight may be far
    /// from theirs).
    pub(super) fn least_time(&self, queue: &Queue, cost: Cost, jobs: &[Job]) -> Duration {
        let first = queue.first_cost(cost);
        let total: u64 = jobs.iter().map(|job| u64::from(job.weight)).sum();
        let max = self.full_batch(queue, total as f64 / jobs.len().max(1) as f64);
        let weights = || jobs.iter().map(|job| job.weight as usize);
        let light: usize = weights().filter(|&weight| weight <= max).sum();
        let heaviest = weights().filter(|&weight| weight > max).max().unwrap_or(0);
        first.of(heaviest.max(light.min(max)))
    }

    /// The weight of a full batch: the budget, or a full batch's jobs ([`Stage::batch_jobs`])
    /// of the queue's mean weight, whichever is less.
    pub(super) fn batch_weight(&self, queue: &Queue) -> usize {
        self.full_batch(queue, mean_weight(&queue.jobs))
    }

    /// The weight of a full batch of jobs weighing `mean` each: the budget, or a full batch's
    /// jobs ([`Stage::batch_jobs`]) of that weight, whichever is less (at least 1).
    fn full_batch(&self, queue: &Queue, mean: f64) -> usize {
        let by_count = (self.batch_jobs(queue) as f64 * mean.max(1.0)).ceil() as usize;
        self.settings.max_batch_weight.map_or(by_count, |budget| budget.min(by_count)).max(1)
    }

    /// The most jobs a batch takes: `max_batch_size`, or less where every connected worker
    /// bounds its batches lower (hello `max_batch`: a joining worker's `max_running`). Replayed
    /// as batches of 32 for a worker taking 1, admission let in 20 times the work a deadline
    /// allowed, and each client got its 408 instead of a 503.
    pub(super) fn batch_jobs(&self, queue: &Queue) -> usize {
        let most = queue.seats.iter().flatten().map(|seat| seat.max_batch).max();
        self.settings.max_batch_size.min(most.unwrap_or(usize::MAX)).max(1)
    }

    /// [`Stage::batch_jobs`] now, for those outside the queue (Triton's model configuration).
    pub fn batch_bound(&self) -> usize {
        let queue = self.lock();
        self.batch_jobs(&queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// The seed's model: 500 ms per job, no batching.
    const SLOW: Cost = Cost { overhead: Duration::from_millis(500), per_item: Duration::ZERO };

    #[test]
    fn nothing_to_predict_without_workers() {
        assert_eq!(predicted_finish(3, 1, 1, SLOW, SLOW, &mut []), None);
    }

    #[test]
    fn an_idle_worker_and_an_empty_queue_finish_after_one_batch() {
        let now = Instant::now();
        assert_eq!(predicted_finish(0, 1, 1, SLOW, SLOW, &mut [now]), Some(now + ms(500)));
    }

    #[test]
    fn jobs_ahead_and_a_busy_worker_add_up() {
        let now = Instant::now();
        // The worker is 200 ms from done; 2 queued ahead; one batch each.
        let finish = predicted_finish(2, 1, 1, SLOW, SLOW, &mut [now + ms(200)]);
        assert_eq!(finish, Some(now + ms(200 + 3 * 500)));
    }

    #[test]
    fn workers_share_the_queue() {
        let now = Instant::now();
        // 3 ahead + 1 = 4 batches over 2 idle workers: 2 rounds.
        assert_eq!(predicted_finish(3, 1, 1, SLOW, SLOW, &mut [now, now]), Some(now + ms(1000)));
    }

    #[test]
    fn batching_packs_the_queue() {
        let now = Instant::now();
        let cost = Cost { overhead: ms(2), per_item: Duration::from_micros(200) };
        // 40 ahead + 1 = 41 jobs at batch 32: a full batch (8.4 ms), then a batch of 9 (3.8 ms).
        let finish = predicted_finish(40, 1, 32, cost, cost, &mut [now]).unwrap();
        assert_eq!(finish - now, Duration::from_micros(8400 + 3800));
    }

    #[test]
    fn a_streaming_job_must_only_start_answering_by_its_deadline() {
        let now = Instant::now();
        // Streams keep a worker 10 s; their first chunk comes after 100 ms.
        let busy = Cost { overhead: Duration::from_secs(10), per_item: Duration::ZERO };
        let first = Cost { overhead: ms(100), per_item: Duration::ZERO };
        assert_eq!(predicted_finish(0, 1, 1, busy, first, &mut [now]), Some(now + ms(100)));
        // Behind one stream: that stream's whole length, then this one's first chunk.
        let finish = predicted_finish(1, 1, 1, busy, first, &mut [now]);
        assert_eq!(finish, Some(now + Duration::from_secs(10) + ms(100)));
    }

    #[test]
    fn the_jobs_arriving_before_a_batch_is_taken_are_its_batch_mates() {
        // 50 ms an item, batches of 8; the worker frees up in 200 ms, 2 jobs queued ahead.
        let now = Instant::now();
        let cost = Cost { overhead: Duration::ZERO, per_item: ms(50) };
        let alone = predicted_finish(2, 1, 8, cost, cost, &mut [now + ms(200)]);
        assert_eq!(alone, Some(now + ms(200 + 3 * 50)), "its batch as the jobs ahead make it");
        // A job every 25 ms: 8 more by then, and its batch goes out full.
        let joining = |taken| expected_weight(Some(ms(25)), now, taken, 1.0);
        let full = predicted_finish_joined(2, 1, 8, (cost, cost), &mut [now + ms(200)], joining);
        assert_eq!(full, Some(now + ms(200 + 8 * 50)));
        // A job every 80 ms: 2 more, a batch of 5. Taken at once (an idle worker): none.
        let joining = |taken| expected_weight(Some(ms(80)), now, taken, 1.0);
        let five = predicted_finish_joined(2, 1, 8, (cost, cost), &mut [now + ms(200)], joining);
        assert_eq!(five, Some(now + ms(200 + 5 * 50)));
        let joining = |taken| expected_weight(Some(ms(1)), now, taken, 1.0);
        let idle = predicted_finish_joined(0, 1, 8, (cost, cost), &mut [now], joining);
        assert_eq!(idle, Some(now + ms(50)));
        assert_eq!(expected_weight(None, now, now + ms(200), 1.0), 0, "no rate yet");
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let now = Instant::now();
        assert_eq!(retry_after(now + ms(100), now), Duration::from_secs(1));
        assert_eq!(retry_after(now + ms(2100), now), Duration::from_secs(3));
    }
}
