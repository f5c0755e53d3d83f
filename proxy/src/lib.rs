//! Corral: a sidecar batching proxy for model serving.
//!
//! Clients send single requests over HTTP; each becomes a [`job::Job`] with an id and a deadline,
//! waits in its [`stage::Stage`]'s bounded queue, and leaves in a batch for an idle inference
//! worker connected over a Unix socket. Every job gets exactly one answer.
//!
//! # Layout
//! - [`config`]: flags, `CORRAL_*` environment variables and the config file, resolved into a
//!   [`config::topology::Topology`]: stages, and the routes whose pipelines use them.
//! - [`http`]: the HTTP edge — server loop and its connection clocks, the connection reserve
//!   past the cap for probes, request heads' checks, routes, formats and body checks, the `/infer`
//!   handler and its streamed answer path (SSE, NDJSON), the client protocols as envelopes around
//!   rows (Open Inference v2, KServe v1, OpenAI embeddings), the deadline and traffic headers,
//!   `/openapi.json`, and the one mapping from failures to status codes.
//! - [`job`]: a job and its one-shot answer.
//! - [`stream`]: a streamed job's bounded chunk buffer between its worker and its client.
//! - [`stage`]: the bounded job queue and the batch release policy that idle workers pull through;
//!   its lanes order jobs by priority class and tenant, and its batches are bounded by weight.
//! - [`traffic`]: what a request says about its jobs — priority class, tenant, weight.
//! - [`pipeline`]: a route's stages in order; carries a request's jobs from one to the next.
//! - [`worker`]: the worker socket and one task per connected worker — it reads, its outbox
//!   writes; plain and streaming pull loops (protocol in `corral-protocol`).
//! - [`timing`]: where a request's time went (queue, batch, total), for `server-timing`; its
//!   task-local also carries the request's trace context to the spans below the edge.
//! - [`trace`]: OpenTelemetry spans (request, admission, queue wait, batch), exported over OTLP
//!   when an endpoint is set; nothing at all otherwise.
//! - [`shared_memory`]: the memory file large request bodies are read into, which workers that
//!   ask map read-only and read their payloads from instead of from the socket.
//! - [`msgpack`]: msgpack as the proxy reads it from clients and workers alike: the one check
//!   of a value, the nesting bound every decoder keeps, a `bin`'s bytes.
//! - [`metrics`]: Prometheus counters and histograms, served at `/metrics`.
//! - [`statistics`]: a route's requests and a stage's batches as Triton's statistics extension
//!   counts them (`/v2/models/{name}/stats`).
//! - [`open_files`]: the open-file limit, raised at start, and the connection cap it allows.
//! - [`supervisor`]: spawned worker processes (`corral -- CMD`), restarted when they exit; their
//!   cores, GPUs and environment; their output forwarded into the log, and the proxy's own log
//!   writer (`supervisor::output`).
//! - [`run`]: wires these together and shuts them down in order.
//!
//! The binary (main.rs) adds what belongs to a process rather than a library: the command line
//! (and its config errors, exit 2), logging, keeping off the cores pinned workers own, the
//! signals that start the drain, and its allocator (allocator.rs: jemalloc, with the options
//! that let large bodies reuse their pages).

pub mod config;
pub mod http;
pub mod job;
pub mod metrics;
pub mod msgpack;
pub mod open_files;
pub mod pipeline;
pub mod shared_memory;
pub mod stage;
pub mod statistics;
pub mod stream;
pub mod supervisor;
pub mod timing;
pub mod trace;
pub mod traffic;
pub mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::{FRAME_OVERHEAD_PER_JOB, MAX_FRAME_BYTES};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use config::topology::{StageSpec, Topology};
use config::Config;
use pipeline::Pipeline;
use stage::{BatchSettings, Stage};

/// The shared memory for large request bodies, unless `size` is 0 or the system has none (logged:
/// bodies then reach workers over their sockets, as they do for workers that do not ask).
fn shared_memory(size: usize) -> Option<Arc<shared_memory::SharedMemory>> {
    if size == 0 {
        return None;
    }
    if size < shared_memory::SHARED_FROM {
        // No body could ever use it: each large one was counted as finding it full, and the
        // log had said that large bodies go through it.
        tracing::warn!(
            bytes = size,
            "--shared-memory-bytes is less than the 64 KiB the smallest shared body takes: none \
             is shared (0 says so; raise it to share)"
        );
        return None;
    }
    if let Some(memory) = shared_memory::memory_limit().filter(|&memory| size as u64 > memory) {
        // Pages are taken as bodies first use them, and kept: past the memory there is, a busy
        // proxy is killed for what it was allowed to take.
        tracing::warn!(
            bytes = size,
            memory,
            "--shared-memory-bytes is more than the memory this process may use; lower it"
        );
    }
    shared_memory::SharedMemory::new(size)
        .inspect(|_| info!(bytes = size, "large bodies go through shared memory"))
        .inspect_err(|e| tracing::warn!(error = %e, "no shared memory: bodies use the socket"))
        .ok()
}

