//! Jobs whose client stopped waiting while a worker holds them: the connection watches each held
//! job's `left` token and tells a worker that declared `cancel` (PROTOCOL.md), so that it can stop
//! computing what nobody will read.

use corral_protocol::JobId;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};

use crate::job::Job;

/// The held jobs being watched; empty (and costing nothing) for a worker without `cancel`.
pub struct Departures {
    enabled: bool,
    watching: FuturesUnordered<BoxFuture<'static, JobId>>,
}

impl Departures {
    pub fn new(enabled: bool) -> Self {
        Self { enabled, watching: FuturesUnordered::new() }
    }

    /// Starts watching a job the worker now holds.
    pub fn watch(&mut self, job: &Job) {
        if self.enabled {
            let (left, id) = (job.left.clone(), job.id);
            self.watching
                .push(async move { left.cancelled_owned().await }.map(move |_| id).boxed());
        }
    }

    /// The next job whose client stopped waiting (it may have been answered meanwhile: the
    /// caller checks that it still holds it). Never completes while nothing is watched.
    pub async fn next(&mut self) -> JobId {
        match self.watching.next().await {
            Some(id) => id,
            None => std::future::pending().await,
        }
    }
}
