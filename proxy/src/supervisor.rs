//! Spawned workers: `corral --workers N -- CMD ARGS…` (or a stage's `command` in the config file)
//! runs N copies of CMD, each told the socket path (`CORRAL_SOCKET`), its stage (`CORRAL_STAGE`)
//! and its index (`CORRAL_WORKER_INDEX`), optionally pinned to a core ([`affinity`]), restarts a copy that exits (with
//! a capped exponential backoff, so a crash loop costs little and never takes the proxy down),
//! kills and restarts a copy found hung, and stops them all when the proxy stops.
//!
//! Each worker's stdout and stderr reach Corral's own, line by line, prefixed `[worker N]` (or
//! `[STAGE worker N]` for a stage other than `default`).

pub mod affinity;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::metrics::metrics;

/// First restart delay; doubled after each quick exit up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A worker that ran this long before exiting is restarted without delay, as is one that got as
/// far as connecting: only a worker that dies before serving is crash-looping.
const HEALTHY_RUN: Duration = Duration::from_secs(30);
/// At shutdown, how long a worker gets to exit on its own (it was sent `shutdown`) before it is
/// killed.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// How to start the workers.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub argv: Vec<String>,
    pub socket: PathBuf,
    /// The stage the workers serve.
    pub stage: String,
    /// Core of each worker, by index (empty: not pinned).
    pub cpus: Vec<usize>,
}

impl WorkerCommand {
    /// How the worker's output lines and log lines name it.
    fn label(&self, index: u32) -> String {
        if self.stage == crate::config::topology::DEFAULT_STAGE {
            format!("worker {index}")
        } else {
            format!("{} worker {index}", self.stage)
        }
    }
}

/// The worker processes this proxy runs, by pid: a connection that finds its worker hung asks
/// for it to be killed (and so restarted) through here. Pids of processes this proxy did not
/// spawn are never touched.
#[derive(Clone, Default)]
pub struct Children(Arc<Mutex<HashMap<u32, SpawnedWorker>>>);

/// What the supervisor and the connections share about one spawned worker.
#[derive(Clone, Default)]
struct SpawnedWorker {
    kill: CancellationToken,
    connected: Arc<AtomicBool>,
}

impl Children {
    /// Asks the supervisor to kill the worker with this pid; false if it is not ours.
    pub fn kill(&self, pid: u32) -> bool {
        match self.lock().get(&pid) {
            Some(child) => {
                child.kill.cancel();
                true
            }
            None => false,
        }
    }

    /// Notes that the worker with this pid (if ours) connected: it is not crash-looping.
    pub fn connected(&self, pid: u32) {
        if let Some(child) = self.lock().get(&pid) {
            child.connected.store(true, Ordering::Relaxed);
        }
    }

    fn register(&self, pid: u32) -> SpawnedWorker {
        let child = SpawnedWorker::default();
        self.lock().insert(pid, child.clone());
        child
    }

    fn forget(&self, pid: u32) {
        self.lock().remove(&pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, SpawnedWorker>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Spawns `count` supervised copies of the worker command on `tasks`; each is stopped once `stop`
/// is cancelled.
pub fn spawn(
    command: WorkerCommand,
    count: u32,
    children: &Children,
    tasks: &TaskTracker,
    stop: CancellationToken,
) {
    for index in 0..count {
        tasks.spawn(supervise(command.clone(), index, children.clone(), stop.clone()));
    }
}

async fn supervise(
    command: WorkerCommand,
    index: u32,
    children: Children,
    stop: CancellationToken,
) {
    let mut backoff = FIRST_BACKOFF;
    let mut restarts = 0u64;
    loop {
        let started = tokio::time::Instant::now();
        let mut child = match start(&command, index) {
            Ok(child) => child,
            Err(e) => {
                error!(stage = %command.stage, worker = index, command = ?command.argv, error = %e, "could not start worker");
                // Keep trying: the command may appear (a volume mounted late, say).
                if wait_or_stop(backoff, &stop).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let pid = child.id().unwrap_or_default();
        let registered = children.register(pid);
        info!(stage = %command.stage, worker = index, pid, restarts, "worker started");
        let status = tokio::select! {
            status = child.wait() => status.map(|s| s.to_string()),
            _ = registered.kill.cancelled() => {
                let _ = child.kill().await;
                Ok("killed: hung".to_string())
            }
            _ = stop.cancelled() => {
                stop_child(&mut child, index).await;
                children.forget(pid);
                return;
            }
        };
        children.forget(pid);
        restarts += 1;
        metrics().worker_restarts.inc();
        match status {
            Ok(status) => {
                warn!(stage = %command.stage, worker = index, %status, restarts, "worker exited; restarting")
            }
            Err(e) => {
                warn!(stage = %command.stage, worker = index, error = %e, restarts, "lost track of worker; restarting")
            }
        }
        if started.elapsed() >= HEALTHY_RUN || registered.connected.load(Ordering::Relaxed) {
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
    let mut spawn = Command::new(program);
    spawn
        .args(args)
        .env("CORRAL_SOCKET", &command.socket)
        .env("CORRAL_STAGE", &command.stage)
        .env("CORRAL_WORKER_INDEX", index.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(&cpu) = command.cpus.get(index as usize) {
        affinity::pin(&mut spawn, cpu);
    }
    let mut child = spawn.spawn()?;
    let label = Arc::new(command.label(index));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward(out, label.clone(), false));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward(err, label, true));
    }
    Ok(child)
}

/// Copies a worker's output to ours, one prefixed line at a time (whole lines, so that workers'
/// output never interleaves mid-line); ends when the worker closes it.
async fn forward(stream: impl AsyncRead + Unpin, label: Arc<String>, to_stderr: bool) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if to_stderr {
            eprintln!("[{label}] {line}");
        } else {
            println!("[{label}] {line}");
        }
    }
}

/// Sleeps for `delay` unless stopped first; true when stopped.
async fn wait_or_stop(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop.cancelled() => true,
    }
}

/// Lets a worker exit on its own after the proxy's `shutdown` message, then kills it.
async fn stop_child(child: &mut Child, index: u32) {
    if tokio::time::timeout(STOP_WAIT, child.wait()).await.is_ok() {
        return;
    }
    warn!(worker = index, "worker did not exit after shutdown; killing it");
    if let Err(e) = child.kill().await {
        warn!(worker = index, error = %e, "could not stop worker");
    }
}
