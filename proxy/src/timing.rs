//! Where a request's time went, for its `server-timing` and `x-corral-batch-size` headers, and
//! which route's jobs it ran, for that route's statistics ([`crate::statistics`]).
//!
//! The HTTP edge runs each request inside [`scope`]; the pipeline [`record`]s each stage the
//! request's jobs went through, from the [`Reply`]s its jobs got. Nothing here knows about
//! formats or protocols: any handler that runs jobs through a pipeline (a native route, a
//! protocol's envelope) gets the headers, written once at the edge. Outside a scope (tests, a
//! caller that does not want them) recording does nothing. The cost is a task-local `Cell` of a
//! few words per request, and two clock reads per job (when its batch is sent, when it is
//! answered).

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use opentelemetry::Context;
use tokio::time::Instant;

use crate::job::{Reply, Sent};

/// Header naming how many jobs the batch that carried the request held.
pub const BATCH_SIZE_HEADER: &str = "x-corral-batch-size";
/// W3C Server-Timing.
pub const SERVER_TIMING_HEADER: &str = "server-timing";

/// A request's time in queues and in workers, summed over the stages of its pipeline; and, for
/// its route's statistics, the route it was admitted to and its rows answered.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// From entering each stage's queue until its batch was sent, summed over stages; within a
    /// stage, that of the request's job answered last.
    pub queue: Duration,
    /// From each batch being sent until the answer came (time in the worker, and on the socket),
    /// or the deadline, for a job its worker held past it; summed over stages; within a stage,
    /// that of the request's job answered last.
    pub batch: Duration,
    /// The size of the batch the request rode in at its last stage (for a request of several
    /// items, the largest of its batches there). Zero: no job of the request rode a batch.
    pub batch_size: u32,
    /// The request's rows the worker answered with a result (a stream: 1 once it produced).
    pub rows_done: u32,
    /// The route the request was admitted to (its place in `App::routes`), if any: its
    /// statistics count the request when the edge answers it ([`admitted`]).
    pub route: Option<usize>,
}

/// What the edge keeps for a request while it runs: its timing, and its span when tracing is on.
struct Request {
    timing: Cell<Timing>,
    trace: Option<Context>,
}

tokio::task_local! {
    static REQUEST: Request;
}

/// Runs a request's handler (under its span's context, if traced), and returns with its answer
/// where its time went.
pub fn scope<F: Future>(
    trace: Option<Context>,
    handler: F,
) -> impl Future<Output = (F::Output, Timing)> {
    let request = Request { timing: Cell::new(Timing::default()), trace };
    // A combinator, not async: an async fn and block awaiting `handler` each kept their own
    // copy of it beside the one they awaited, and this is every request's handler (4 KiB): a
    // request's future was 13 KiB, all of it copied as hyper took each request.
    REQUEST.scope(request, handler.map(|output| (output, REQUEST.with(|r| r.timing.get()))))
}

/// The context of the running request's span, if it is traced.
pub fn trace() -> Option<Context> {
    REQUEST.try_with(|request| request.trace.clone()).ok().flatten()
}

/// Records one stage of the request: the jobs entered its queue at `entered` and got `replies`.
/// The stage's queue and batch are those of its job answered last, the one the request waited
/// for: taken each as the longest over the jobs, they could come from two jobs (one long in the
/// queue, another long in its batch) and add up past the request's total. The batch size is the
/// largest batch any of them rode. A job expired in its worker counts, answered at its deadline;
/// jobs that never rode a batch (expired in the queue, shed) add nothing.
pub fn record<'a>(entered: Instant, replies: impl IntoIterator<Item = &'a Reply>) {
    let mut batch_size = 0;
    let mut last: Option<(Sent, Instant)> = None;
    for (sent, answered) in replies.into_iter().filter_map(|reply| reply.batch) {
        batch_size = batch_size.max(sent.batch_size);
        if last.is_none_or(|(_, at)| answered > at) {
            last = Some((sent, answered));
        }
    }
    if let Some((sent, answered)) = last {
        add(Timing { batch_size, ..Timing::of_job(entered, sent, answered) });
    }
}

/// Records that the request was admitted to the route at `route` (its place in `App::routes`):
/// whatever becomes of it, it is that route's ([`crate::http::App::admit`]).
pub fn admitted(route: usize) {
    let _ = REQUEST.try_with(|request| {
        request.timing.set(Timing { route: Some(route), ..request.timing.get() });
    });
}

/// Records how many of the request's rows the worker answered with a result.
pub fn rows_done(rows: usize) {
    let _ = REQUEST.try_with(|request| {
        let rows_done = u32::try_from(rows).unwrap_or(u32::MAX);
        request.timing.set(Timing { rows_done, ..request.timing.get() });
    });
}

