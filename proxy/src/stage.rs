//! A stage: a bounded queue of jobs and the idle workers that pull batches from it.
//!
//! HTTP handlers submit a request's jobs ([`Stage::submit_all`], through `pipeline`); each worker
//! connection, whenever its worker is idle, awaits [`WorkerSeat::next_batch`], which applies the
//! batch [`policy`] and hands over up to a batch of live jobs. Jobs past their deadline are
//! answered [`Outcome::Expired`] and jobs whose client left are dropped here, so neither is ever
//! dispatched. Admission refuses jobs that the queue has no room for, or that could not finish
//! before their deadline ([`admission`]).
//!
//! Admission predicts from the queue and the seats (what each worker holds), so a job is always
//! in exactly one of them: a batch leaves the queue and lands on its worker's seat in the same
//! locked step. Were the seat marked a moment later, jobs admitted in between would see an idle
//! worker and an empty queue, and be admitted to time out.
//!
//! Here: the queue, admission into it ([`Stage::submit_all`]) and requeued retries. Beside it:
//! how batches leave it (`stage/taking.rs`), the workers' seats (`stage/seat.rs`), a request
//! leaving before its answer (`stage/departure.rs`), what its workers declared
//! (`stage/declared.rs`), the queue's order ([`lanes`]), the release
//! policy ([`policy`]), and what admission and the policy learn from ([`cost`], [`arrivals`],
//! [`returns`]).

pub mod admission;
pub mod arrivals;
pub mod cost;
mod declared;
mod departure;
pub mod lanes;
pub mod policy;
pub mod returns;
mod seat;
mod taking;
pub mod weight;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::job::{Job, Outcome};
use crate::metrics::{metrics, Place};
use crate::traffic::Class;
use admission::Ahead;
use arrivals::{Arrivals, Recent};
use cost::CostModel;
pub use declared::{Declared, Parts};
pub use departure::Departure;
use departure::PURGE_EVERY;
use lanes::Lanes;
pub use policy::{BatchSettings, Policy};
use policy::{Forecast, QueueView};
use returns::Returns;
pub use seat::WorkerSeat;
pub(crate) use taking::goes_alone;
pub use weight::WeightRule;

/// Why jobs were not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Shed {
    /// The queue has no room for them under `--queue-capacity` or `--queue-capacity-bytes`;
    /// `retry_after`: when it is predicted to have room ([`Stage::room_in`]).
    QueueFull { retry_after: Duration },
    /// They were predicted to finish past their deadline; worth retrying after `retry_after`.
    /// `alone`: even their own largest batch, on an idle worker, is predicted to outlast the
    /// request's whole time (the client is told to give it more time or fewer items).
    DeadlineUnreachable { retry_after: Duration, alone: bool },
    /// Their tenant already holds its share of the queue (`--tenant-queue-share`).
    TenantQuota { retry_after: Duration },
    /// The stage is closed: the proxy is stopping.
    ShuttingDown,
}

impl Shed {
    /// Every shed's code word: the metric's series are made at 0 for each ([`crate::metrics`]).
    pub const CODES: [&'static str; 4] =
        ["queue_full", "deadline_unreachable", "tenant_quota", "shutting_down"];

    /// This shed's code word, as the admission span gives it; the client's error body and the
    /// shed metric carry the same one (`http::shed_error`, and a test there holds them to it).
    pub fn code(&self) -> &'static str {
        match self {
            Shed::QueueFull { .. } => "queue_full",
            Shed::DeadlineUnreachable { .. } => "deadline_unreachable",
            Shed::TenantQuota { .. } => "tenant_quota",
            Shed::ShuttingDown => "shutting_down",
        }
    }
}

