//! Corral: a sidecar batching proxy for model serving.
//!
//! Clients send single requests over HTTP; each becomes a [`job::Job`] with an id and a deadline,
//! waits in its [`stage::Stage`]'s bounded queue, and leaves in a batch for an idle inference
//! worker connected over a Unix socket. Every job gets exactly one answer.
//!
//! # Layout
//! - [`config`]: flags and `CORRAL_*` environment variables.
//! - [`http`]: the HTTP edge — server loop, routes, formats, the `/infer` handler, and the one
//!   mapping from failures to status codes.
//! - [`job`]: a job and its one-shot answer.
//! - [`stage`]: the bounded job queue and the batch release policy that idle workers pull through.
//! - [`worker`]: the worker socket and one task per connected worker (protocol in
//!   `corral-protocol`).
//! - [`metrics`]: Prometheus counters and histograms, served at `/metrics`.
//! - [`supervisor`]: spawned worker processes (`corral -- CMD`), restarted when they exit.
//! - [`run`]: wires these together and shuts them down in order.

pub mod config;
pub mod http;
pub mod job;
pub mod metrics;
pub mod stage;
pub mod supervisor;
pub mod worker;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::{FRAME_OVERHEAD_PER_JOB, MAX_FRAME_BYTES};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use config::Config;
use stage::{BatchSettings, Stage};

/// The single stage a command-line-configured proxy serves.
pub const DEFAULT_STAGE: &str = "default";

/// Runs the proxy until `shutdown` completes, then drains: stop taking HTTP connections, let open
/// requests finish (their workers still serve them), then close worker connections, stop spawned
/// workers and remove the socket file.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let socket = absolute(&config.socket)?;
    let http_listener = TcpListener::bind(config.listen).await?;
    let worker_listener = worker::listener::bind(&socket, config.socket_mode).await?;
    info!(addr = %http_listener.local_addr()?, "listening for HTTP");
    info!(socket = %socket.display(), "listening for workers");

    let settings = BatchSettings {
        max_batch_size: config.max_batch_size as usize,
        max_wait: config.max_wait(),
        max_batch_bytes: max_batch_bytes(config.max_batch_size as usize),
        policy: config.batch_policy,
        prefetch: config.worker_prefetch,
    };
    let stage = Arc::new(Stage::new(DEFAULT_STAGE, settings, config.queue_capacity as usize));
    let app = Arc::new(http::App {
        stage: stage.clone(),
        max_body_bytes: config.max_body_bytes,
        timeout: config.timeout(),
        retries: config.retries,
        draining: AtomicBool::new(false),
    });

    let stop_http = CancellationToken::new();
    let stop_workers = CancellationToken::new();
    let workers = TaskTracker::new();
    let children = supervisor::Children::default();
    let context = worker::connection::Context {
        stage: stage.clone(),
        shutdown: stop_workers.clone(),
        children: children.clone(),
        batch_timeout: config.batch_timeout(),
    };
    workers.spawn(worker::listener::accept(worker_listener, context, workers.clone()));
    if !config.worker_cmd.is_empty() {
        let command =
            supervisor::WorkerCommand { argv: config.worker_cmd.clone(), socket: socket.clone() };
        supervisor::spawn(command, config.workers, &children, &workers, stop_workers.clone());
    }
    let expired = CancellationToken::new();
    let server = tokio::spawn(http::server::serve(
        http_listener,
        app.clone(),
        stop_http.clone(),
        config.grace_period(),
        expired.clone(),
        http::server::Limits {
            max_connections: config.max_connections as usize,
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
            max_header_bytes: config.max_header_bytes,
            max_headers: config.max_headers,
        },
    ));

    shutdown.await;
    info!(grace_ms = config.grace_period_ms, "shutting down: draining open requests");
    app.draining.store(true, Ordering::Relaxed);
    stop_http.cancel();
    // If the grace period runs out, the queue and the workers answer what they hold 503.
    let give_up = tokio::spawn({
        let (stage, stop_workers) = (stage.clone(), stop_workers.clone());
        async move {
            expired.cancelled().await;
            stage.close();
            stop_workers.cancel();
        }
    });
    let _ = server.await;
    give_up.abort();
    stage.close();
    stop_workers.cancel();
    workers.close();
    workers.wait().await;
    worker::listener::remove(&socket);
    info!("stopped");
    Ok(())
}

/// Payload bytes one batch may carry so that its frame stays under the protocol's limit.
fn max_batch_bytes(max_batch_size: usize) -> usize {
    MAX_FRAME_BYTES - max_batch_size * FRAME_OVERHEAD_PER_JOB - 1024
}

/// The socket path as spawned workers must see it, whatever their working directory.
fn absolute(path: &std::path::Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(path))
    }
}
