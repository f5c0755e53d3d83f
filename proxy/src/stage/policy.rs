//! When an idle worker's batch is released: the pure decision, kept apart from the queue so that
//! each rule is tested on its own with plain numbers.
//!
//! Hard bounds, for every policy: a full batch (by count or bytes) goes at once, and no job waits
//! for batch-mates longer than `max_wait` counted from the oldest queued job's arrival (never
//! restarted per arrival: a sliding window lets a steady trickle hold the first job back forever).
//!
//! Within them, [`Policy::Adaptive`] waits only while waiting pays. Holding k queued jobs for a
//! moment longer costs each of them that moment; a job arriving in that moment and joining the
//! batch saves itself the wait for the batch that would otherwise be running, and the batch
//! overhead of a batch of its own. At the margin, waiting pays while the jobs expected to arrive
//! during one batch overhead outnumber the jobs already queued: `k < overhead / mean_gap`. With
//! no history there is nothing to expect, so nothing waits; one closed-loop client (a gap longer
//! than the batch overhead) never waits either. It also stops waiting when arrivals dry up (no
//! arrival for two mean gaps: a closed-loop burst is over) and when the oldest job's deadline
//! leaves no more slack than the expected batch duration.
//!
//! Right after a batch is answered, the adaptive policy also weighs the jobs expected back from
//! it ([`super::returns`]): waiting until they are due, with k jobs queued, costs k × that wait;
//! each returning job that joins saves itself the batch it would otherwise wait out. It waits
//! when the saving is larger (and the oldest job's deadline allows). That wait may go past
//! `max_wait` counted from the oldest arrival — those jobs queued while every worker was busy —
//! but never past `max_wait` after the worker asking became free: `max_wait` bounds the time a
//! job is held back while a worker could run it. The bound is the worker's own, not the latest
//! answer's: with several workers, each answer announces returns due a little later, and a free
//! worker that followed them would wait as long as the others kept answering.

use std::time::Duration;

use tokio::time::Instant;

use super::cost::Cost;
use super::returns::Expected;

/// Which release rule a stage follows (`--batch-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Release as soon as waiting no longer pays, within the hard bounds.
    Adaptive,
    /// Always wait up to max-wait for a full batch, as MOSEC and Triton's dynamic batcher do
    /// (but never past a job's deadline).
    Fixed,
}

/// The batch bounds and rule of one stage.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// Most jobs in one batch.
    pub max_batch_size: usize,
    /// Longest the oldest queued job waits for batch-mates.
    pub max_wait: Duration,
    /// Most payload bytes in one batch (`--max-batch-bytes`, never more than a full batch's
    /// frame carries); a job larger than it goes alone.
    pub max_batch_bytes: usize,
    /// Most payload bytes of one job: what a batch frame of that job alone carries. Larger
    /// inputs are refused (413) before they are queued.
    pub max_job_bytes: usize,
    /// Most total weight in one batch (`--max-batch-weight`; None: unbounded). An item heavier
    /// than this alone goes in a batch of its own.
    pub max_batch_weight: Option<usize>,
    pub policy: Policy,
    /// Whether a saturated stage may send a busy worker its next batch ahead.
    pub prefetch: bool,
    /// Longest a worker may hold a batch before it is declared hung (None: the longest timeout
    /// among its jobs' routes plus a margin).
    pub batch_timeout: Option<Duration>,
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

/// What the queue, and the worker asking, look like to the policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueView {
    pub jobs: usize,
    pub bytes: usize,
    /// Total weight queued (the jobs' count when nothing is weighed): what batches cost.
    pub weight: usize,
    /// Arrival of the oldest queued job (None when empty).
    pub oldest: Option<Instant>,
    /// The earliest deadline among the jobs the next batch would take (not only the oldest
    /// job's: a later one may be due sooner, a client's shorter deadline).
    pub earliest_deadline: Option<Instant>,
    /// When the worker asking became free (None: before the oldest job arrived).
    pub worker_free_since: Option<Instant>,
}