pub struct Stage {
    name: String,
    /// The declarations, each part (schemas, tensors, weight rule) as the latest hello that
    /// declared it gave it (`Declared::over`; read per v2 request: shared, not copied).
    declared: Mutex<Option<Arc<Declared>>>,
    /// Moved on, under `declared`'s lock, each time the declared tensors change: a v2, KServe v1
    /// or OpenAI request's rows are marked with the one they were read against, and a row whose
    /// mark is not the stage's when it is taken for a batch is answered 503
    /// `tensors_changed` rather than sent as rows of tensors its worker does not take
    /// ([`Stage::declared_marked`]).
    tensors_epoch: AtomicU64,
    /// Each connected worker's own declarations, in the order they joined: what the stage's are
    /// laid again from when one leaves ([`Stage::forget_departed`]).
    declarers: Mutex<declared::Declarers>,
    /// Whether those declarations hold a weight rule: jobs are weighed without a lock otherwise.
    weighs: AtomicBool,
    settings: BatchSettings,
    capacity: usize,
    /// Payload bytes the queue holds; an empty queue takes any one request.
    capacity_bytes: usize,
    /// Some pipeline passes this stage's outputs to another stage: its workers may not stream.
    feeds: bool,
    /// Longest a streamed answer from this stage may last, from the request's arrival.
    stream_timeout: Duration,
    /// How long a job waits in its class before it is promoted (`--priority-aging-ms`).
    aging: Duration,
    /// Most jobs one tenant may have queued (`--tenant-queue-share` of the capacity).
    tenant_limit: usize,
    /// The devices its spawned workers are spread over (`--gpus`): the only `gpu` labels.
    gpus: Vec<u32>,
    queue: Mutex<Queue>,
    /// Woken whenever what the queue offers changed: an arrival, jobs given back, and a job that
    /// went alone leaving the front (the pulls waiting behind it). Waiting workers then re-run
    /// the policy.
    arrivals: Notify,
    /// How often its spawned workers exited, how the last did, and why the last was refused
    /// since one last joined: what `/readyz` says of a stage without a worker (a crash loop,
    /// rather than a slow start; a worker refused at every restart, and why).
    exits: Mutex<Exits>,
    /// Held by a worker from its hello's check against the stage's tensors to its seat
    /// ([`Stage::joining`]).
    joining: Mutex<()>,
    /// Whether a worker ever connected: from then on what the stage's workers declared (if
    /// anything) is known, a worker restarting or not ([`Stage::declarations_known`]). Read by
    /// every v2 and KServe v1 request: not under the queue's lock.
    joined_once: AtomicBool,
}

#[derive(Default)]
struct Queue {
    /// The queued jobs, in lanes by class and tenant ([`lanes`]).
    jobs: Lanes,
    arrivals: Arrivals,
    /// The recent arrivals of each class (by [`Class::index`]): how fast higher classes' jobs
    /// come, which go before a lower one while it waits ([`admission::overtaking`]).
    classes: [Recent; 3],
    /// By class (by [`Class::index`]): when a batch last took in a job of this class or lower,
    /// or went out with room, no higher job left queued. The higher classes did not hold such
    /// a job back then, however fast they came.
    dry: [Option<Instant>; 3],
    /// How long a batch keeps its worker busy, by weight (its size, when nothing is weighed):
    /// what the policy and a busy worker's free time are predicted from.
    cost: CostModel,
    /// How long a batch takes to its first answer (its first chunk, for a streaming worker; its
    /// results, for a plain one, where the two models learn the same samples): what a new job's
    /// own batch is predicted to take before its deadline, which bounds the first chunk.
    first: CostModel,
    returns: Returns,
    /// One slot per connected worker (None: a free slot).
    seats: Vec<Option<Seat>>,
    /// The device of the worker in each slot, if it was given one (by slot, as `seats`).
    devices: Vec<Option<u32>>,
    /// Set once the proxy stops: nothing more is admitted.
    closed: bool,
    /// When dead jobs were last cleared out of the whole queue.
    last_purge: Option<Instant>,
    /// When a job was last admitted against the prediction, as a probe ([`PROBE_EVERY`]).
    last_probe: Option<Instant>,
    /// When a batch's cost was last learned: a prediction older than [`STALE_AFTER`] on an idle
    /// stage may be probed even for a request refused for its own size.
    learned: Option<Instant>,
    /// Whether a purge is due once [`PURGE_EVERY`] allows ([`Stage::purge`]).
    purge_pending: bool,
    /// The batches its workers finished, by size (Triton's statistics).
    executions: crate::statistics::Executions,
}

/// How long a queued job waits in its class before it is promoted, unless set
/// (`--priority-aging-ms`).
pub const DEFAULT_AGING: Duration = Duration::from_secs(5);

