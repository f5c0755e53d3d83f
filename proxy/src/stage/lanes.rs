//! The queue's order — who goes first. Queued jobs wait in lanes: one per priority class, and
//! within a class one per tenant. A request's jobs stay together as one queued request, so they
//! are taken, promoted and evicted together.
//!
//! - **Classes**: the highest class with queued work is served first. A queued request is promoted
//!   one class for every aging period (`--priority-aging-ms`) the higher classes have held it back
//!   (from its entry, or from when they began to hold its class back if later:
//!   [`Lanes::held_since`]), so a low job is never starved: after two such periods it competes as
//!   high, behind only the high jobs queued before it was promoted. Waiting behind its own class
//!   (its tenant's backlog, or a class served a job now and then) is not starvation, and does not
//!   lift it past the other tenants of its class. A pipeline's later stage takes a request in at
//!   the class it reached on the stage before ([`crate::job::Reply::class`]): were it to start low
//!   again on each stage, a low request would need two periods per stage, and starved within its
//!   deadline.
//! - **Tenants**, within a class: the tenant with queued work that has been served the least weight
//!   goes next (start-time fair queueing; deficit round robin with an infinitely small quantum).
//!   Chosen over plain round robin because batches are bounded by weight: a tenant of heavy items
//!   would otherwise take more of the worker than a tenant of light ones. A tenant that returns
//!   after being idle starts level with the least-served tenant that has work (with none, with the
//!   last tenant served), behind the tenants already there, so idleness earns no credit; tenants
//!   served alike go in the order they took that place. Requests that name no tenant share one
//!   lane, a tenant like any other: a single tenant alone (or none) still gets every slot of every
//!   batch.
//! - **Eviction**: when a higher class needs room, the request of the lowest class with the
//!   latest deadline leaves first — it had the most time to come back.
//!
//! Counts (jobs, bytes, weight, heavy jobs; per class and per tenant) are kept as jobs come and
//! go, so the admission checks read them in O(1); only the room eviction would make, which
//! leaves out requests a batch has started, is a scan of the lower classes' requests, asked of
//! a full queue alone. Eviction itself looks at each lower-class request once (a heap of them),
//! however many go. Picking the next tenant is O(log tenants); the scans
//! (oldest job, promotion, eviction) are O(tenants with queued work), promotion at most once per
//! due instant.

use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::job::Job;
use crate::traffic::{Class, Tenant};

/// A lane's tenant: None for requests that named none.
type Key = Option<Tenant>;

/// Lanes by tenant. A tenant is a keyed hash already, so its map needs no second one: the hasher
/// folds the words it is given (SipHash here cost more than the rest of a pick).
type ByTenant<V> = HashMap<Key, V, BuildHasherDefault<Fold>>;

#[derive(Default)]
struct Fold(u64);

