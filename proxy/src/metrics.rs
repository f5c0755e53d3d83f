//! Prometheus metrics, served as text at `GET /metrics`.
//!
//! One process serves one proxy, so the metrics live in one process-wide registry ([`metrics`])
//! rather than being threaded through every constructor. Every label has a bounded set of values:
//! route paths from the configuration, stage names, status codes, and fixed reason words.
//! Gauges that mirror state (queue depth, workers) are set when scraped, not on every change.

use std::sync::LazyLock;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::http::error::TOO_MANY_CONNECTIONS;
use crate::stage::Shed;
use crate::traffic::Class;

/// Latency buckets for model serving: sub-millisecond proxy work to tens of seconds of model.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];
const BATCH_SIZE_BUCKETS: &[f64] =
    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Where a job that ended unanswered was (the `where` label of `corral_jobs_expired_total` and
/// `corral_jobs_cancelled_total`): a type rather than words at each count, so that every value is
/// made at 0 from the start ([`outcome_series`]) and none is spelled two ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Queue,
    Worker,
}

impl Place {
    pub const ALL: [Place; 2] = [Place::Queue, Place::Worker];

    pub fn label(self) -> &'static str {
        match self {
            Place::Queue => "queue",
            Place::Worker => "worker",
        }
    }
}

/// Why a stream ended before its worker ended it (the `reason` label of
/// `corral_streams_cancelled_total`), a type for the same reason as [`Place`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamCut {
    /// Its stream timeout ran out.
    Deadline,
    /// Its client went away.
    ClientLeft,
    /// Its client read too slowly to keep up.
    SlowClient,
}

impl StreamCut {
    pub const ALL: [StreamCut; 3] =
        [StreamCut::Deadline, StreamCut::ClientLeft, StreamCut::SlowClient];

    pub fn label(self) -> &'static str {
        match self {
            StreamCut::Deadline => "deadline",
            StreamCut::ClientLeft => "client_left",
            StreamCut::SlowClient => "slow_client",
        }
    }
}

/// The `stage` label of workers refused for naming no stage this proxy serves: a worker's claim
/// must not grow the label set, so no stage may be called this.
pub const UNKNOWN_STAGE: &str = "unknown";

pub struct Metrics {
    registry: Registry,
    /// Answers by route and status code.
    pub requests: IntCounterVec,
    /// Time from request arrival to answer, by route.
    pub request_seconds: HistogramVec,
    /// Jobs (and connections) refused with 503, by reason (`queue_full`,
    /// `deadline_unreachable`, `tenant_quota`, `shutting_down`, `too_many_connections`) and class.
    pub shed: IntCounterVec,
    /// Jobs answered 408, by where they were ([`Place`]; [`Metrics::expired`]).
    expired_by_place: IntCounterVec,
    /// Jobs whose client left before the answer, by where they were ([`Place`];
    /// [`Metrics::cancelled`]).
    cancelled_by_place: IntCounterVec,
    /// Results that came back after their job's deadline and were dropped.
    pub late_results: IntCounter,
    /// Spans that were not exported: the export queue was full (a slow or dead collector) or
    /// their export failed.
    pub spans_dropped: IntCounter,
    /// Time jobs spent queued before dispatch, by stage.
    pub queue_wait_seconds: HistogramVec,
    /// Jobs per batch, by stage.
    pub batch_size: HistogramVec,
    /// Time from sending a batch to receiving its results, by stage.
    pub batch_seconds: HistogramVec,
    /// Queued jobs, by stage (set at scrape time).
    pub queue_depth: IntGaugeVec,
    /// Queued jobs by stage and priority class (the class they hold now, promotions included).
    pub queue_depth_by_class: IntGaugeVec,
    /// Connected workers by stage and device (`--gpus`; devices from the config only).
    pub workers_by_gpu: IntGaugeVec,
    /// Queued jobs evicted to make room for a higher class (503 `preempted`).
    pub evicted: IntCounterVec,
    /// Connected workers, by stage (set at scrape time).
    pub workers_connected: IntGaugeVec,
    /// Workers holding a batch, by stage (set at scrape time).
    pub workers_busy: IntGaugeVec,
    /// Worker connections that ended in a failure, by stage and reason
    /// (`protocol`, `died`, `hung`, `refused`).
    pub worker_failures: IntCounterVec,
    /// Jobs given to another worker after theirs failed, by stage.
    pub retried: IntCounterVec,
    /// Batches sent to a busy worker ahead of time (the stage was saturated), by stage.
    pub batches_ahead: IntCounterVec,
    /// Streaming stages: time from sending a batch to its first chunk (or first result).
    pub time_to_first_chunk: HistogramVec,
    /// Chunks delivered towards streaming clients, by stage.
    pub chunks_sent: IntCounterVec,
    /// Streams open towards clients (SSE or NDJSON answers in progress).
    pub streams_open: prometheus::IntGauge,
    /// Streams ended early, by reason ([`StreamCut`]; [`Metrics::stream_cut`]).
    streams_cut: IntCounterVec,
    /// HTTP connections Corral closed on its own account, by reason (`malformed`,
    /// `head_timeout`, `stalled`): what `requests` cannot show.
    pub connections_closed: IntCounterVec,
    /// Log lines dropped because Corral's stdout or stderr was not read fast enough, by source.
    pub log_lines_dropped: IntCounterVec,
    /// Spawned worker processes restarted after exiting.
    pub worker_restarts: IntCounter,
    /// Bytes of shared memory held by large bodies (`--shared-memory-bytes`), in whole pages.
    pub shared_memory_used: prometheus::IntGauge,
    /// Large bodies that found no room in the shared memory and were read onto the heap.
    pub shared_memory_full: IntCounter,
}