/// At most one request a second is admitted against the prediction, as a probe of a stale one: on a
/// model that really is too slow for the deadlines asked, that is one request a second run to its
/// 408 on a worker that was idle anyway.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// A request refused for its own size alone (a light job would fit) is probed only once the stage
/// has learned nothing for this long: its batch, run to a 408, holds the worker for as long as
/// the model really takes, so at most one such probe starts in this time where the model
/// really is too slow for it.
const STALE_AFTER: Duration = Duration::from_secs(10);

/// What the stage knows of one connected worker.
#[derive(Debug, Clone, Copy)]
struct Seat {
    /// The batch the worker is working on: when it started and its weight.
    busy: Option<(Instant, usize)>,
    /// Weight of a batch sent ahead, waiting in the worker's socket (0: none).
    ahead: usize,
    /// When the worker last became free (joined, or answered with nothing sent ahead): the
    /// policy holds queued jobs back at most `max_wait` from then.
    free_since: Instant,
    /// The most jobs the worker takes in one batch (its hello's `max_batch`; else unbounded
    /// here, the stage's `max_batch_size` bounding every batch).
    max_batch: usize,
    /// What its hello declared: a newcomer declaring other tensors is refused only while a
    /// worker declaring tensors is connected ([`Stage::tensor_conflict`]), and a part no
    /// connected worker declares may be forgotten ([`Stage::forget_all_but`]).
    declares: Parts,
}

impl Seat {
    fn free(now: Instant) -> Self {
        let (max_batch, declares) = (usize::MAX, Parts::default());
        Self { busy: None, ahead: 0, free_since: now, max_batch, declares }
    }

    /// The same worker free again from `now`: nothing held, its own bound and declarations
    /// kept.
    fn freed(&self, now: Instant) -> Self {
        let (max_batch, declares) = (self.max_batch, self.declares);
        Self { max_batch, declares, ..Self::free(now) }
    }
}

impl Queue {
    /// Removes jobs that must not be dispatched: expired ones are answered, abandoned ones dropped.
    /// Only the front is cleaned on the hot path (`whole == false`): that is all the policy looks
    /// at; the whole queue is cleaned when it looks full and when a client leaves
    /// ([`Stage::purge`]), at most every [`PURGE_EVERY`]. Returns whether a job that goes alone
    /// was among them: the pulls that wait behind one (joins, batches sent ahead) may look again.
    fn drop_dead(&mut self, now: Instant, whole: bool) -> bool {
        let dead = |job: &Job| job.is_abandoned() || job.is_expired(now);
        let mut alone = false;
        let mut take_out = |job: Job| {
            alone |= job.alone;
            bury(job, now);
        };
        if whole {
            self.jobs.remove_dead(dead).into_iter().for_each(&mut take_out);
            return alone;
        }
        while self.jobs.front().is_some_and(dead) {
            take_out(self.jobs.pop(false).expect("front exists"));
        }
        alone
    }

    /// Whether a job predicted to miss `latest` is admitted all the same, as a probe of a
    /// prediction that may be stale: the stage is idle (nothing queued ahead of it, a worker
    /// free), even the lightest job is predicted to miss (so no job with this little time is
    /// admitted otherwise, no batch runs, and the cost is never learned again), and no probe went
    /// in the last [`PROBE_EVERY`]. One slow batch — a cold start, a pause, a late worker — once
    /// refused every request with a shorter deadline for good, on a healthy idle stage.
    ///
    /// A job refused only for its own weight (the lightest job would fit) is probed too, if it
    /// is `worth` it (it might make it, and would not get its worker declared hung), once the
    /// stage has learned nothing for [`STALE_AFTER`] nor probed so in that time: a model that
    /// became faster refused every multi-item request for good once only those came (60 of 60
    /// 8-item requests on an idle stage, 500 ms each where the model now took 40).
    fn may_probe(
        &self,
        now: Instant,
        ahead: usize,
        latest: Instant,
        cost: cost::Cost,
        worth: bool,
    ) -> bool {
        let idle = ahead == 0 && self.seats.iter().flatten().any(|seat| seat.busy.is_none());
        let lightest = self.first_cost(cost).of(1);
        let due = self.last_probe.is_none_or(|at| now >= at + PROBE_EVERY);
        let stale = worth
            && self.learned.is_none_or(|at| now >= at + STALE_AFTER)
            && self.last_probe.is_none_or(|at| now >= at + STALE_AFTER);
        idle && due && (now + lightest > latest || stale)
    }