/// Runs the proxy until `shutdown` completes, then drains: stop taking HTTP connections, let open
/// requests finish (their workers still serve them), then close worker connections, stop spawned
/// workers and remove the socket file.
pub async fn run(
    config: Config,
    topology: Topology,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let socket = absolute(&config.socket)?;
    if let Some(endpoint) = config.traces_endpoint() {
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| "corral".to_string());
        trace::init(&endpoint, &service, config.trace_sample_ratio)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        info!(endpoint, service, ratio = config.trace_sample_ratio, "exporting spans over OTLP");
    }
    // Workers of a stage with no command are not spawned: counted, `--workers 1024` for
    // external workers had lowered the connection cap by 4,096 descriptors.
    let spawned: u32 = topology.stages.iter().map(StageSpec::spawned_workers).sum();
    let max_connections =
        open_files::connection_cap(config.max_connections as usize, spawned as usize);
    // Each error names what could not be set up: a bare "Address already in use" or "No such
    // file or directory" left a newcomer to guess which address, or which path.
    let http_listener = TcpListener::bind(config.listen).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen for HTTP on {} (--listen): {e}", config.listen),
        )
    })?;
    let (worker_listener, worker_socket) =
        worker::listener::bind(&socket, config.socket_mode).await.map_err(|e| {
            let path = socket.display();
            std::io::Error::new(
                e.kind(),
                format!("cannot listen for workers at {path} (--socket): {e}"),
            )
        })?;
    info!(addr = %http_listener.local_addr()?, "listening for HTTP");
    info!(socket = %socket.display(), "listening for workers");

    let shared_memory = shared_memory(config.shared_memory_bytes);

    let stages: Vec<Arc<Stage>> = topology
        .stages
        .iter()
        .map(|spec| Arc::new(stage(spec, feeds(&topology, &spec.name), &config)))
        .collect();
    let by_name: HashMap<String, Arc<Stage>> =
        stages.iter().map(|stage| (stage.name().to_string(), stage.clone())).collect();
    let routes = topology
        .routes
        .iter()
        .enumerate()
        .map(|(index, route)| {
            let pipeline = Pipeline {
                stages: route.stages.iter().map(|name| by_name[name].clone()).collect(),
            };
            info!(path = %route.path, pipeline = %route.pipeline, stages = %route.stages.join(","), "serving route");
            http::Route {
                name: route.name.clone(),
                model: route.model.clone(),
                path: route.path.clone(),
                plain: config::topology::plain_path(&route.path),
                pipeline,
                timeout: route.timeout,
                protocol: route.protocol,
                priority: route.priority,
                statistics: Default::default(),
                index,
            }
        })
        .collect();
    // Cancelled when the grace period runs out.
    let expired = CancellationToken::new();
    let app = Arc::new(http::App {
        stream_buffer_bytes: config.stream_buffer_bytes as usize,
        stream_keepalive: (config.stream_keepalive_ms > 0)
            .then(|| Duration::from_millis(config.stream_keepalive_ms)),
        routes,
        stages: stages.clone(),
        max_body_bytes: config.max_body_bytes,
        max_header_bytes: config.max_header_bytes,
        max_headers: config.max_headers,
        body_read_timeout: config.body_read_timeout(),
        retries: config.retries,
        draining: AtomicBool::new(false),
        grace_over: expired.clone(),
        tenant_header: config.tenant_header.clone(),
        shared_memory: shared_memory.clone(),
        openapi: std::sync::Mutex::default(),
    });

    let stop_http = CancellationToken::new();
    let stop_workers = CancellationToken::new();
    let workers = TaskTracker::new();
    let children = supervisor::Children::default();
    let by_stage = Arc::new(by_name);
    let context = worker::connection::Context {
        stages: by_stage.clone(),
        shutdown: stop_workers.clone(),
        children: children.clone(),
        spawning: Arc::new(
            topology.stages.iter().filter(|s| s.spawns()).map(|s| s.name.clone()).collect(),
        ),
        shared_memory,
        external: Arc::new(tokio::sync::Semaphore::new(worker::connection::MAX_EXTERNAL)),
        awaiting_hello: Arc::new(tokio::sync::Semaphore::new(
            worker::listener::AWAITING_HELLO + spawned as usize,
        )),
    };
    workers.spawn(worker::listener::accept(
        worker_listener,
        worker_socket,
        context,
        workers.clone(),
    ));
    if std::process::id() == 1 && topology.stages.iter().any(StageSpec::spawns) {
        // Corral reaps its own children only: what a worker's wrapper leaves behind (a killed
        // group's members, a `sh -c` grandchild) is handed to process 1, here Corral itself.
        warn!(
            "corral runs as process 1 and spawns workers: orphaned processes of theirs are not \
             reaped and stay zombies; run it under an init (`docker run --init`, tini; the \
             all-in-one image does)"
        );
    }
    for spec in topology.stages.iter().filter(|spec| spec.spawns()) {
        let command = supervisor::WorkerCommand {
            on_exit: {
                let stage = by_stage[&spec.name].clone();
                supervisor::ExitHook(Arc::new(move |how: &str| stage.worker_exited(how)))
            },
            argv: spec.command.clone(),
            socket: socket.clone(),
            stage: spec.name.clone(),
            cpus: spec.cpus.clone(),
            gpus: spec.gpus.clone(),
            workers_per_gpu: spec.workers_per_gpu,
            env: spec.env.clone(),
        };
        supervisor::spawn(command, spec.workers, &children, &workers, stop_workers.clone());
    }
    let server = tokio::spawn(http::server::serve(
        http_listener,
        app.clone(),
        stop_http.clone(),
        config.grace_period(),
        expired.clone(),
        http::server::Limits {
            max_connections,
            http2_max_streams: config.http2_max_streams,
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms),
            max_header_bytes: config.max_header_bytes,
            max_headers: config.max_headers,
            // A stream lasts at most its stage's stream timeout (http/stream.rs).
            stream_timeout: topology
                .stages
                .iter()
                .map(|spec| spec.stream_timeout)
                .max()
                .unwrap_or(Duration::from_millis(config.stream_timeout_ms)),
        },
    ));

    shutdown.await;
    info!(grace_ms = config.grace_period_ms, "shutting down: draining open requests");
    app.draining.store(true, Ordering::Relaxed);
    stop_http.cancel();
    // If the grace period runs out, the queue and the workers answer what they hold 503.
    let give_up = tokio::spawn({
        let (stages, stop_workers) = (stages.clone(), stop_workers.clone());
        async move {
            expired.cancelled().await;
            stages.iter().for_each(|stage| stage.close());
            stop_workers.cancel();
        }
    });
    let _ = server.await;
    give_up.abort();
    stages.iter().for_each(|stage| stage.close());
    stop_workers.cancel();
    workers.close();
    workers.wait().await;
    trace::shutdown();
    info!("stopped");
    Ok(())
}