/// Why a worker connection ended in a failure: `corral_worker_failures_total`'s `reason` (and a
/// failed batch's span event's `corral.reason`, which also says `closed`). One list, so that
/// each reason's series is made at 0 ([`stage_series`]) however many places end a connection
/// with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerFailure {
    /// Its connection broke while it held work.
    Died,
    /// It held work past its limit (and is killed, if spawned).
    Hung,
    /// It broke the worker protocol.
    Protocol,
    /// Its hello was refused.
    Refused,
}

impl WorkerFailure {
    pub const ALL: [Self; 4] = [Self::Died, Self::Hung, Self::Protocol, Self::Refused];

    pub fn label(self) -> &'static str {
        match self {
            Self::Died => "died",
            Self::Hung => "hung",
            Self::Protocol => "protocol",
            Self::Refused => "refused",
        }
    }
}

/// Makes a stage's worker failure series, at 0 (and the refusals of workers naming no stage),
/// and its evicted and retried jobs':
/// a series that appears only with its first failure is one whose first failure an alert on
/// its increase misses (`CorralWorkersRestarting` took four failures of a sidecar worker, not
/// three).
pub fn stage_series(stage: &str) {
    let m = metrics();
    for reason in WorkerFailure::ALL {
        m.worker_failures.with_label_values(&[stage, reason.label()]);
    }
    for class in Class::DISPATCH_ORDER {
        m.evicted.with_label_values(&[stage, class.label()]);
    }
    m.retried.with_label_values(&[stage]);
    m.worker_failures.with_label_values(&[UNKNOWN_STAGE, WorkerFailure::Refused.label()]);
}

/// Makes the series of jobs that did not end answered, at 0, for the same reason as
/// [`stage_series`]: each shed reason for each class (and, with no class, the refusals made
/// before a request's class was read), the expired and cancelled jobs by where they were, and
/// the streams ended early by why. Their label values are fixed words, so the set is small.
fn outcome_series(m: &Metrics) {
    for code in Shed::CODES {
        for class in Class::DISPATCH_ORDER {
            m.shed.with_label_values(&[code, class.label()]);
        }
    }
    for code in [TOO_MANY_CONNECTIONS, Shed::ShuttingDown.code()] {
        m.shed.with_label_values(&[code, ""]);
    }
    for place in Place::ALL {
        m.expired(place);
        m.cancelled(place);
    }
    for why in StreamCut::ALL {
        m.stream_cut(why);
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
        let m = Metrics::new();
        // At 0 from the start: a series that appears only with its first drop is one an alert
        // on its increase misses.
        for source in ["proxy", "worker"] {
            m.log_lines_dropped.with_label_values(&[source]);
        }
        outcome_series(&m);
        m
    });
    &METRICS
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric name");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric name");
    metric
}