impl Hasher for Fold {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The queued jobs of one request, in order.
#[derive(Debug)]
struct Request {
    jobs: VecDeque<Job>,
    weight: u64,
    /// The jobs' sizes ([`Job::size`]), summed.
    bytes: usize,
    /// Whether a batch took some of its jobs already.
    started: bool,
    /// When the request entered its class: when it was queued (again when put back, but no
    /// later than the request it goes before); on a promotion, when it became due: the later
    /// of that and when its class began to be held back, plus one aging period.
    entered: Instant,
}

#[derive(Debug, Default)]
struct TenantLane {
    requests: VecDeque<Request>,
    /// Weight dispatched from this lane so far: the least served tenant goes next.
    served: u64,
    /// When it took its place among the tenants served as much (its class's count of places
    /// taken): the earliest goes first.
    place: u64,
    /// Weight queued in this lane (its requests' weights, summed).
    weight: u64,
}

impl TenantLane {
    /// Places a promoted request among the lane's requests by the time it entered the class,
    /// so that each lane stays ordered by it (what promotion reads off the front), but never
    /// before a request a batch has started.
    fn insert(&mut self, request: Request) {
        let after = self.requests.iter().rposition(|r| r.entered <= request.entered);
        let started = self.requests.front().is_some_and(|r| r.started);
        let at = after.map_or(0, |i| i + 1).max(usize::from(started));
        self.requests.insert(at, request);
    }
}

#[derive(Debug, Default)]
struct ClassLane {
    /// Only tenants with queued work have a lane.
    tenants: ByTenant<TenantLane>,
    /// The tenants with queued work, by weight served, then by when they took that place: the
    /// first goes next. Ties had gone by the tenant's key, a hash: with one request each (a
    /// tenant per user), every tenant joining level with the least served went before those
    /// whose hash was larger, and those, passed by newcomer after newcomer, ended 408 while
    /// the rest were served in under a second.
    turns: BTreeSet<(u64, u64, Key)>,
    /// Places taken so far ([`TenantLane::place`]).
    places: u64,
    /// The weight served of the tenant picked last, once served: where a tenant that (re)joins
    /// starts when no other has work.
    clock: u64,
    jobs: usize,
    bytes: usize,
    weight: u64,
    /// Jobs heavier than a batch's weight budget, or retried alone, and their weight: each goes
    /// in a batch of its own.
    heavy: (usize, u64),
}

impl ClassLane {
    /// The tenant's lane, made (and given its turn) if it had none: level with the least served
    /// tenant that has work, so that being idle earns no credit and costs none.
    fn lane(&mut self, key: Key) -> &mut TenantLane {
        let clock = self.turns.first().map_or(self.clock, |&(served, _, _)| served);
        let (turns, places) = (&mut self.turns, &mut self.places);
        self.tenants.entry(key).or_insert_with(|| {
            *places += 1;
            turns.insert((clock, *places, key));
            TenantLane { requests: VecDeque::new(), served: clock, place: *places, weight: 0 }
        })
    }

    /// Drops the tenant's lane and turn if it holds nothing any more. The map gives memory back
    /// after a crowd of tenants has gone: the scans over lanes cost its capacity, not its length.
    fn tidy(&mut self, key: Key) {
        if let Some(lane) = self.tenants.get(&key).filter(|lane| lane.requests.is_empty()) {
            self.turns.remove(&(lane.served, lane.place, key));
            self.tenants.remove(&key);
            if self.tenants.capacity() > 64 && self.tenants.len() * 4 < self.tenants.capacity() {
                self.tenants.shrink_to(self.tenants.len() * 2);
            }
        }
    }
}

/// What a request being taken still holds: its jobs, weight and bytes, and whether any left
/// already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    pub jobs: usize,
    pub weight: u64,
    pub bytes: usize,
    pub started: bool,
}

#[derive(Debug, Default)]
pub struct Lanes {
    classes: [ClassLane; 3],
    jobs: usize,
    bytes: usize,
    weight: u64,
    per_tenant: HashMap<Tenant, usize>,
    /// The lane whose front request the batch being taken has started: it goes on first while
    /// its class is the highest with work, so that a request's jobs share a batch. Between
    /// batches the turns decide again: a request of many jobs does not hold the next batch.
    current: Option<(Class, Key)>,
    /// Earliest instant a queued request of a class below high is due for promotion.
    next_promotion: Option<Instant>,
    /// By class (by [`Class::index`]): since when the higher classes have held its queued work
    /// back without a break (None: they do not now, [`Lanes::held`]). Its requests age only
    /// while it is held back: waiting behind its own class (a tenant's backlog, a class served
    /// a job now and then) or behind a busy worker with nothing higher queued is not
    /// starvation, and had been promoted all the same (a slow first stage sent its queued low
    /// requests into the next as high; a tenant's backlog climbed past the other tenants).
    held_since: [Option<Instant>; 3],
    /// By class: whether the last batch taken went out without its jobs (nor a lower one's)
    /// while it or a lower class had some queued: the workers are busy with the higher
    /// classes' work, though none may be queued now.
    left_out: [bool; 3],
    /// A batch's weight budget (`--max-batch-weight`; None: no budget, and no job is heavy).
    budget: Option<u64>,
}

impl Lanes {
    pub fn len(&self) -> usize {
        self.jobs
    }

    pub fn is_empty(&self) -> bool {
        self.jobs == 0
    }