impl QueueView {
    /// The queued jobs' mean weight (1 when nothing is queued or weighed).
    fn mean_weight(&self) -> f64 {
        if self.jobs == 0 {
            1.0
        } else {
            (self.weight as f64 / self.jobs as f64).max(1.0)
        }
    }
}

/// What the stage has learned about its traffic and its workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Forecast {
    /// Mean time between arrivals.
    pub mean_gap: Option<Duration>,
    /// When the latest job arrived.
    pub last_arrival: Option<Instant>,
    /// The learned batch cost.
    pub cost: Option<Cost>,
    /// Jobs expected back from the batch just answered.
    pub returns: Option<Expected>,
}

pub fn decide(
    queue: QueueView,
    now: Instant,
    settings: &BatchSettings,
    forecast: &Forecast,
) -> Release {
    let Some(oldest) = queue.oldest else {
        return Release::Idle;
    };
    let heavy = settings.max_batch_weight.is_some_and(|budget| queue.weight >= budget);
    if queue.jobs >= settings.max_batch_size || queue.bytes >= settings.max_batch_bytes || heavy {
        return Release::Now;
    }
    let mut release_at = oldest + settings.max_wait;
    if let Some(deadline) = queue.earliest_deadline {
        // Never waited out past the point where the batch's earliest-due job can still be
        // answered in time: its deadline less the batch's learned cost and a margin, or, none
        // learned yet, halfway there from the oldest arrival. (A `--max-wait-ms` at or above the
        // deadline answered every lone request 408; without the margin, most of them still.)
        let latest = match forecast.cost {
            Some(cost) => latest_start(deadline, oldest, cost.of(queue.weight), now),
            None => oldest + deadline.saturating_duration_since(oldest) / 2,
        };
        release_at = release_at.min(latest);
    }
    if settings.policy == Policy::Adaptive {
        // Since when a worker could have run the oldest job: the hold for returns ends max_wait
        // after that, however many answers announce more returns meanwhile.
        let held_since = queue.worker_free_since.map_or(oldest, |free| free.max(oldest));
        let hold_until = held_since + settings.max_wait;
        let returns = returns_limit(queue, now, forecast).map(|until| until.min(hold_until));
        if let Some(until) = returns.filter(|&until| now < until) {
            return Release::At(until);
        }
        match adaptive_limit(queue, now, forecast) {
            None => return Release::Now,
            Some(limit) => release_at = release_at.min(limit),
        }
    }
    if now >= release_at {
        Release::Now
    } else {
        Release::At(release_at)
    }
}

/// Until when to wait for the jobs expected back from the batch just answered; None when it does
/// not pay, or the oldest job's deadline leaves no room for it.
fn returns_limit(queue: QueueView, now: Instant, forecast: &Forecast) -> Option<Instant> {
    let (cost, returns) = (forecast.cost?, forecast.returns?);
    if now >= returns.by {
        return None;
    }
    let waiting = queue.jobs as f64 * (returns.by - now).as_secs_f64();
    let saved = returns.jobs * cost.of(queue.weight).as_secs_f64();
    if saved <= waiting {
        return None;
    }
    let joined = queue.weight + (returns.jobs * queue.mean_weight()).ceil() as usize;
    if let (Some(deadline), Some(oldest)) = (queue.earliest_deadline, queue.oldest) {
        if returns.by > latest_start(deadline, oldest, cost.of(joined), now) {
            return None;
        }
    }
    Some(returns.by)
}

/// The latest instant worth waiting until, by the adaptive rules; None when waiting does not pay
/// at all.
fn adaptive_limit(queue: QueueView, now: Instant, forecast: &Forecast) -> Option<Instant> {
    let cost = forecast.cost?;
    let gap = forecast.mean_gap?;
    let last_arrival = forecast.last_arrival?;
    let expected = cost.overhead.as_secs_f64() / gap.as_secs_f64().max(1e-9);
    if queue.jobs as f64 >= expected {
        return None;
    }
    let mut limit = last_arrival + gap * 2;
    if let (Some(deadline), Some(oldest)) = (queue.earliest_deadline, queue.oldest) {
        // Leave the batch (one job larger than now) time to run before the earliest deadline.
        let one_more = queue.weight + queue.mean_weight().ceil() as usize;
        limit = limit.min(latest_start(deadline, oldest, cost.of(one_more), now));
    }
    (now < limit).then_some(limit)
}

