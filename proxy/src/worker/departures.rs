//! Jobs whose client stopped waiting while a worker holds them: the connection watches each held
//! job's `left` token and tells a worker that declared `cancel` (PROTOCOL.md), so that it can stop
//! computing what nobody will read.

use corral_protocol::JobId;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::job::Job;

/// The held jobs being watched; empty (and costing nothing) for a worker without `cancel`.
pub struct Departures {
    enabled: bool,
    watching: FuturesUnordered<BoxFuture<'static, Option<JobId>>>,
}

impl Departures {
    pub fn new(enabled: bool) -> Self {
        Self { enabled, watching: FuturesUnordered::new() }
    }

    /// Starts watching a job the worker now holds, until its batch is `done` (answered): the
    /// client of every answered job stops waiting, and each of those departures had the
    /// connection look through every job it held (a batch of 4,096 answered, 4,096 looks
    /// through the 4,096 sent ahead: a third of the throughput).
    pub fn watch(&mut self, job: &Job, done: &CancellationToken) {
        if self.enabled {
            let (left, done, id) = (job.left.clone(), done.clone(), job.id);
            let departed = async move {
                tokio::select! {
                    biased;
                    _ = done.cancelled_owned() => None,
                    _ = left.cancelled_owned() => Some(id),
                }
            };
            self.watching.push(departed.boxed());
        }
    }

    /// The next job whose client stopped waiting while its batch was held (it may have been
    /// answered meanwhile: the caller checks that it still holds it). Never completes while
    /// nothing is watched.
    pub async fn next(&mut self) -> JobId {
        loop {
            match self.watching.next().await {
                Some(Some(id)) => return id,
                Some(None) => continue,
                None => std::future::pending().await,
            }
        }
    }
}