/// Records a streamed job at its first chunk (or its answer): its batch, sent at `sent`, had
/// produced something by `first`.
pub fn record_stream(entered: Instant, sent: Option<Sent>, first: Instant) {
    if let Some(sent) = sent {
        add(Timing::of_job(entered, sent, first));
    }
}

impl Timing {
    /// One job's time at a stage: queued from `entered` until its batch was `sent`, in that
    /// batch until `answered`.
    fn of_job(entered: Instant, sent: Sent, answered: Instant) -> Self {
        Timing {
            queue: sent.at.saturating_duration_since(entered),
            batch: answered.saturating_duration_since(sent.at),
            batch_size: sent.batch_size,
            ..Timing::default()
        }
    }

    /// The `server-timing` value: `queue` and `batch` when a batch ran, and `total` (`total`:
    /// from the request's start to its answer, or to a stream's first chunk), in milliseconds.
    pub fn header(&self, total: Duration) -> String {
        if self.batch_size == 0 {
            return format!("total;dur={}", Millis(total));
        }
        format!(
            "queue;dur={}, batch;dur={}, total;dur={}",
            Millis(self.queue),
            Millis(self.batch),
            Millis(total)
        )
    }
}

/// A duration in milliseconds to the (whole) microsecond: `12.345`. Written from integers: a
/// float's fixed-precision formatting took 0.8% of the proxy's CPU per echo request.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0.as_micros();
        write!(f, "{}.{:03}", micros / 1000, micros % 1000)
    }
}

fn add(stage: Timing) {
    if stage.batch_size == 0 {
        return;
    }
    let _ = REQUEST.try_with(|request| {
        let mut timing = request.timing.get();
        timing.queue += stage.queue;
        timing.batch += stage.batch;
        timing.batch_size = stage.batch_size;
        request.timing.set(timing);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Outcome;

    fn reply(entered: Instant, queued_ms: u64, took_ms: u64, size: u32) -> Reply {
        let at = entered + Duration::from_millis(queued_ms);
        let sent = Sent { at, batch_size: size, span: None };
        let batch = Some((sent, at + Duration::from_millis(took_ms)));
        Reply { outcome: Outcome::Ended, batch, class: Default::default() }
    }

    #[tokio::test]
    async fn stages_add_up_and_the_last_stage_names_the_batch_size() {
        let start = Instant::now();
        let ((), timing) = scope(None, async {
            // Two jobs in the first stage: the one answered last counts (2 + 10 ms), and the
            // larger batch names the size.
            record(start, &[reply(start, 2, 10, 4), reply(start, 5, 3, 8)]);
            let next = start + Duration::from_millis(20);
            record(next, &[reply(next, 1, 4, 2)]);
            // A job that never rode a batch adds nothing.
            record(
                next,
                &[Reply { outcome: Outcome::Expired, batch: None, class: Default::default() }],
            );
        })
        .await;
        assert_eq!(timing.queue, Duration::from_millis(3));
        assert_eq!(timing.batch, Duration::from_millis(14));
        assert_eq!(timing.batch_size, 2);
        assert_eq!(
            timing.header(Duration::from_millis(30)),
            "queue;dur=3.000, batch;dur=14.000, total;dur=30.000"
        );
    }

    #[tokio::test]
    async fn queue_and_batch_come_from_one_job_and_never_pass_the_total() {
        // One item batched 300 ms at once, the other queued 300 ms behind it and done in 1 ms:
        // each part's longest (300 + 300) once passed the request's 301 ms.
        let start = Instant::now();
        let ((), timing) = scope(None, async {
            record(start, &[reply(start, 0, 300, 1), reply(start, 300, 1, 1)]);
        })
        .await;
        assert_eq!((timing.queue, timing.batch), (ms(300), ms(1)));
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn milliseconds_are_written_to_the_whole_microsecond() {
        let written = |nanos: u64| Millis(Duration::from_nanos(nanos)).to_string();
        assert_eq!(written(0), "0.000");
        assert_eq!(written(999), "0.000");
        assert_eq!(written(1_000), "0.001");
        assert_eq!(written(12_345_678), "12.345");
        assert_eq!(written(3_600_000_000_000), "3600000.000");
    }

    #[test]
    fn outside_a_scope_recording_does_nothing_and_no_batch_means_total_only() {
        let start = Instant::now();
        record(start, &[reply(start, 2, 10, 4)]);
        assert_eq!(Timing::default().header(Duration::from_millis(1)), "total;dur=1.000");
    }
}
