//! Who goes first and how much fits: what a request says about its jobs beyond their payload —
//! their priority [`Class`], their [`Tenant`], and their weight. The HTTP edge reads them from
//! the request's headers and the route ([`crate::http::traffic`]); the stage's queue orders jobs
//! by them ([`crate::stage::lanes`]) and its batches are bounded by weight.

use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::Duration;

/// A priority class (`x-corral-priority`). Higher classes are dispatched first and may evict
/// queued jobs of lower ones when the queue is full.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Deserialize,
    clap::ValueEnum,
)]
// Read in any case, as the header is: a config file's `priority = "HIGH"` had been refused.
#[serde(try_from = "String")]
pub enum Class {
    Low,
    #[default]
    Normal,
    High,
}

impl TryFrom<String> for Class {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Class::parse(&value)
            .ok_or_else(|| format!("{value:?} is not a priority class: low, normal or high"))
    }
}

impl Class {
    /// Every class, highest first: the order the queue is served in.
    pub const DISPATCH_ORDER: [Class; 3] = [Class::High, Class::Normal, Class::Low];

    /// The class's name, as in the header and in metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Class::Low => "low",
            Class::Normal => "normal",
            Class::High => "high",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [Class::Low, Class::Normal, Class::High]
            .into_iter()
            .find(|class| value.eq_ignore_ascii_case(class.label()))
    }

    /// The next class up, where a job that waited long enough goes (high stays high).
    pub fn promoted(self) -> Self {
        match self {
            Class::Low => Class::Normal,
            Class::Normal | Class::High => Class::High,
        }
    }

    /// Position in a per-class array, lowest first.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A tenant, known only by a keyed hash of its header's value: the value itself is never kept,
/// logged, or made a metric label (it may be an API key). The key is drawn once per process,
/// so that nobody can aim two tenants at one hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenant(u64);

impl Tenant {
    pub fn of(value: &[u8]) -> Self {
        static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        Self(KEY.get_or_init(Default::default).hash_one(value))
    }
}

/// Heaviest weight an item may have: larger values from `x-corral-weight` or a weight rule
/// count as this, so that a batch's total weight always fits comfortably in a `u64` and one
/// client cannot make the cost model's sums meaningless.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// What a request's headers and route say about its jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// The class the request asked for (`x-corral-priority`, else its route's); on a pipeline's
    /// later stage, the class it reached on the stage before (its jobs promoted while they
    /// waited there): it goes on from there, not from its first class.
    pub class: Class,
    /// None: the request named no tenant; such requests share one turn among the tenants.
    pub tenant: Option<Tenant>,
    /// Each item's weight as the client gave it (None: the stage's weight rule, else 1).
    pub weight: Option<u32>,
    /// How long the route lets a worker take over a job (its timeout; a stream's, no longer
    /// than its stream timeout), whatever shorter deadline the client asked for; None: the
    /// jobs' own budget. See [`crate::job::Job::allowance`].
    pub allowance: Option<Duration>,
    /// The request's whole time, from its arrival to its deadline (None: a job's own, from its
    /// stage's entry). A later stage of a pipeline gets what is left of it; whether a request
    /// could ever make it is judged against the whole. See [`crate::job::Job::budget`].
    pub budget: Option<Duration>,
    /// The epoch of the first stage's declared tensors the request's rows were read against, if
    /// they were (v2, KServe v1, OpenAI; None for a native request, and on every later stage of
    /// a pipeline). See [`crate::job::Job::tensors`].
    pub tensors: Option<u64>,
}

impl Traffic {
    /// Gives a job its class and tenant, and the client's weight (0 when it gave none: the
    /// stage weighs it).
    pub fn mark(&self, job: &mut crate::job::Job) {
        job.class = self.class;
        job.tenant = self.tenant;
        job.weight = self.weight.unwrap_or(0);
        let budget = job.deadline.saturating_duration_since(job.arrived);
        job.allowance = self.allowance.map_or(budget, |allowance| allowance.max(budget));
        job.budget = self.budget.unwrap_or(budget).max(budget);
        job.tensors = self.tensors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_parse_their_labels_in_any_case() {
        assert_eq!(Class::parse("HIGH"), Some(Class::High));
        assert_eq!(Class::parse("low"), Some(Class::Low));
        assert_eq!(Class::parse("urgent"), None);
        assert!(Class::High > Class::Normal && Class::Normal > Class::Low);
        assert_eq!(Class::Low.promoted().promoted(), Class::High);
    }

    #[test]
    fn a_tenant_is_its_value_hashed() {
        assert_eq!(Tenant::of(b"acme"), Tenant::of(b"acme"));
        assert_ne!(Tenant::of(b"acme"), Tenant::of(b"globex"));
        assert!(!format!("{:?}", Tenant::of(b"acme")).contains("acme"));
    }

    #[test]
    fn a_job_s_allowance_is_its_route_s_never_less_than_its_budget() {
        let now = tokio::time::Instant::now();
        let deadline = now + Duration::from_millis(100);
        let marked = |allowance| {
            let id = corral_protocol::JobId::new();
            let mut job = crate::job::Job::new(id, bytes::Bytes::new(), now, deadline).0;
            Traffic { allowance, ..Traffic::default() }.mark(&mut job);
            job.allowance
        };
        // The route allows 5 s; the client asked for 100 ms: a worker may take 5 s.
        assert_eq!(marked(Some(Duration::from_secs(5))), Duration::from_secs(5));
        assert_eq!(marked(None), Duration::from_millis(100));
        assert_eq!(marked(Some(Duration::ZERO)), Duration::from_millis(100));
    }
}
