//! Spawned workers: `corral --workers N -- CMD ARGS…` (or a stage's `command` in the config file)
//! runs N copies of CMD, each told the socket path (`CORRAL_SOCKET`), its stage (`CORRAL_STAGE`)
//! and its index (`CORRAL_WORKER_INDEX`), optionally pinned to a core ([`affinity`]) and given a
//! GPU and an environment ([`placement`]), restarts a copy that exits (with
//! a capped exponential backoff, so a crash loop costs little and never takes the proxy down),
//! kills and restarts a copy found hung or left without its connection, and stops them all
//! when the proxy stops.
//!
//! Each worker runs in a process group of its own ([`group`]), which is what gets killed: a
//! worker started through a wrapper (`sh -c`, `uv run`) dies with it. Spawned workers never
//! outlive the proxy: the group is stopped at shutdown, killed on a hurried exit, and the spawned
//! process gets a parent-death signal ([`spawner`]); workers are told the proxy's pid
//! (`CORRAL_PROXY_PID`) to watch for themselves.
//!
//! Each worker's stdout and stderr reach Corral's own, line by line, prefixed `[worker N]` (or
//! `[STAGE worker N]` for a stage other than `default`) ([`output`]).

pub mod affinity;
pub mod group;
pub mod output;
pub mod placement;
mod spawner;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::metrics::metrics;

/// First restart delay; doubled after each quick exit up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A worker that ran this long before exiting is restarted without delay, as is one that
/// answered work: only a worker that dies before serving is crash-looping. Connecting is not
/// enough: a model that fails on its first batch connects every time, and was restarted six
/// times a second for ever.
const HEALTHY_RUN: Duration = Duration::from_secs(30);
/// At shutdown, how long a worker gets to exit on its own (it was sent `shutdown`) before it is
/// killed.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a spawned worker whose connection ended (it died holding a batch, broke the protocol,
/// hung up, was refused) gets to exit on its own, or connect again, before it is killed, and so
/// restarted. One that lives on without a connection (a `forward` that never returns, a worker in
/// another language that does not exit) had left its stage a worker short until the proxy stopped,
/// with no restart and no alert. Its jobs went elsewhere at once; this is only the process.
const LOST_WAIT: Duration = Duration::from_secs(5);

/// How to start the workers.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// Told how each of its workers exited (the stage keeps it, for `/readyz`).
    pub on_exit: ExitHook,
    pub argv: Vec<String>,
    pub socket: PathBuf,
    /// The stage the workers serve.
    pub stage: String,
    /// Core of each worker, by index (empty: not pinned).
    pub cpus: Vec<usize>,
    /// Devices the workers are spread over, `workers_per_gpu` each (empty: none).
    pub gpus: Vec<u32>,
    pub workers_per_gpu: u32,
    /// Environment for every worker (placeholders checked at start; filled in per worker).
    pub env: Vec<(String, String)>,
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

/// The worker processes this proxy runs, by process group (the spawned pid): a connection that
/// finds its worker hung asks for it to be killed (and so restarted) through here, naming the
/// worker's pid as the kernel gives it (the socket peer's): the spawned one or, through a
/// wrapper, one in its group.
/// Processes this proxy did not spawn are never touched.
#[derive(Clone, Default)]
pub struct Children(Arc<Mutex<HashMap<u32, SpawnedWorker>>>);

/// What the supervisor and the connections share about one spawned worker.
#[derive(Clone, Default)]
pub struct SpawnedWorker {
    kill: CancellationToken,
    /// Why it was killed, once it is.
    killed_for: Arc<OnceLock<Killed>>,
    /// The connections it holds, joined to a stage, counted from its hello; one ended by the
    /// proxy's `shutdown` stays counted (the worker was told to go).
    connections: Arc<AtomicUsize>,
    /// The connections it has open, joined or not yet (in their handshake).
    open: Arc<AtomicUsize>,
    /// Set once a connection of its sent a message (a hello, refused or not): only then is
    /// losing its connections a worker left without one (a wrapper probing the socket before
    /// the worker it starts has loaded is not).
    spoke: Arc<AtomicBool>,
    /// Bumped by each connection it opens and loses: a wait begun at a loss kills only if
    /// nothing happened since (a reconnect, or a later loss, whose own wait then counts).
    changes: Arc<AtomicU64>,
    /// Set once it answered work (a batch, a stream's job): it is not crash-looping.
    served: Served,
    /// The device it was given, if any.
    gpu: Option<u32>,
    /// The stage it was spawned for.
    stage: Arc<str>,
}

