//! Triton's statistics extension: `GET /v2/models/stats` (every model) and
//! `GET /v2/models/{name}/stats` (one), what tritonclient's `get_inference_statistics` and the
//! tools built on it (perf_analyzer's server-side figures) read. Each model is a route, its
//! figures since the proxy started ([`crate::statistics`]):
//!
//! - `inference_stats`: its requests, whatever protocol they came in: `success` and `fail` with
//!   their time from arrival to answer; `queue` (time queued) and `compute_infer` (time in the
//!   batch: the worker, and the socket both ways) of the successful ones, summed over the
//!   pipeline's stages. Corral does not time a worker's input and output apart from its
//!   inference: `compute_input` and `compute_output` count what `compute_infer` counts, in 0 ns.
//!   No cache: `cache_hit` and `cache_miss` are 0.
//! - `inference_count`: the rows of successful requests, each row one inference, as Triton
//!   counts; `last_inference` when the last was answered, in milliseconds since the Unix epoch.
//!   A request whose client left before its answer is in no count here (its batches are).
//! - `execution_count` and `batch_stats`: the batches its stages' workers finished, by size, with
//!   their time in the worker. A stage two routes share counts both routes' batches in each. A
//!   streaming worker's batch (or the jobs that joined its running one) counts as it sends its
//!   first chunk, its time that far: a stream lasts as long as its client reads.

use serde_json::{json, Value};

use crate::http::Route;
use crate::statistics::{executions_of, Tally};

/// `{"model_stats": [...]}` for `routes`.
pub fn of<'a>(routes: impl Iterator<Item = &'a Route>) -> Value {
    json!({"model_stats": routes.map(model).collect::<Vec<_>>()})
}

/// One model's statistics: Triton's `ModelStatistics` as JSON.
fn model(route: &Route) -> Value {
    let statistics = &route.statistics;
    let executions = executions_of(&route.pipeline.stages);
    // One count for the successful requests' three: read once, they never disagree.
    let (succeeded, success_ns) = statistics.success.read();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let unseparated = duration(succeeded, 0);
    let batches: Vec<Value> = executions
        .by_size()
        .map(|(size, count, nanos)| {
            json!({
                "batch_size": size,
                "compute_input": duration(count, 0),
                "compute_infer": duration(count, nanos),
                "compute_output": duration(count, 0),
            })
        })
        .collect();
    json!({
        "name": route.model,
        "version": "1",
        "last_inference": statistics.last_inference_ms.load(relaxed),
        "inference_count": statistics.inferences.load(relaxed),
        "execution_count": executions.count(),
        "inference_stats": {
            "success": duration(succeeded, success_ns),
            "fail": tally(&statistics.fail),
            "queue": duration(succeeded, statistics.queue_ns.load(relaxed)),
            "compute_input": unseparated,
            "compute_infer": duration(succeeded, statistics.compute_infer_ns.load(relaxed)),
            "compute_output": unseparated,
            "cache_hit": duration(0, 0),
            "cache_miss": duration(0, 0),
        },
        "response_stats": {},
        "batch_stats": batches,
        "memory_usage": [],
    })
}

fn tally(tally: &Tally) -> Value {
    let (count, nanos) = tally.read();
    duration(count, nanos)
}

/// Triton's `StatisticDuration`.
fn duration(count: u64, ns: u64) -> Value {
    json!({"count": count, "ns": ns})
}