    /// A batch took `took` to its first answer (a chunk, or a plain worker's results): what the
    /// stage learns of it, and of the batch's whole cost where the worker takes new jobs
    /// within a step (`joining`) or answers at once (`whole`).
    fn learn_first(&mut self, weight: usize, took: Duration, whole: bool, now: Instant) {
        self.first.record(weight, took);
        if whole {
            self.cost.record(weight, took);
        }
        self.learned = Some(now);
    }

    /// What a batch takes to its first answer, for a stage whose batches cost `cost`: the first
    /// answers' own model once it has learned, else the batches' (for a plain worker the two
    /// are the same).
    fn first_cost(&self, cost: cost::Cost) -> cost::Cost {
        self.first.estimate().unwrap_or(cost)
    }

    /// The queue as the policy sees it, for a worker free since `free_since` taking batches of
    /// at most `max` jobs.
    fn view(&self, free_since: Instant, max: usize) -> QueueView {
        let oldest = self.jobs.oldest();
        QueueView {
            jobs: self.jobs.len(),
            bytes: self.jobs.bytes(),
            weight: self.jobs.weight() as usize,
            oldest: oldest.map(|j| j.arrived),
            // A walk of the jobs a partial batch would take (fewer than `max`); a full queue
            // goes at once, and the policy reads no deadline then.
            earliest_deadline: if self.jobs.len() >= max {
                oldest.map(|j| j.deadline)
            } else {
                self.jobs.earliest_deadline(max)
            },
            worker_free_since: Some(free_since),
        }
    }

    fn seat(&mut self, slot: usize) -> &mut Seat {
        self.seats[slot].as_mut().expect("a seated worker has a seat")
    }

    /// Notes, once `batch` (of at most `max` jobs) is taken, which classes the higher ones did
    /// not hold back ([`Queue::dry`], admission's), and which they hold back now, whose
    /// requests age ([`lanes::Lanes::taken`]: not from `dry`, whose batch with room may have
    /// left the class's front request out, as it did not fit beside the higher jobs taken: a
    /// low request of four items beside one high job a batch had never aged, and expired).
    fn note_taken(&mut self, now: Instant, batch: &[Job], max: usize) {
        // The lowest class the batch seated: it seated every class from there up.
        let lowest = batch.iter().map(|job| job.class).min();
        for class in [Class::Low, Class::Normal] {
            let seated = lowest.is_some_and(|lowest| lowest <= class);
            let room = batch.len() < max && self.jobs.jobs_above(class) == 0;
            if seated || room {
                self.dry[class.index()] = Some(now);
            }
        }
        self.jobs.taken(now, lowest);
    }

    /// When each connected worker takes its next batch from the queue, by the learned cost: at
    /// once if idle, else when its batch is done (a batch sent ahead then starts, and the next
    /// may be sent ahead of it). What room in the queue is predicted from: a job leaves it as
    /// its batch is taken. A busy plain worker with nothing sent ahead may take one sooner, as
    /// a saturated stage sends it ahead; counted so, a streaming stage (which sends nothing
    /// ahead), a queue of less than a batch, or a job going alone at its front had told
    /// clients to come back before there was room.
    fn take_at(&self, now: Instant, cost: cost::Cost) -> Vec<Instant> {
        self.seats
            .iter()
            .flatten()
            .map(|seat| match seat.busy {
                None => now,
                Some((since, size)) => (since + cost.of(size)).max(now),
            })
            .collect()
    }

    /// When each connected worker can take its next batch, by the learned cost: when it is
    /// taken from the queue ([`Queue::take_at`]), and past a batch sent ahead, that one done.
    fn free_at(&self, now: Instant, cost: cost::Cost) -> Vec<Instant> {
        let taken = self.take_at(now, cost);
        let seats = self.seats.iter().flatten();
        let ahead = |seat: &Seat| if seat.ahead > 0 { cost.of(seat.ahead) } else { Duration::ZERO };
        taken.into_iter().zip(seats).map(|(at, seat)| at + ahead(seat)).collect()
    }