    /// Payload bytes queued ([`Job::size`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn weight(&self) -> u64 {
        self.weight
    }

    pub fn jobs_in(&self, class: Class) -> usize {
        self.classes[class.index()].jobs
    }

    /// Jobs and bytes queued in classes below `class` that eviction could free for it: those of
    /// requests no batch has started ([`Lanes::evict_below_while`] leaves those; counted, they let a
    /// request in that eviction then could not make room for, past the queue's capacity). A
    /// scan of the lower classes' requests: asked only of a full queue.
    pub fn below(&self, class: Class) -> (usize, usize) {
        let lanes = self.classes[..class.index()].iter().flat_map(|c| c.tenants.values());
        let requests = lanes.flat_map(|lane| lane.requests.iter()).filter(|r| !r.started);
        requests.fold((0, 0), |(j, b), r| (j + r.jobs.len(), b + r.bytes))
    }

    /// Weight queued in `class` and above: the work that goes before a new job of `class`.
    pub fn weight_from(&self, class: Class) -> u64 {
        self.classes[class.index()..].iter().map(|c| c.weight).sum()
    }

    /// The weight that goes before a new request of `weight` from tenant `key` (None: no
    /// tenant) in `class`: every higher class's, and in its class its tenant's own queued work
    /// and the other tenants' turns: of what they hold, as much each as the new request's
    /// tenant will have been served by its end (its queued work, the request, and how far its
    /// turns are ahead of the least served) and one `batch` more (a request a batch has started
    /// fills it before the turns are counted again, and a job is not split); and at least that
    /// much each (not the batch) whatever they hold, for the tenants with work keep sending:
    /// each takes its turn all the while a long queue of this tenant's drains. Counted as what
    /// they held, a busy tenant was admitted past what it would be served in time, and 60% of
    /// its requests expired in the queue or the worker beside a quiet tenant taking a third of
    /// the turns; counted as every tenant's queued work, the quiet tenant's short deadlines
    /// were all refused, though its jobs went in the next batch. An O(1) count, not a walk of
    /// the lanes: admission asks it on every arrival.
    pub fn weight_before(&self, class: Class, key: Key, weight: u64, batch: u64) -> u64 {
        let higher: u64 = self.classes[class.index() + 1..].iter().map(|c| c.weight).sum();
        let lanes = &self.classes[class.index()];
        let least = lanes.turns.first().map(|&(served, _, _)| served);
        let (served, queued) = match lanes.tenants.get(&key) {
            Some(lane) => (lane.served, lane.weight),
            // A tenant with nothing queued starts level with the least served (`ClassLane::lane`).
            None => (least.unwrap_or(lanes.clock), 0),
        };
        let others = (lanes.tenants.len() - usize::from(lanes.tenants.contains_key(&key))) as u64;
        let lead = served.saturating_sub(least.unwrap_or(served));
        let rounds = queued.saturating_add(weight).saturating_add(lead);
        let held = lanes.weight - queued;
        let of_the_queue = held.min(others.saturating_mul(rounds.saturating_add(batch)));
        // What they keep sending goes beside this tenant's queue and the part of the request
        // past its first batch: that batch is not split by turns (a request of 32 rows beside
        // ten tenants of one job was counted behind 320).
        let kept_pace = queued.saturating_add(lead).saturating_add(weight.saturating_sub(batch));
        let theirs = of_the_queue.max(others.saturating_mul(kept_pace));
        higher.saturating_add(queued).saturating_add(theirs)
    }

    /// Weight queued in `class` alone.
    pub fn weight_in(&self, class: Class) -> u64 {
        self.classes[class.index()].weight
    }

    /// Jobs queued in `class` alone that are heavier than the budget, and their weight.
    pub fn heavy_in(&self, class: Class) -> (usize, u64) {
        self.classes[class.index()].heavy
    }

    /// Jobs queued in `class` and above that are heavier than the budget (each is sent alone),
    /// and their weight: part of [`Lanes::weight_from`].
    pub fn heavy_from(&self, class: Class) -> (usize, u64) {
        let lanes = &self.classes[class.index()..];
        lanes.iter().fold((0, 0), |(n, w), c| (n + c.heavy.0, w + c.heavy.1))
    }

    /// Sets the batch weight budget, which makes the jobs above it heavy; on an empty queue.
    pub fn set_budget(&mut self, budget: Option<usize>) {
        debug_assert!(self.is_empty(), "jobs already counted against no budget");
        self.budget = budget.map(|b| b as u64);
    }

    /// The jobs of `class` that go in turn beside `rounds` of `tenant`'s: up to `rounds` of each
    /// other tenant with work queued there (an O(tenants) scan, asked of a tenant over its share).
    pub fn turns_beside(&self, class: Class, tenant: Tenant, rounds: usize) -> usize {
        let lanes = &self.classes[class.index()].tenants;
        let others = lanes.iter().filter(|(other, _)| **other != Some(tenant));
        let held = |lane: &TenantLane| lane.requests.iter().map(|r| r.jobs.len()).sum::<usize>();
        others.map(|(_, lane)| held(lane).min(rounds)).sum()
    }

    /// The highest class holding jobs of `tenant`: where the first of its jobs to leave waits.
    pub fn tenant_class(&self, tenant: Tenant) -> Option<Class> {
        Class::DISPATCH_ORDER.into_iter().find(|class| {
            let lane = self.classes[class.index()].tenants.get(&Some(tenant));
            lane.is_some_and(|lane| !lane.requests.is_empty())
        })
    }

    /// Jobs queued in `class` and the classes below it.
    fn jobs_from_below(&self, class: Class) -> usize {
        self.jobs - self.jobs_above(class)
    }

    /// Jobs queued in classes above `class`: every one goes before any job of `class`.
    pub fn jobs_above(&self, class: Class) -> usize {
        self.classes[class.index() + 1..].iter().map(|c| c.jobs).sum()
    }

    /// Jobs the tenant has queued.
    pub fn of_tenant(&self, tenant: Tenant) -> usize {
        self.per_tenant.get(&tenant).copied().unwrap_or(0)
    }

    fn count(&mut self, class: Class, job: &Job, sign: i8) {
        let (size, weight) = (job.size(), u64::from(job.weight));
        // A job that goes alone ([`Job::alone`]) is costed as a heavy one: a batch of its own.
        let heavy = job.alone || self.budget.is_some_and(|budget| weight > budget);
        let lane = &mut self.classes[class.index()];
        if heavy {
            lane.heavy = match sign > 0 {
                true => (lane.heavy.0 + 1, lane.heavy.1 + weight),
                false => (lane.heavy.0 - 1, lane.heavy.1 - weight),
            };
        }
        if sign > 0 {
            (lane.jobs, lane.bytes, lane.weight) =
                (lane.jobs + 1, lane.bytes + size, lane.weight + weight);
            (self.jobs, self.bytes, self.weight) =
                (self.jobs + 1, self.bytes + size, self.weight + weight);
            if let Some(tenant) = job.tenant {
                *self.per_tenant.entry(tenant).or_default() += 1;
            }
        } else {
            (lane.jobs, lane.bytes, lane.weight) =
                (lane.jobs - 1, lane.bytes - size, lane.weight - weight);
            (self.jobs, self.bytes, self.weight) =
                (self.jobs - 1, self.bytes - size, self.weight - weight);
            if let Some(tenant) = job.tenant {
                let left = self.per_tenant.get_mut(&tenant).expect("a queued tenant is counted");
                *left -= 1;
                if *left == 0 {
                    self.per_tenant.remove(&tenant);
                }
            }
        }
    }

    /// Whether the higher classes hold `class` back now: it has work queued, and theirs is
    /// queued above it or the last batch left it out for theirs ([`Lanes::left_out`]).
    fn held(&self, class: Class) -> bool {
        self.jobs_in(class) > 0 && (self.jobs_above(class) > 0 || self.left_out[class.index()])
    }

    /// Starts the clock of a class the higher ones begin to hold back (at `now`), and stops
    /// that of one they no longer do ([`Lanes::held_since`]). O(1): called once a change to the
    /// queue is whole (a request entered, promoted, evicted; dead jobs gone; a batch taken),
    /// not per job. Not by a batch's own pops: the one that takes the last higher job would
    /// stop the clock of a class the batch then leaves out ([`Lanes::taken`] settles them).
    /// `now` is None where only work left: that stops clocks, never starts one.
    fn note_held(&mut self, now: Option<Instant>) {
        for class in [Class::Low, Class::Normal] {
            // What a batch left out is no longer there to be held back.
            if self.jobs_from_below(class) == 0 {
                self.left_out[class.index()] = false;
            }
            let held = self.held(class);
            if held == self.held_since[class.index()].is_some() {
                continue;
            }
            let since = held.then(|| now.unwrap_or_else(Instant::now));
            self.held_since[class.index()] = since;
            if let Some(at) = since {
                self.due(class, at);
            }
        }
    }

    /// A take ended at `now`; `lowest`: the lowest class its batch seated (it seated every class
    /// from there up), None where it found nothing to take. Keeps [`Lanes::left_out`] and
    /// [`Lanes::held_since`], once for the whole batch.
    pub fn taken(&mut self, now: Instant, lowest: Option<Class>) {
        if let Some(lowest) = lowest {
            // A lower class's job left out too: promoted into this class, it is held back here.
            for class in [Class::Low, Class::Normal] {
                self.left_out[class.index()] = self.jobs_from_below(class) > 0 && lowest > class;
            }
        }
        self.note_held(Some(now));
    }

    /// Queues one request's jobs (all of one class and tenant) at the back of their lane, as
    /// having entered their class at `entered`, the stage's now (not at the request's arrival:
    /// its body may have taken seconds to come, and it would enter the queue promoted already).
    pub fn push(&mut self, jobs: Vec<Job>, entered: Instant) {
        self.enter(jobs, entered, false);
    }

    /// Puts the jobs of one request (of one class and tenant) back at the front of their lane
    /// (their worker died holding them) at `now`: they go first among their tenant's work, as
    /// one request again, and their class ages from now, as a queued request's does.
    pub fn push_front(&mut self, jobs: Vec<Job>, now: Instant) {
        self.enter(jobs, now, true);
    }

    fn enter(&mut self, jobs: Vec<Job>, entered: Instant, front: bool) {
        let Some(first) = jobs.first() else { return };
        let (class, key) = (first.class, first.tenant);
        jobs.iter().for_each(|job| self.count(class, job, 1));
        self.note_held(Some(entered));
        let weight = jobs.iter().map(|job| u64::from(job.weight)).sum();
        let bytes = jobs.iter().map(Job::size).sum();
        let lane = self.classes[class.index()].lane(key);
        lane.weight += weight;
        // Put back at the front, it counts as entered no later than the request it goes before:
        // the lane stays ordered by entry (promotion reads only its front), and the older work
        // behind it is not held back a whole aging period by the newcomer.
        let entered = match lane.requests.front() {
            Some(next) if front => entered.min(next.entered),
            _ => entered,
        };
        let request = Request { jobs: jobs.into(), weight, bytes, started: false, entered };
        if front {
            lane.requests.push_front(request);
        } else {
            lane.requests.push_back(request);
        }
        self.due(class, entered);
    }

    fn due(&mut self, class: Class, entered: Instant) {
        if class != Class::High {
            self.next_promotion = Some(self.next_promotion.map_or(entered, |at| at.min(entered)));
        }
    }

    /// The lane the next job comes from.
    fn next(&self) -> Option<(Class, Key)> {
        let class = Class::DISPATCH_ORDER.into_iter().find(|c| self.jobs_in(*c) > 0)?;
        let lanes = &self.classes[class.index()];
        if let Some((c, key)) = self.current {
            if c == class && lanes.tenants.contains_key(&key) {
                return Some((c, key));
            }
        }
        lanes.turns.first().map(|&(_, _, key)| (class, key))
    }

    fn front_request(&self) -> Option<&Request> {
        let (class, key) = self.next()?;
        self.classes[class.index()].tenants.get(&key)?.requests.front()
    }

    /// Whether the job that goes next goes alone ([`Job::alone`]): nothing is sent ahead, and
    /// nothing joins, while it waits for an idle worker.
    pub fn alone_first(&self) -> bool {
        self.front().is_some_and(|job| job.alone)
    }

    /// The job that goes next.
    pub fn front(&self) -> Option<&Job> {
        self.front_request()?.jobs.front()
    }

    /// The job that goes next, and what its request still holds.
    pub fn peek(&self) -> Option<(&Job, Front)> {
        let request = self.front_request()?;
        let front = Front {
            jobs: request.jobs.len(),
            weight: request.weight,
            bytes: request.bytes,
            started: request.started,
        };
        Some((request.jobs.front()?, front))
    }

    /// Takes the job that goes next. A dispatched job counts toward its tenant's turn; one taken
    /// to be buried (expired, abandoned) does not.
    pub fn pop(&mut self, dispatched: bool) -> Option<Job> {
        let (class, key) = self.next()?;
        let lanes = &mut self.classes[class.index()];
        let lane = lanes.tenants.get_mut(&key).expect("next names a lane with work");
        let request = lane.requests.front_mut().expect("a lane with work has a request");
        let job = request.jobs.pop_front().expect("a queued request has a job");
        request.weight -= u64::from(job.weight);
        lane.weight -= u64::from(job.weight);
        request.bytes -= job.size();
        // Only a batch starts a request (and so keeps it from eviction); a buried job does not.
        request.started |= dispatched;
        self.current = if request.jobs.is_empty() {
            lane.requests.pop_front();
            None
        } else {
            Some((class, key))
        };
        // A tenant alone in its class has nobody to take turns with: its count stands still
        // (whoever joins starts level with it), which spares the turn set a remove and insert.
        if dispatched && lanes.turns.len() > 1 {
            lanes.turns.remove(&(lane.served, lane.place, key));
            lane.served += u64::from(job.weight);
            lanes.clock = lane.served;
            lanes.places += 1;
            lane.place = lanes.places;
            lanes.turns.insert((lane.served, lane.place, key));
        }
        lanes.tidy(key);
        self.count(class, &job, -1);
        // A batch's pops are settled once it is taken; a dead job's leaving now.
        if !dispatched {
            self.note_held(None);
        }
        Some(job)
    }

    /// A batch is complete: the next one starts by the tenants' turns.
    pub fn end_batch(&mut self) {
        self.current = None;
    }

    /// Promotes every request the higher classes have held back an aging period in its class
    /// to the next class up: the period counts from its entry or from when they began to hold
    /// the class back ([`Lanes::held_since`]), whichever is later. A request overdue by several
    /// periods moves up several classes at once. Cheap when nothing is due.
    pub fn promote(&mut self, now: Instant, aging: Duration) {
        if self.next_promotion.is_none_or(|at| at + aging > now) {
            return;
        }
        let mut next: Option<Instant> = None;
        let mut soonest = |at: Instant| next = Some(next.map_or(at, |next: Instant| next.min(at)));
        // Low first: what it promotes to normal may be due again at once.
        for class in [Class::Low, Class::Normal] {
            // Not held back, it has no clock running (it starts, and makes the class due, when
            // the higher classes begin to hold it back).
            let Some(since) = self.held_since[class.index()] else { continue };
            // A class held back for less than a period has nothing due: one check, not a walk
            // of its lanes on every look while a deep queue of its own waits.
            if since + aging > now {
                if self.jobs_in(class) > 0 {
                    soonest(since);
                }
                continue;
            }
            let keys: Vec<Key> = self.classes[class.index()].tenants.keys().copied().collect();
            for key in keys {
                loop {
                    let lanes = &mut self.classes[class.index()];
                    let Some(lane) = lanes.tenants.get_mut(&key) else { break };
                    let entered = lane.requests.front().expect("a lane has work").entered;
                    let entered = entered.max(since);
                    if entered + aging > now {
                        soonest(entered);
                        break;
                    }
                    let mut request = lane.requests.pop_front().expect("checked above");
                    lane.weight -= request.weight;
                    lanes.tidy(key);
                    if self.current == Some((class, key)) {
                        self.current = None;
                    }
                    let up = class.promoted();
                    // It entered the class above a period after it began to be held back, and
                    // is held back there from then if it is now: that class's clock runs from
                    // then at the latest (from the promotion's now, or from when a later
                    // request of that class came, an overdue request climbed one class a
                    // look, not several at once).
                    request.entered = entered + aging;
                    // Settled once the whole request moved: the class below never sees the work
                    // above it gone for a moment (its clock had restarted at the promotion).
                    for job in request.jobs.iter_mut() {
                        self.count(up, job, 1);
                        self.count(class, job, -1);
                        job.class = up;
                    }
                    self.note_held(Some(request.entered));
                    let clock = &mut self.held_since[up.index()];
                    *clock = clock.map(|since| since.min(request.entered));
                    if up != Class::High {
                        soonest(request.entered);
                    }
                    let lane = self.classes[up.index()].lane(key);
                    lane.weight += request.weight;
                    lane.insert(request);
                }
            }
        }
        self.next_promotion = next;
    }

    /// Removes the least urgent request of a class below `class` — from the lowest class with
    /// work, the one with the latest deadline — to make room for a job of `class`: one step of
    /// [`Lanes::evict_below_while`] (the tests' view of it).
    #[cfg(test)]
    pub fn evict_below(&mut self, class: Class) -> Option<Vec<Job>> {
        let queued = self.jobs;
        self.evict_below_while(class, |jobs, _| jobs == queued).pop()
    }

    /// Removes requests of the classes below `class`, least urgent first, while `full(jobs,
    /// bytes)` says the queue (as it would be without those taken so far) has no room: from the
    /// lowest class with work, the ones with the latest deadlines. The evicted requests' jobs,
    /// in the order they went.
    ///
    /// Every request of those classes is looked at, not each lane's last: the last queued is not
    /// the least urgent when clients ask for different timeouts, or a job came back after its
    /// worker died. One look each, a heap of them, and each lane rebuilt once: taken one at a
    /// time (a scan of every request per victim), a high request of 32,000 items evicting as
    /// many low ones held the stage's lock for 12 s. A request a batch has started is not evicted (its
    /// other jobs are in a worker already). Among equal deadlines the one that entered its
    /// class last goes.
    pub fn evict_below_while(
        &mut self,
        class: Class,
        full: impl Fn(usize, usize) -> bool,
    ) -> Vec<Vec<Job>> {
        let (mut jobs, mut bytes) = (self.jobs, self.bytes);
        // Which go, lane by lane: (position in its lane, order it goes in).
        let mut chosen: HashMap<(Class, Key), Vec<(usize, usize)>> = HashMap::new();
        let mut count = 0;
        for lower in Class::DISPATCH_ORDER.into_iter().rev().filter(|c| *c < class) {
            if !full(jobs, bytes) {
                break;
            }
            let lanes = &self.classes[lower.index()];
            let waiting: Vec<_> = lanes
                .tenants
                .iter()
                .flat_map(|(key, lane)| {
                    let waiting = lane.requests.iter().enumerate().filter(|(_, r)| !r.started);
                    waiting.filter_map(move |(at, r)| {
                        let urgency = (r.jobs.front()?.deadline, r.entered);
                        Some((urgency, *key, at, r.jobs.len(), r.bytes))
                    })
                })
                .collect();
            // A heap (built in O(n), popped per victim): one victim costs a scan, as it did,
            // and many no sort of more than go. Ties go to the one looked at last, as a scan's
            // `max_by_key` took it: the later of two equal requests in a lane.
            let mut heap: BinaryHeap<_> =
                waiting.iter().enumerate().map(|(seq, &(urgency, ..))| (urgency, seq)).collect();
            while full(jobs, bytes) {
                let Some((_, seq)) = heap.pop() else { break };
                let (_, key, at, request_jobs, request_bytes) = waiting[seq];
                chosen.entry((lower, key)).or_default().push((at, count));
                count += 1;
                (jobs, bytes) = (jobs - request_jobs, bytes - request_bytes);
            }
        }
        let mut evicted: Vec<Option<(Class, Request)>> = (0..count).map(|_| None).collect();
        for ((lower, key), mut going) in chosen {
            going.sort_unstable();
            let lanes = &mut self.classes[lower.index()];
            let Some(lane) = lanes.tenants.get_mut(&key) else { continue };
            let mut going = going.into_iter().peekable();
            for (at, request) in std::mem::take(&mut lane.requests).into_iter().enumerate() {
                match going.next_if(|&(position, _)| position == at) {
                    Some((_, order)) => {
                        lane.weight -= request.weight;
                        evicted[order] = Some((lower, request));
                    }
                    None => lane.requests.push_back(request),
                }
            }
            lanes.tidy(key);
            if self.current == Some((lower, key)) && !lanes.tenants.contains_key(&key) {
                self.current = None;
            }
        }
        let evicted = evicted.into_iter().flatten();
        let evicted = evicted
            .map(|(lower, request)| {
                request.jobs.iter().for_each(|job| self.count(lower, job, -1));
                request.jobs.into()
            })
            .collect();
        self.note_held(None);
        evicted
    }

    /// The job that has waited longest (an O(tenants) scan over the lanes' fronts).
    pub fn oldest(&self) -> Option<&Job> {
        self.classes
            .iter()
            .flat_map(|lanes| lanes.tenants.values())
            .filter_map(|lane| lane.requests.front()?.jobs.front())
            .min_by_key(|job| job.arrived)
    }

    /// A deadline no earlier than the earliest of the next `max` jobs to go: the earliest among
    /// the first `max` jobs of every lane, in the classes those jobs come from.
    pub fn earliest_deadline(&self, max: usize) -> Option<Instant> {
        let mut earliest: Option<Instant> = None;
        let mut seen = 0;
        for class in Class::DISPATCH_ORDER {
            let lanes = &self.classes[class.index()];
            for lane in lanes.tenants.values() {
                let jobs = lane.requests.iter().flat_map(|r| r.jobs.iter()).take(max);
                for job in jobs {
                    earliest = Some(earliest.map_or(job.deadline, |e| e.min(job.deadline)));
                }
            }
            seen += lanes.jobs;
            if seen >= max {
                break;
            }
        }
        earliest
    }

    /// Removes and returns the jobs for which `dead` holds, wherever they wait.
    pub fn remove_dead(&mut self, mut dead: impl FnMut(&Job) -> bool) -> Vec<Job> {
        let mut gone = Vec::new();
        for class in Class::DISPATCH_ORDER {
            let keys: Vec<Key> = self.classes[class.index()].tenants.keys().copied().collect();
            for key in keys {
                let lanes = &mut self.classes[class.index()];
                let lane = lanes.tenants.get_mut(&key).expect("listed above");
                for request in lane.requests.iter_mut() {
                    // Most requests hold no dead job: left as they are, not rebuilt.
                    if !request.jobs.iter().any(&mut dead) {
                        continue;
                    }
                    let (live, dead_jobs): (Vec<Job>, Vec<Job>) =
                        std::mem::take(&mut request.jobs).into_iter().partition(|j| !dead(j));
                    request.jobs = live.into();
                    request.weight = request.jobs.iter().map(|j| u64::from(j.weight)).sum();
                    request.bytes = request.jobs.iter().map(Job::size).sum();
                    gone.extend(dead_jobs.into_iter().map(|job| (class, job)));
                }
                lane.requests.retain(|request| !request.jobs.is_empty());
                lane.weight = lane.requests.iter().map(|request| request.weight).sum();
                lanes.tidy(key);
            }
        }
        let gone = gone
            .into_iter()
            .map(|(class, job)| {
                self.count(class, &job, -1);
                job
            })
            .collect();
        self.note_held(None);
        gone
    }

    /// Empties the queue (the proxy is stopping).
    pub fn take_all(&mut self) -> Vec<Job> {
        let all = std::mem::take(self);
        let requests = all.classes.into_iter().flat_map(|c| c.tenants.into_values());
        requests.flat_map(|lane| lane.requests).flat_map(|request| request.jobs).collect()
    }
}

#[cfg(test)]
mod tests;