/// `metric`, registered: for the metrics without labels.
fn registered<M>(registry: &Registry, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric name");
    metric
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let metric = HistogramVec::new(opts, labels).expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric name");
    metric
}

impl Metrics {
    /// The count of jobs answered 408 where they were.
    pub fn expired(&self, place: Place) -> IntCounter {
        self.expired_by_place.with_label_values(&[place.label()])
    }

    /// The count of jobs whose client left where they were.
    pub fn cancelled(&self, place: Place) -> IntCounter {
        self.cancelled_by_place.with_label_values(&[place.label()])
    }

    /// The count of streams ended early for this reason.
    pub fn stream_cut(&self, why: StreamCut) -> IntCounter {
        self.streams_cut.with_label_values(&[why.label()])
    }

    fn new() -> Self {
        let r = Registry::new();
        let late = registered(
            &r,
            IntCounter::new(
                "corral_late_results_total",
                "Worker results that arrived after their job's deadline and were dropped.",
            ),
        );
        let restarts = registered(
            &r,
            IntCounter::new(
                "corral_worker_restarts_total",
                "Spawned worker processes restarted after they exited.",
            ),
        );
        let spans_dropped = IntCounter::new(
            "corral_spans_dropped_total",
            "Spans not exported: the export queue was full (a slow or dead collector) or the \
             export failed.",
        )
        .expect("valid metric");
        r.register(Box::new(spans_dropped.clone())).expect("unique metric name");
        Self {
            spans_dropped,
            requests: counter(
                &r,
                "corral_requests_total",
                "HTTP answers by route and status code.",
                &["route", "code"],
            ),
            request_seconds: histogram(
                &r,
                "corral_request_duration_seconds",
                "Time from request arrival to its answer.",
                &["route"],
                SECONDS_BUCKETS,
            ),
            shed: counter(
                &r,
                "corral_jobs_shed_total",
                "Jobs refused with 503 at admission, or connections refused before a request \
                 was read, by reason and priority class (empty for refusals before a request's \
                 class was read).",
                &["reason", "class"],
            ),
            expired_by_place: counter(
                &r,
                "corral_jobs_expired_total",
                "Jobs whose deadline passed before their answer (408), by where they were.",
                &["where"],
            ),
            cancelled_by_place: counter(
                &r,
                "corral_jobs_cancelled_total",
                "Jobs whose client disconnected before the answer (and streams ended in the \
                 worker at their timeout), by where they were.",
                &["where"],
            ),
            late_results: late,
            queue_wait_seconds: histogram(
                &r,
                "corral_queue_wait_seconds",
                "Time jobs spent queued before dispatch.",
                &["stage"],
                SECONDS_BUCKETS,
            ),
            batch_size: histogram(
                &r,
                "corral_batch_size",
                "Jobs per dispatched batch.",
                &["stage"],
                BATCH_SIZE_BUCKETS,
            ),
            batch_seconds: histogram(
                &r,
                "corral_batch_duration_seconds",
                "Time from sending a batch to a worker to receiving its results.",
                &["stage"],
                SECONDS_BUCKETS,
            ),
            queue_depth: gauge(&r, "corral_queue_depth", "Jobs queued, by stage.", &["stage"]),
            queue_depth_by_class: gauge(
                &r,
                "corral_queue_depth_by_class",
                "Jobs queued, by stage and priority class.",
                &["stage", "class"],
            ),
            workers_by_gpu: gauge(
                &r,
                "corral_workers_connected_by_gpu",
                "Workers connected, by stage and the device they were given (--gpus).",
                &["stage", "gpu"],
            ),
            evicted: counter(
                &r,
                "corral_jobs_evicted_total",
                "Queued jobs evicted (503 preempted) to make room for a higher priority class, by \
                 stage and the evicted job's class.",
                &["stage", "class"],
            ),
            workers_connected: gauge(
                &r,
                "corral_workers_connected",
                "Workers connected, by stage.",
                &["stage"],
            ),
            workers_busy: gauge(
                &r,
                "corral_workers_busy",
                "Workers holding a batch, by stage.",
                &["stage"],
            ),
            worker_failures: counter(
                &r,
                "corral_worker_failures_total",
                "Worker connections that ended in a failure, by stage and reason.",
                &["stage", "reason"],
            ),
            retried: counter(
                &r,
                "corral_jobs_retried_total",
                "Jobs put back in the queue for another worker after theirs failed.",
                &["stage"],
            ),
            batches_ahead: counter(
                &r,
                "corral_batches_sent_ahead_total",
                "Batches sent to a busy worker ahead of time, by stage.",
                &["stage"],
            ),
            time_to_first_chunk: histogram(
                &r,
                "corral_time_to_first_chunk_seconds",
                "Streaming stages: time from sending a batch to its first chunk (or first result).",
                &["stage"],
                SECONDS_BUCKETS,
            ),
            chunks_sent: counter(
                &r,
                "corral_chunks_sent_total",
                "Chunks delivered towards streaming clients, by stage.",
                &["stage"],
            ),
            streams_open: registered(
                &r,
                prometheus::IntGauge::new(
                    "corral_streams_open",
                    "Streamed answers (SSE or NDJSON) in progress.",
                ),
            ),
            connections_closed: counter(
                &r,
                "corral_connections_closed_total",
                "HTTP connections Corral closed for a request it could not read (malformed), a \
                 head too slow (head_timeout), or answers the client stopped reading (stalled).",
                &["reason"],
            ),
            log_lines_dropped: counter(
                &r,
                "corral_log_lines_dropped_total",
                "Log lines dropped because Corral's stdout or stderr was not read as fast as they \
                 came: its own (proxy), or its spawned workers' output (worker).",
                &["source"],
            ),
            streams_cut: counter(
                &r,
                "corral_streams_cancelled_total",
                "Streams ended early, by reason (client_left, deadline, slow_client).",
                &["reason"],
            ),
            worker_restarts: restarts,
            shared_memory_used: registered(
                &r,
                prometheus::IntGauge::new(
                    "corral_shared_memory_used_bytes",
                    "Bytes of shared memory held by large request bodies (whole pages).",
                ),
            ),
            shared_memory_full: registered(
                &r,
                IntCounter::new(
                    "corral_shared_memory_full_total",
                    "Large request bodies that found no room in the shared memory and were read \
                     onto the heap.",
                ),
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics into a Vec cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_shed_s_code_is_one_whose_series_is_made_at_0() {
        let wait = Duration::from_secs(1);
        let sheds = [
            Shed::QueueFull { retry_after: wait },
            Shed::DeadlineUnreachable { retry_after: wait, alone: false },
            Shed::TenantQuota { retry_after: wait },
            Shed::ShuttingDown,
        ];
        for shed in sheds {
            // A variant added to Shed fails to compile here: add it to `sheds` and to CODES.
            match shed {
                Shed::QueueFull { .. }
                | Shed::DeadlineUnreachable { .. }
                | Shed::TenantQuota { .. }
                | Shed::ShuttingDown => {}
            }
            assert!(Shed::CODES.contains(&shed.code()), "{} has no series at 0", shed.code());
        }
    }

    #[test]
    fn the_series_of_jobs_not_answered_are_there_at_0_before_any_is_counted() {
        // A stage no other test names: its series can only have been made here.
        stage_series("made-at-0");
        let text = String::from_utf8(metrics().render()).unwrap();
        for series in [
            r#"corral_jobs_shed_total{class="low",reason="deadline_unreachable"}"#,
            r#"corral_jobs_shed_total{class="",reason="too_many_connections"}"#,
            r#"corral_jobs_expired_total{where="queue"}"#,
            r#"corral_jobs_cancelled_total{where="worker"}"#,
            r#"corral_streams_cancelled_total{reason="slow_client"}"#,
            r#"corral_jobs_evicted_total{class="high",stage="made-at-0"} 0"#,
            r#"corral_jobs_retried_total{stage="made-at-0"} 0"#,
            r#"corral_worker_failures_total{reason="hung",stage="made-at-0"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }
}