/// Whether some route's pipeline passes the stage's outputs on to another stage.
fn feeds(topology: &Topology, stage: &str) -> bool {
    topology.routes.iter().any(|route| {
        let (_, before_last) = route.stages.split_last().expect("a pipeline has a stage");
        before_last.iter().any(|name| name == stage)
    })
}

/// A stage of the topology; `feeds` when some pipeline passes its outputs on to another stage.
fn stage(spec: &StageSpec, feeds: bool, config: &Config) -> Stage {
    let max_batch_size = spec.max_batch_size as usize;
    let settings = BatchSettings {
        max_batch_size,
        max_wait: spec.max_wait,
        // Validated against the frame already (config::topology); kept under it here too, since
        // a frame the outbox refuses would cost the worker its connection.
        max_batch_bytes: usize::try_from(spec.max_batch_bytes)
            .unwrap_or(usize::MAX)
            .min(frame_payload_bytes(max_batch_size)),
        max_job_bytes: max_job_bytes(config.max_header_bytes),
        max_batch_weight: spec.max_batch_weight.map(|w| usize::try_from(w).unwrap_or(usize::MAX)),
        policy: spec.batch_policy,
        prefetch: spec.worker_prefetch,
        batch_timeout: spec.batch_timeout,
    };
    metrics::stage_series(&spec.name);
    // A spawned worker's output waits for a stalled stdout no longer than half its limit past
    // its jobs' time: its --batch-timeout-ms, or the automatic one's margin.
    if spec.spawns() {
        supervisor::output::bound_stall(
            spec.batch_timeout.unwrap_or(worker::connection::HUNG_MARGIN),
        );
    }
    info!(
        stage = %spec.name,
        max_batch_size,
        max_wait_ms = spec.max_wait.as_millis() as u64,
        workers = spec.spawned_workers(),
        "stage"
    );
    let capacity_bytes = usize::try_from(spec.queue_capacity_bytes).unwrap_or(usize::MAX);
    Stage::new(spec.name.clone(), settings, spec.queue_capacity as usize)
        .with_capacity_bytes(capacity_bytes)
        .feeding(feeds)
        .with_stream_timeout(spec.stream_timeout)
        .with_aging(config.priority_aging())
        .with_tenant_share(config.tenant_queue_share)
        .with_gpus(spec.gpus.clone())
}

/// Payload bytes a batch of `jobs` jobs may carry so that its frame stays under the protocol's
/// limit: a batch budget (`--max-batch-bytes`) is at most this for a full batch, and a lone job
/// at most this for one.
pub fn frame_payload_bytes(jobs: usize) -> usize {
    MAX_FRAME_BYTES - jobs * FRAME_OVERHEAD_PER_JOB - 1024
}

/// Payload bytes of one job, checked before it is queued: what a frame of that job alone carries,
/// less room for the trace context its frame may carry beside it (`traceparent`, and a client's
/// `tracestate`, which the head limit bounds), so that no admitted job makes a frame too large.
fn max_job_bytes(max_header_bytes: usize) -> usize {
    frame_payload_bytes(1).saturating_sub(max_header_bytes + 128)
}

/// The socket path as spawned workers must see it, whatever their working directory (and as
/// it is bound, so measured: `worker::listener::path_problem`).
pub(crate) fn absolute(path: &std::path::Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(path))
    }
}