    fn forecast(&self, now: Instant, window: Duration) -> Forecast {
        Forecast {
            mean_gap: self.arrivals.mean_gap(),
            last_arrival: self.arrivals.last(),
            cost: self.cost.estimate(),
            returns: self.returns.expected(now, window),
        }
    }
}

/// Ends a job that will never be dispatched: expired (408, if its client is still there to be
/// told) or cancelled (its client left).
fn bury(job: Job, now: Instant) {
    if job.is_expired(now) {
        metrics().expired(Place::Queue).inc();
        job.answer(Outcome::Expired);
    } else {
        metrics().cancelled(Place::Queue).inc();
    }
}

/// How the supervisor begins its words for a worker whose start failed ([`Stage::worker_exited`]).
pub const FAILED_START: &str = "a failed start";

/// What a stage's spawned workers told by leaving ([`Stage::exits_said`]).
#[derive(Default)]
struct Exits {
    /// How often they exited, and how the last did (the supervisor's words).
    count: u64,
    last: String,
    /// How many of those were starts that failed (no process ran, so none exited).
    failed_starts: u64,
    /// Why the last was refused, since a worker last joined.
    refused: Option<String>,
}

impl Stage {
    pub fn new(name: impl Into<String>, settings: BatchSettings, capacity: usize) -> Self {
        let mut queue = Queue::default();
        queue.jobs.set_budget(settings.max_batch_weight);
        Self {
            name: name.into(),
            declared: Mutex::default(),
            declarers: Mutex::default(),
            tensors_epoch: AtomicU64::new(0),
            weighs: AtomicBool::new(false),
            settings,
            capacity,
            capacity_bytes: usize::MAX,
            feeds: false,
            stream_timeout: Duration::from_secs(300),
            aging: DEFAULT_AGING,
            tenant_limit: usize::MAX,
            gpus: Vec::new(),
            queue: Mutex::new(queue),
            arrivals: Notify::new(),
            exits: Mutex::default(),
            joining: Mutex::default(),
            joined_once: AtomicBool::new(false),
        }
    }

    /// Notes that one of its spawned workers exited, how (the supervisor's words).
    pub fn worker_exited(&self, how: &str) {
        let mut exits = self.exits();
        exits.count += 1;
        exits.failed_starts += u64::from(how.starts_with(FAILED_START));
        exits.last = how.to_string();
    }

    /// Notes that a worker spawned for it was refused, and why (cleared when one joins): its
    /// exits alone said only "exit status 1" of a worker refused at every restart.
    pub fn worker_refused(&self, why: &str) {
        self.exits().refused = Some(why.to_string());
    }

    /// Why it has no worker, as far as its spawned ones tell: how often they exited and how
    /// the last did, and why the last was refused; empty if none has exited or been refused.
    pub fn exits_said(&self) -> String {
        use std::fmt::Write;
        let exits = self.exits();
        let mut said = String::new();
        if exits.count > 0 {
            let (count, last) = (exits.count, &exits.last);
            // A command that cannot start ran no process: "exited" had been said of it.
            let how = match exits.failed_starts {
                0 => "exited",
                n if n == count => "failed to start",
                _ => "exited or failed to start",
            };
            let _ = write!(
                said,
                "; its workers {how} {count} time(s) since Corral started, the last with {last} \
                 (see the log)"
            );
        }
        if let Some(why) = &exits.refused {
            let _ = write!(said, "; the last was refused: {why}");
        }
        said
    }

    fn exits(&self) -> MutexGuard<'_, Exits> {
        self.exits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bounds the payload bytes queued (unbounded by default).
    pub fn with_capacity_bytes(mut self, bytes: usize) -> Self {
        self.capacity_bytes = bytes;
        self
    }

    /// Marks a stage whose outputs some pipeline passes on: only a pipeline's last stage may
    /// stream, since a partial answer cannot be the next stage's input.
    pub fn feeding(mut self, feeds: bool) -> Self {
        self.feeds = feeds;
        self
    }

    /// Sets the longest a streamed answer from this stage may last (`stream_timeout_ms`).
    pub fn with_stream_timeout(mut self, timeout: Duration) -> Self {
        self.stream_timeout = timeout;
        self
    }