/// Why the supervisor killed a spawned worker.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Killed {
    /// It held a batch past its limit.
    Hung,
    /// It lived on [`LOST_WAIT`] without a connection, having spoken on one.
    Lost,
}

impl Killed {
    /// As `/readyz` and the log say how it exited: "killed: hung".
    fn why(self) -> &'static str {
        match self {
            Killed::Hung => "hung",
            Killed::Lost => "its connection ended",
        }
    }
}

impl SpawnedWorker {
    // Each count is its own atomic, read without a lock: the one race, a connection opened
    // just as a wait ends, kills a worker that had been without one for the whole wait.

    /// Notes that it opened a connection to the socket, hello or not yet.
    pub fn connecting(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes that a connection of its sent a message (a hello, refused or not).
    pub fn spoke(&self) {
        self.spoke.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::spoke`] was noted.
    #[cfg(test)]
    pub fn has_spoken(&self) -> bool {
        self.spoke.load(Ordering::Relaxed)
    }

    /// Notes that it connected; what its connection marks once it answered work.
    pub fn connected(&self) -> Served {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.spoke();
        self.served.clone()
    }

    /// Notes that a connection of its ended otherwise than by the proxy's `shutdown` (`joined`:
    /// one [`Self::connected`] counted). Once it has spoken on one, a worker left with none
    /// open that neither connects again nor exits within [`LOST_WAIT`] is killed (and
    /// restarted): one refused at its hello that does not exit, too.
    pub fn lost(&self, joined: bool) {
        if joined {
            self.connections.fetch_sub(1, Ordering::Relaxed);
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
        let at = self.changes.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.spoke.load(Ordering::Relaxed) {
            return;
        }
        // Dropped outside a runtime (none is today) nothing is armed, rather than a panic.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let worker = self.clone();
        runtime.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(LOST_WAIT) => {}
                () = worker.kill.cancelled() => return,
            }
            let still = worker.changes.load(Ordering::Relaxed) == at;
            if still && worker.open.load(Ordering::Relaxed) == 0 {
                worker.killed_for.get_or_init(|| Killed::Lost);
                worker.kill.cancel();
            }
        });
    }

    /// The device it was given, if any.
    pub fn gpu(&self) -> Option<u32> {
        self.gpu
    }

    /// The stage it was spawned for.
    pub fn stage(&self) -> &str {
        &self.stage
    }
}

impl Children {
    /// Asks the supervisor to kill the hung worker with this pid (its whole process group);
    /// false if it is not ours.
    pub fn kill(&self, pid: u32) -> bool {
        match self.find(pid) {
            Some(child) => {
                child.killed_for.get_or_init(|| Killed::Hung);
                child.kill.cancel();
                true
            }
            None => false,
        }
    }

    /// The spawned worker that `pid` is, or runs under: the spawned pid itself, else the group
    /// `pid` belongs to (a process Corral spawned leads a group of its own). Looked up once a
    /// connection (each look may ask the kernel for the group).
    pub fn find(&self, pid: u32) -> Option<SpawnedWorker> {
        if pid == 0 {
            return None; // no process; and getpgid(0) would name the proxy's own group
        }
        if let Some(child) = self.lock().get(&pid) {
            return Some(child.clone());
        }
        let group = group::of(pid)?;
        self.lock().get(&group).cloned()
    }

    fn register(&self, pid: u32, gpu: Option<u32>, stage: &str) -> SpawnedWorker {
        let child = SpawnedWorker { gpu, stage: stage.into(), ..SpawnedWorker::default() };
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

/// What the supervisor tells of each worker exit, how it ended: a hook, so that the
/// supervisor needs nothing of the stage it tells.
#[derive(Clone)]
pub struct ExitHook(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for ExitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExitHook")
    }
}

/// Whether a spawned worker answered work, marked by its connection: its next restart, if it
/// exits, is without delay. A worker that exits right after writing its results may be reaped
/// before its connection has read them: that exit backs off as one that answered nothing.
#[derive(Clone, Default)]
pub struct Served(Arc<AtomicBool>);

impl Served {
    pub fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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
        let mut child = match start(&command, index).await {
            Ok(child) => child,
            Err(e) => {
                error!(stage = %command.stage, worker = index, command = ?command.argv, error = %e, restarts, "could not start worker");
                // Said where an exit is (`/readyz`) and counted as a restart when tried again:
                // a command that never starts had looked like a slow start, with no alert.
                (command.on_exit.0)(&format!("{} ({e})", crate::stage::FAILED_START));
                // Keep trying: the command may appear (a volume mounted late, say).
                if wait_or_stop(backoff, &stop).await {
                    return;
                }
                metrics().worker_restarts.inc();
                // Counted in the log's `restarts` too, as in the metric (the log had said
                // `restarts=0` after five failed starts).
                restarts += 1;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let pid = child.id().unwrap_or_default();
        group::register(pid);
        let gpu = placement::gpu_of(&command.gpus, command.workers_per_gpu, index);
        let registered = children.register(pid, gpu, &command.stage);
        match gpu {
            Some(gpu) => {
                info!(stage = %command.stage, worker = index, pid, gpu, restarts, "worker started")
            }
            None => info!(stage = %command.stage, worker = index, pid, restarts, "worker started"),
        }
        let status = tokio::select! {
            status = child.wait() => status.map(|s| s.to_string()),
            _ = registered.kill.cancelled() => {
                group::signal(pid, libc::SIGKILL);
                let why = registered.killed_for.get().copied().unwrap_or(Killed::Hung);
                if why == Killed::Lost {
                    warn!(stage = %command.stage, worker = index, pid, "killed a worker that lived on without its connection");
                }
                child.wait().await.map(|_| format!("killed: {}", why.why()))
            }
            _ = stop.cancelled() => {
                stop_child(&mut child, pid, &registered, index).await;
                group::finish(pid);
                children.forget(pid);
                return;
            }
        };
        group::finish(pid);
        children.forget(pid);
        restarts += 1;
        if started.elapsed() >= HEALTHY_RUN || registered.served.get() {
            backoff = FIRST_BACKOFF;
        }
        let restart_in_ms = backoff.as_millis() as u64;
        match &status {
            Ok(how) => (command.on_exit.0)(how),
            Err(e) => (command.on_exit.0)(&format!("an unknown status ({e})")),
        }
        match status {
            Ok(status) => {
                // With its pid, as the connection's "worker disconnected" line has: two workers
                // that failed together are told apart.
                warn!(stage = %command.stage, worker = index, pid, %status, restarts, restart_in_ms, "worker exited; restarting")
            }
            Err(e) => {
                warn!(stage = %command.stage, worker = index, pid, error = %e, restarts, restart_in_ms, "lost track of worker; restarting")
            }
        }
        if wait_or_stop(backoff, &stop).await {
            // The line above said "restarting": the stop came first (a worker killed as hung
            // during the drain, say), and the log had ended on a promise.
            info!(stage = %command.stage, worker = index, "worker not restarted: Corral is stopping");
            return;
        }
        // Counted once it happens: a stop during the backoff restarts nothing.
        metrics().worker_restarts.inc();
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn start(command: &WorkerCommand, index: u32) -> std::io::Result<Child> {
    let (program, args) = command.argv.split_first().expect("a worker command is never empty");
    let mut spawn = Command::new(program);
    spawn
        .args(args)
        .env("CORRAL_SOCKET", &command.socket)
        .env("CORRAL_STAGE", &command.stage)
        .env("CORRAL_WORKER_INDEX", index.to_string())
        .env("CORRAL_PROXY_PID", std::process::id().to_string())
        .env("CORRAL_LOG_FORMAT", output::format_name())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    group::configure(&mut spawn);
    if let Some(&cpu) = command.cpus.get(index as usize) {
        affinity::pin(&mut spawn, cpu);
    }
    let gpu = placement::gpu_of(&command.gpus, command.workers_per_gpu, index);
    if let Some(gpu) = gpu {
        spawn.env("CUDA_VISIBLE_DEVICES", gpu.to_string()).env("CORRAL_GPU", gpu.to_string());
    }
    // Last, so that a variable the user names (even CUDA_VISIBLE_DEVICES) is theirs.
    for (name, value) in &command.env {
        let value = placement::expand(value, index, gpu).unwrap_or_else(|_| value.clone());
        spawn.env(name, value);
    }
    let mut child = spawner::spawn(spawn).await?;
    let label = Arc::new(output::Whose {
        label: command.label(index),
        stage: command.stage.clone(),
        index,
    });
    if let Some(out) = child.stdout.take() {
        tokio::spawn(output::forward(out, label.clone(), false));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(output::forward(err, label, true));
    }
    Ok(child)
}

/// Sleeps for `delay` unless stopped first; true when stopped.
async fn wait_or_stop(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop.cancelled() => true,
    }
}

/// Lets a worker exit on its own after the proxy's `shutdown` message, then kills its group. A
/// worker that holds no connection (never connected, or lost it) gets no such message: it is
/// sent SIGTERM instead (one whose connection had ended waited the whole wait for a message it
/// could not get).
async fn stop_child(child: &mut Child, group: u32, worker: &SpawnedWorker, index: u32) {
    // The log names what the worker was told: one that never connected had been said to ignore
    // a `shutdown` it was never sent.
    let told = if worker.connections.load(Ordering::Relaxed) == 0 {
        group::signal(group, libc::SIGTERM);
        "SIGTERM"
    } else {
        "shutdown"
    };
    if tokio::time::timeout(STOP_WAIT, child.wait()).await.is_ok() {
        return;
    }
    warn!(
        stage = worker.stage(),
        worker = index,
        told,
        "worker did not exit when told to stop; killing it"
    );
    group::signal(group, libc::SIGKILL);
    if let Err(e) = child.wait().await {
        warn!(stage = worker.stage(), worker = index, error = %e, "could not stop worker");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lets the waits begun so far run to `past` their [`LOST_WAIT`].
    async fn after(past: Duration) {
        tokio::time::sleep(past).await;
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_left_without_its_connection_is_killed_once_the_wait_is_out() {
        let worker = SpawnedWorker::default();
        worker.connecting();
        let _served = worker.connected();
        worker.lost(true);
        after(LOST_WAIT - Duration::from_millis(1)).await;
        assert!(!worker.kill.is_cancelled(), "killed before its wait was out");
        after(Duration::from_millis(2)).await;
        assert!(worker.kill.is_cancelled());
        assert_eq!(worker.killed_for.get(), Some(&Killed::Lost));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_said_nothing_arms_nothing() {
        // A wrapper probing the socket before the worker it starts has loaded its model (which
        // would join minutes later) must not get it killed, at every restart.
        let worker = SpawnedWorker::default();
        worker.connecting();
        worker.lost(false);
        after(LOST_WAIT * 2).await;
        assert!(!worker.kill.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_refused_at_its_hello_that_lives_on_is_killed() {
        // Refused (another stage's, tensors in conflict) and not exiting: its stage had stayed
        // a worker short.
        let worker = SpawnedWorker::default();
        worker.connecting();
        worker.spoke();
        worker.lost(false);
        after(LOST_WAIT + Duration::from_millis(1)).await;
        assert!(worker.kill.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_opened_before_the_loss_keeps_the_worker() {
        // Its second connection, still in its handshake as the first ends, is a connection.
        let worker = SpawnedWorker::default();
        worker.connecting();
        let _served = worker.connected();
        worker.connecting();
        worker.lost(true);
        after(LOST_WAIT * 2).await;
        assert!(!worker.kill.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_within_the_wait_keeps_the_worker_even_before_its_hello() {
        let worker = SpawnedWorker::default();
        worker.connecting();
        let _served = worker.connected();
        worker.lost(true);
        after(LOST_WAIT - Duration::from_millis(100)).await;
        worker.connecting(); // its hello is still on its way when the wait is out
        after(Duration::from_millis(200)).await;
        assert!(!worker.kill.is_cancelled(), "killed while connecting again");
        // That connection ends without a hello: the worker is without one again, and killed
        // a wait after that.
        worker.lost(false);
        after(LOST_WAIT - Duration::from_millis(1)).await;
        assert!(!worker.kill.is_cancelled(), "the first loss's wait counted");
        after(Duration::from_millis(2)).await;
        assert!(worker.kill.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_holding_another_connection_is_kept() {
        let worker = SpawnedWorker::default();
        worker.connecting();
        worker.connecting();
        let (_one, _two) = (worker.connected(), worker.connected());
        worker.lost(true);
        after(LOST_WAIT * 2).await;
        assert!(!worker.kill.is_cancelled());
    }
}