/// The latest a batch may leave to be answered by `deadline` when it runs for `run`: less a
/// margin for what the learned cost does not hold — admission's ([`admission::margin`], 5% of
/// the time from the oldest arrival to the deadline) for the socket both ways and the answer's
/// writing, a tenth of the run for a batch slower than the average, and the timer's step
/// ([`TIMER_STEP`]). (With none, under `--batch-policy fixed` a lone job whose deadline came
/// before `--max-wait-ms` left on its deadline less the cost, and most such jobs were answered
/// 408 on an idle worker; with 5% alone, a 20 ms model's jobs of 30 ms left 1.5 ms to spare,
/// less than the timer's step and the model's jitter, and 3 in 8 were answered 408 after the
/// worker's work.) `now` if that is past.
fn latest_start(deadline: Instant, oldest: Instant, run: Duration, now: Instant) -> Instant {
    let margin = super::admission::margin(deadline.saturating_duration_since(oldest))
        + run / 10
        + TIMER_STEP;
    deadline.checked_sub(run.saturating_add(margin)).unwrap_or(now)
}

/// How late a timer may fire: tokio's wheel counts whole milliseconds.
const TIMER_STEP: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(10);

    fn settings(policy: Policy) -> BatchSettings {
        BatchSettings {
            max_batch_size: 4,
            max_wait: WAIT,
            max_batch_bytes: 1000,
            max_job_bytes: 1 << 20,
            max_batch_weight: None,
            policy,
            prefetch: false,
            batch_timeout: None,
        }
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn view(jobs: usize, oldest: Instant) -> QueueView {
        QueueView {
            jobs,
            bytes: jobs * 10,
            weight: jobs,
            oldest: Some(oldest),
            earliest_deadline: Some(oldest + Duration::from_secs(5)),
            worker_free_since: None,
        }
    }

    /// Busy traffic: a job every 0.5 ms, batches with 2 ms overhead — four expected per overhead.
    fn busy(last_arrival: Instant) -> Forecast {
        Forecast {
            mean_gap: Some(Duration::from_micros(500)),
            last_arrival: Some(last_arrival),
            cost: Some(Cost { overhead: ms(2), per_item: Duration::from_micros(200) }),
            returns: None,
        }
    }

    #[test]
    fn an_empty_queue_is_idle() {
        for policy in [Policy::Adaptive, Policy::Fixed] {
            let release = decide(
                QueueView::default(),
                Instant::now(),
                &settings(policy),
                &busy(Instant::now()),
            );
            assert_eq!(release, Release::Idle);
        }
    }

    #[test]
    fn a_full_batch_goes_at_once() {
        let now = Instant::now();
        for policy in [Policy::Adaptive, Policy::Fixed] {
            assert_eq!(decide(view(4, now), now, &settings(policy), &busy(now)), Release::Now);
            let by_bytes = QueueView { bytes: 1000, ..view(2, now) };
            assert_eq!(decide(by_bytes, now, &settings(policy), &busy(now)), Release::Now);
        }
    }

    #[test]
    fn fixed_waits_max_wait_from_the_oldest_arrival() {
        let oldest = Instant::now();
        let fixed = settings(Policy::Fixed);
        let now = oldest + ms(4);
        assert_eq!(
            decide(view(2, oldest), now, &fixed, &Forecast::default()),
            Release::At(oldest + WAIT)
        );
        let later = oldest + WAIT;
        assert_eq!(decide(view(2, oldest), later, &fixed, &Forecast::default()), Release::Now);
    }

    #[test]
    fn no_policy_waits_out_the_oldest_jobs_deadline() {
        // A max wait of a minute for jobs of a second: every lone request got its 408.
        let oldest = Instant::now();
        let long = BatchSettings { max_wait: Duration::from_secs(60), ..settings(Policy::Fixed) };
        let due = QueueView { earliest_deadline: Some(oldest + ms(1000)), ..view(1, oldest) };
        let none_learned = Forecast::default();
        assert_eq!(decide(due, oldest, &long, &none_learned), Release::At(oldest + ms(500)));
        let learned = Forecast {
            cost: Some(Cost { overhead: ms(100), per_item: ms(50) }),
            ..Forecast::default()
        };
        // Its deadline less the batch's 150 ms and a margin: 5% of its second, a tenth of the
        // batch, and the timer's step.
        assert_eq!(decide(due, oldest, &long, &learned), Release::At(oldest + ms(784)));
        // Within its wait, the deadline far off: the wait as set.
        let far = QueueView { earliest_deadline: Some(oldest + ms(60_000)), ..view(1, oldest) };
        let fixed = settings(Policy::Fixed);
        assert_eq!(decide(far, oldest, &fixed, &none_learned), Release::At(oldest + WAIT));
    }

    #[test]
    fn adaptive_without_history_does_not_wait() {
        let now = Instant::now();
        let adaptive = settings(Policy::Adaptive);
        assert_eq!(decide(view(1, now), now, &adaptive, &Forecast::default()), Release::Now);
    }

    #[test]
    fn adaptive_with_no_expected_arrivals_does_not_wait() {
        // One closed-loop client: a request every 3 ms, batches with 0.1 ms overhead.
        let now = Instant::now();
        let lone = Forecast {
            mean_gap: Some(ms(3)),
            last_arrival: Some(now),
            cost: Some(Cost {
                overhead: Duration::from_micros(100),
                per_item: Duration::from_micros(10),
            }),
            returns: None,
        };
        assert_eq!(decide(view(1, now), now, &settings(Policy::Adaptive), &lone), Release::Now);
    }

    #[test]
    fn adaptive_waits_while_more_jobs_are_expected_than_queued() {
        let now = Instant::now();
        let adaptive = settings(Policy::Adaptive);
        // 2 queued < 4 expected per overhead: wait, until arrivals would count as dried up.
        assert_eq!(decide(view(2, now), now, &adaptive, &busy(now)), Release::At(now + ms(1)));
        // 4 queued: but the batch is full anyway. Use a bigger batch to see the rule itself.
        let roomy = BatchSettings { max_batch_size: 32, ..adaptive };
        assert_eq!(decide(view(4, now), now, &roomy, &busy(now)), Release::Now);
    }

    #[test]
    fn adaptive_stops_waiting_when_arrivals_dry_up() {
        let oldest = Instant::now();
        let now = oldest + ms(1);
        let adaptive = settings(Policy::Adaptive);
        assert_eq!(decide(view(2, oldest), now, &adaptive, &busy(oldest)), Release::Now);
    }

    #[test]
    fn adaptive_never_waits_past_max_wait() {
        let oldest = Instant::now();
        let now = oldest + WAIT;
        let adaptive = settings(Policy::Adaptive);
        assert_eq!(decide(view(1, oldest), now, &adaptive, &busy(now)), Release::Now);
    }

    #[test]
    fn adaptive_leaves_the_oldest_job_time_to_make_its_deadline() {
        let now = Instant::now();
        let adaptive = settings(Policy::Adaptive);
        // Deadline in 4 ms; a batch of 2 is expected to take 2.4 ms, and the margin is 5% of
        // the 4 ms, a tenth of the batch and the timer's 1 ms step: 0.16 ms of slack left.
        let tight = QueueView { earliest_deadline: Some(now + ms(4)), ..view(1, now) };
        assert_eq!(
            decide(tight, now, &adaptive, &busy(now)),
            Release::At(now + Duration::from_micros(160))
        );
        let none_left = QueueView { earliest_deadline: Some(now + ms(3)), ..view(1, now) };
        assert_eq!(decide(none_left, now, &adaptive, &busy(now)), Release::Now);
    }

    /// A batch was just answered: 16 jobs queued while it ran, its 16 clients expected back within
    /// 1 ms; a model call costs 20 ms + 6 ms per item.
    fn returning(now: Instant, per_item_us: u64, overhead_us: u64) -> Forecast {
        Forecast {
            mean_gap: Some(ms(10)),
            last_arrival: Some(now - ms(100)),
            cost: Some(Cost {
                overhead: Duration::from_micros(overhead_us),
                per_item: Duration::from_micros(per_item_us),
            }),
            returns: Some(Expected { jobs: 16.0, by: now + ms(1) }),
        }
    }

    /// `jobs` queued while every worker was busy, 150 ms ago; the worker asking became free at
    /// `free`.
    fn queued_while_busy(jobs: usize, now: Instant, free: Instant) -> QueueView {
        QueueView { worker_free_since: Some(free), ..view(jobs, now - ms(150)) }
    }

    #[test]
    fn adaptive_waits_for_the_clients_it_just_answered() {
        let now = Instant::now();
        let roomy = BatchSettings { max_batch_size: 32, ..settings(Policy::Adaptive) };
        // The 16 queued jobs have waited far longer than max_wait already (the worker was busy).
        let queued = queued_while_busy(16, now, now);
        let expensive = returning(now, 6000, 20_000);
        assert_eq!(decide(queued, now, &roomy, &expensive), Release::At(now + ms(1)));
        // The fixed policy keeps the peers' behaviour: max_wait from the oldest arrival.
        let fixed = BatchSettings { policy: Policy::Fixed, ..roomy };
        assert_eq!(decide(queued, now, &fixed, &expensive), Release::Now);
    }

    #[test]
    fn adaptive_waits_for_returns_at_most_max_wait_after_the_worker_became_free() {
        let now = Instant::now();
        let roomy = BatchSettings { max_batch_size: 32, ..settings(Policy::Adaptive) };
        // Another worker's answer announces returns due 1 ms from now.
        let expensive = returning(now, 6000, 20_000);
        // Free for 9 ms: 1 ms left of max_wait; free for 10 ms: no wait left.
        let almost = queued_while_busy(16, now, now - ms(9));
        assert_eq!(decide(almost, now, &roomy, &expensive), Release::At(now + ms(1)));
        let free_long = queued_while_busy(16, now, now - WAIT + Duration::from_micros(500));
        let at_the_bound = now + Duration::from_micros(500);
        assert_eq!(decide(free_long, now, &roomy, &expensive), Release::At(at_the_bound));
        let spent = queued_while_busy(16, now, now - WAIT);
        assert_eq!(decide(spent, now, &roomy, &expensive), Release::Now);
        // Jobs that arrived while the worker was already free: max_wait from their arrival.
        let fresh = QueueView { worker_free_since: Some(now - ms(150)), ..view(16, now - WAIT) };
        assert_eq!(decide(fresh, now, &roomy, &expensive), Release::Now);
    }

    #[test]
    fn adaptive_does_not_wait_for_returns_when_batches_are_cheap() {
        let now = Instant::now();
        let roomy = BatchSettings { max_batch_size: 32, ..settings(Policy::Adaptive) };
        // 16 jobs × 1 ms of waiting costs more than 16 returns save on a 16 µs batch.
        let cheap = returning(now, 0, 16);
        assert_eq!(decide(queued_while_busy(16, now, now), now, &roomy, &cheap), Release::Now);
    }

    #[test]
    fn adaptive_does_not_wait_for_returns_past_the_earliest_deadline() {
        let now = Instant::now();
        let roomy = BatchSettings { max_batch_size: 32, ..settings(Policy::Adaptive) };
        // A joined batch of 32 takes 212 ms; the oldest job has 200 ms left.
        let tight =
            QueueView { earliest_deadline: Some(now + ms(200)), ..queued_while_busy(16, now, now) };
        assert_eq!(decide(tight, now, &roomy, &returning(now, 6000, 20_000)), Release::Now);
    }
}