    /// Sets how long a queued job waits in its class before it is promoted to the next.
    pub fn with_aging(mut self, aging: Duration) -> Self {
        self.aging = aging.max(Duration::from_millis(1));
        self
    }

    /// Bounds the share of the queue's capacity one tenant may hold (1.0: unbounded). A tenant
    /// may always queue at least one job.
    pub fn with_tenant_share(mut self, share: f64) -> Self {
        self.tenant_limit = if share >= 1.0 {
            usize::MAX
        } else {
            ((self.capacity as f64 * share).floor() as usize).max(1)
        };
        self
    }

    /// The devices the stage's spawned workers are spread over.
    pub fn with_gpus(mut self, gpus: Vec<u32>) -> Self {
        self.gpus = gpus;
        self
    }

    /// Connected workers on each of the stage's devices (0 for a device with none): the
    /// labels come from the configuration, never from what a worker claims.
    pub fn workers_by_gpu(&self) -> Vec<(u32, usize)> {
        let queue = self.lock();
        let on = |gpu: u32| {
            let slots = queue.seats.iter().zip(&queue.devices);
            slots.filter(|(seat, device)| seat.is_some() && **device == Some(gpu)).count()
        };
        self.gpus.iter().map(|&gpu| (gpu, on(gpu))).collect()
    }

    pub fn stream_timeout(&self) -> Duration {
        self.stream_timeout
    }

