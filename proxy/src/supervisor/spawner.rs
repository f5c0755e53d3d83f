//! Worker processes are spawned from one thread that lives as long as the proxy.
//!
//! Linux sends the parent-death signal ([`super::group`]) when the *thread* that forked the child
//! exits, not the process. Spawning from a tokio task would fork from whichever runtime thread
//! runs it, and a runtime thread may end while the proxy goes on (a blocking-pool thread after
//! its idle timeout, a worker thread handed off by `block_in_place`), killing healthy workers
//! for no reason. This thread is started on first use and never returns (its channel's sender
//! is never dropped), so the signal comes only when the proxy itself is gone.

use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::process::{Child, Command};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

struct Request {
    command: Command,
    runtime: Handle,
    reply: oneshot::Sender<std::io::Result<Child>>,
}

static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

/// Spawns `command` from the spawner thread, registered with the caller's runtime (its pipes
/// and exit status are watched there, as if it had been spawned here).
pub async fn spawn(command: Command) -> std::io::Result<Child> {
    let (reply, answer) = oneshot::channel();
    let request = Request { command, runtime: Handle::current(), reply };
    SPAWNER.get_or_init(start).send(request).map_err(|_| gone())?;
    answer.await.map_err(|_| gone())?
}

fn start() -> mpsc::Sender<Request> {
    let (requests, incoming) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("corral-spawner".into())
        .spawn(move || {
            for mut request in incoming {
                let _runtime = request.runtime.enter();
                let _ = request.reply.send(request.command.spawn());
            }
        })
        .expect("can start the worker spawner thread");
    requests
}

fn gone() -> std::io::Error {
    std::io::Error::other("the worker spawner thread is gone")
}
