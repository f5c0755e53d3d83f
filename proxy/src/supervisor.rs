//! Spawned workers: `corral --workers N -- CMD ARGS…` runs N copies of CMD, each told the socket
//! path (`CORRAL_SOCKET`) and its index (`CORRAL_WORKER_INDEX`), restarts a copy that exits (with
//! a capped exponential backoff, so a crash loop costs little and never takes the proxy down),
//! and stops them all when the proxy stops.
//!
//! Workers inherit Corral's stdout and stderr, so their output lands in the same log stream.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

/// First restart delay; doubled after each quick exit up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A worker that ran this long before exiting is restarted without delay.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// How to start the workers.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub argv: Vec<String>,
    pub socket: PathBuf,
}

/// Spawns `count` supervised copies of the worker command on `tasks`; each is killed once `stop`
/// is cancelled.
pub fn spawn(command: WorkerCommand, count: u32, tasks: &TaskTracker, stop: CancellationToken) {
    for index in 0..count {
        tasks.spawn(supervise(command.clone(), index, stop.clone()));
    }
}

async fn supervise(command: WorkerCommand, index: u32, stop: CancellationToken) {
    let mut backoff = FIRST_BACKOFF;
    let mut restarts = 0u64;
    loop {
        let started = tokio::time::Instant::now();
        let mut child = match start(&command, index) {
            Ok(child) => child,
            Err(e) => {
                error!(worker = index, command = ?command.argv, error = %e, "could not start worker");
                // Keep trying: the command may appear (a volume mounted late, say).
                if wait_or_stop(backoff, &stop).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        info!(worker = index, pid = child.id(), restarts, "worker started");
        let status = tokio::select! {
            status = child.wait() => status,
            _ = stop.cancelled() => {
                stop_child(&mut child, index).await;
                return;
            }
        };
        restarts += 1;
        crate::metrics::metrics().worker_restarts.inc();
        match status {
            Ok(status) => warn!(worker = index, %status, restarts, "worker exited; restarting"),
            Err(e) => {
                warn!(worker = index, error = %e, restarts, "lost track of worker; restarting")
            }
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = FIRST_BACKOFF;
        }
        if wait_or_stop(backoff, &stop).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn start(command: &WorkerCommand, index: u32) -> std::io::Result<Child> {
    let (program, args) = command.argv.split_first().expect("a worker command is never empty");
    Command::new(program)
        .args(args)
        .env("CORRAL_SOCKET", &command.socket)
        .env("CORRAL_WORKER_INDEX", index.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
}

/// Sleeps for `delay` unless stopped first; true when stopped.
async fn wait_or_stop(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop.cancelled() => true,
    }
}

async fn stop_child(child: &mut Child, index: u32) {
    if let Err(e) = child.kill().await {
        warn!(worker = index, error = %e, "could not stop worker");
    }
}