    pub fn feeds_another(&self) -> bool {
        self.feeds
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn settings(&self) -> &BatchSettings {
        &self.settings
    }

    /// Queues one job ([`Stage::submit_all`] of one); the HTTP edge always submits a request's
    /// jobs together, so this is for tests.
    #[cfg(test)]
    pub fn submit(&self, job: Job) -> Result<(), Shed> {
        self.submit_all(vec![job])
    }

    /// Queues one request's jobs together, all or none, so that they stay in order and together
    /// (see [`Stage::take`]). Jobs not weighed yet are weighed by the workers' rule (else 1).
    /// Refuses them when their tenant holds its share of the queue, when the queue has no room
    /// even after evicting lower classes, or when the last of them is predicted to finish past
    /// its deadline. Queued jobs of lower classes evicted to make room are answered
    /// [`Outcome::Preempted`] at once.
    pub fn submit_all(&self, mut jobs: Vec<Job>) -> Result<(), Shed> {
        let Some(first) = jobs.first() else { return Ok(()) };
        let (count, class, tenant) = (jobs.len(), first.class, first.tenant);
        self.weigh(&mut jobs);
        let bytes: usize = jobs.iter().map(|job| job.size()).sum();
        let mut evicted = Vec::new();
        let mut retry_after = Duration::from_secs(1);
        {
            let mut queue = self.lock();
            if queue.closed {
                return Err(Shed::ShuttingDown);
            }
            let now = Instant::now();
            queue.jobs.promote(now, self.aging);
            // Jobs whose deadline passed (and those of clients that left within a purge's limit,
            // [`Stage::purge`]) still sit in the queue until a worker or a purge reaches them; cleared out now and then, they neither fill the queue nor
            // inflate the admission prediction. Never more often than every PURGE_EVERY: under
            // overload this runs on every arrival, and the queue can be long.
            let due = queue.last_purge.is_none_or(|last| now >= last + PURGE_EVERY);
            let long = queue.jobs.len() > self.settings.max_batch_size;
            // An empty queue takes any one request, so that a payload larger than the byte
            // capacity (it passed the body limit) is served rather than shed forever.
            let full_at = |jobs: usize, queued_bytes: usize| {
                jobs + count > self.capacity
                    || (jobs > 0 && queued_bytes + bytes > self.capacity_bytes)
            };
            let full = |jobs: &Lanes| full_at(jobs.len(), jobs.bytes());
            // A tenant holding nothing may place one request larger than its share (as an
            // empty queue takes one larger than its byte bound): refused, it would be refused
            // on every retry, while Retry-After promised otherwise.
            let over_share = |jobs: &Lanes| {
                tenant.is_some_and(|t| {
                    let held = jobs.of_tenant(t);
                    held > 0 && held + count > self.tenant_limit
                })
            };
            if due && (long || full(&queue.jobs) || over_share(&queue.jobs)) {
                // (This request may yet be shed: no arrival would tell those waiting.)
                self.clear_dead(&mut queue, now, true);
                queue.last_purge = Some(now);
            }
            if let Some(tenant) = tenant.filter(|_| over_share(&queue.jobs)) {
                let retry_after = self.share_in(&queue, now, tenant, count, class);
                return Err(Shed::TenantQuota { retry_after });
            }
            // Room made by evicting every lower class: enough, or nothing is evicted at all.
            if full(&queue.jobs) {
                let (lower_jobs, lower_bytes) = queue.jobs.below(class);
                let (kept_jobs, kept_bytes) =
                    (queue.jobs.len() - lower_jobs, queue.jobs.bytes() - lower_bytes);
                let room = kept_jobs + count <= self.capacity
                    && (kept_jobs == 0 || kept_bytes + bytes <= self.capacity_bytes);
                if !room {
                    let retry_after = self.room_in(&queue, now, count, bytes);
                    return Err(Shed::QueueFull { retry_after });
                }
            }
            if let (Some(cost), Some(last)) = (queue.cost.estimate(), jobs.last()) {
                // Only the jobs of this class and above go before these: lower ones wait.
                let weight = jobs.iter().map(|job| u64::from(job.weight)).sum();
                let batch = self.batch_weight(&queue) as u64;
                let ahead = Ahead::before(&queue.jobs, class, tenant, (weight, batch));
                let finish = self.predict(&queue, now, cost, ahead, &jobs);
                // 5% of the request's whole time, as the README says (not of what its body's
                // reading left).
                let latest = last.deadline - admission::margin(last.budget);
                if let Some(finish) = finish.filter(|&finish| finish > latest) {
                    let least = self.least_time(&queue, cost, &jobs);
                    // Probed for its own size only if it might make it (within three times its
                    // time, as predicted) and its worker would not be declared hung over it
                    // (its route's allowance): a hopeless one had its worker killed and
                    // reloaded once every idle 10 s.
                    let worth = least <= last.budget.saturating_mul(3).min(last.allowance);
                    if queue.may_probe(now, ahead.weight(), latest, cost, worth) {
                        queue.last_probe = Some(now);
                    } else {
                        // Where even their largest batch alone outlasts the request's whole
                        // time, the client is told it is the request's own size or deadline
                        // (a single job with a deadline shorter than one batch had been told
                        // to retry later, which no retry could meet). Retry-After stays: the
                        // cost may be stale (the model became faster), and only traffic
                        // relearns it. Without it, a request served once 8 others had
                        // retrained the cost had been told never to retry.
                        let whole = last.budget - admission::margin(last.budget);
                        let alone = least > whole;
                        let retry_after = admission::retry_after(finish, last.deadline);
                        return Err(Shed::DeadlineUnreachable { retry_after, alone });
                    }
                }
            }
            evicted.extend(queue.jobs.evict_below_while(class, full_at).into_iter().flatten());
            if let (Some(cost), Some(victim)) = (queue.cost.estimate(), evicted.first()) {
                // When a job of the evicted class would be served, were it sent again now.
                let mut ahead = Ahead::from(&queue.jobs, victim.class);
                // This request's jobs go before it, each heavy one alone, as in `Ahead::from`.
                let budget = self.settings.max_batch_weight.map(|budget| budget as u64);
                for job in &jobs {
                    let weight = u64::from(job.weight);
                    if budget.is_some_and(|budget| weight > budget) {
                        ahead.heavy = (ahead.heavy.0 + 1, ahead.heavy.1 + weight);
                    } else {
                        ahead.light += weight as usize;
                    }
                }
                let victim = std::slice::from_ref(victim);
                if let Some(finish) = self.predict(&queue, now, cost, ahead, victim) {
                    retry_after = admission::retry_after(finish, now);
                }
            }
            for job in &jobs {
                queue.arrivals.record(job.arrived);
                queue.classes[job.class.index()].record(job.arrived, job.weight);
                queue.returns.arrived(job.arrived, self.settings.max_wait);
            }
            queue.jobs.push(jobs, now);
        }
        self.arrivals.notify_waiters();
        for job in evicted {
            metrics().evicted.with_label_values(&[&self.name, job.class.label()]).inc();
            job.answer(Outcome::Preempted { retry_after });
        }
        Ok(())
    }

    /// Weighs the jobs the client gave no weight, by the workers' rule if they declared one.
    fn weigh(&self, jobs: &mut [Job]) {
        if jobs.iter().all(|job| job.weight > 0) {
            return;
        }
        let rule = if self.weighs.load(Ordering::Relaxed) {
            self.declared().and_then(|declared| declared.weight.clone())
        } else {
            None
        };
        for job in jobs.iter_mut().filter(|job| job.weight == 0) {
            job.weight = rule.as_ref().map_or(1, |rule| rule.weigh_payload(&job.payload));
        }
    }

    /// Puts jobs back at the front of the queue, in order, whatever its capacity: they were
    /// admitted once already (a worker died holding them) and go to the next idle worker.
    pub fn requeue(&self, jobs: Vec<Job>) {
        {
            let mut queue = self.lock();
            if queue.closed {
                // Nobody will take them any more: the proxy is stopping.
                drop(queue);
                for job in jobs {
                    job.answer(Outcome::ShuttingDown);
                }
                return;
            }
            // Each run of one request's jobs goes back as that request (a batch may carry
            // several requests, and one request's jobs are taken together), last run first so
            // that they keep their order at the front.
            let mut runs: Vec<Vec<Job>> = Vec::new();
            for job in jobs {
                match runs.last_mut() {
                    Some(run) if run[0].request == job.request && run[0].class == job.class => {
                        run.push(job)
                    }
                    _ => runs.push(vec![job]),
                }
            }
            let now = Instant::now();
            // Promotions due by now first: higher work put back starts clocks from now, and a
            // promotion looked at later would be backdated across it (`Lanes::promote`).
            queue.jobs.promote(now, self.aging);
            for run in runs.into_iter().rev() {
                queue.jobs.push_front(run, now);
            }
        }
        self.arrivals.notify_waiters();
    }

    /// Closes the stage at shutdown: admits nothing more and answers what is queued 503.
    pub fn close(&self) {
        let queued = {
            let mut queue = self.lock();
            queue.closed = true;
            queue.jobs.take_all()
        };
        for job in queued {
            job.answer(Outcome::ShuttingDown);
        }
    }

    /// Clears dead jobs out of `queue` ([`Queue::drop_dead`]): the whole queue, or its front.
    /// If one that went alone ([`Job::alone`]) was among them, the pulls waiting behind it
    /// (joins, batches sent ahead) look again: nothing else would tell them before the next
    /// arrival. (Notified under the lock: they take it once it is let go.)
    fn clear_dead(&self, queue: &mut Queue, now: Instant, whole: bool) {
        // Promotions due by now first: a higher job leaving stops the clocks it held running,
        // and a request already due would lose its promotion (`lanes::Lanes::promote`).
        queue.jobs.promote(now, self.aging);
        if queue.drop_dead(now, whole) {
            self.arrivals.notify_waiters();
        }
    }

    /// Most jobs the queue holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The batch cost learned so far (what admission and the policy see).
    #[cfg(test)]
    pub fn cost(&self) -> Option<cost::Cost> {
        self.lock().cost.estimate()
    }

    /// The batches its workers finished, by size, with their time in the worker.
    pub fn executions(&self) -> crate::statistics::Executions {
        self.lock().executions.clone()
    }

    /// Jobs waiting in the queue (live or not yet cleaned up).
    pub fn queued(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Jobs waiting in the queue, by class (lowest first), as their class stands now.
    pub fn queued_by_class(&self) -> [usize; 3] {
        let mut queue = self.lock();
        queue.jobs.promote(Instant::now(), self.aging);
        [Class::Low, Class::Normal, Class::High].map(|class| queue.jobs.jobs_in(class))
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding this lock would be a bug in the few lines above; the queue is
        // still consistent (every mutation is a single push/pop), so keep serving.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A batch's total weight.
pub fn weight_of(batch: &[Job]) -> usize {
    batch.iter().map(|job| job.weight as usize).sum()
}

#[cfg(test)]
mod tests;
