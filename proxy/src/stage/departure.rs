//! A request leaving a stage: the [`Departure`] its wait holds, and the purge it asks for when
//! the wait is dropped unanswered (its client left), so that the jobs it left behind leave the
//! queue at once and count as cancelled, not as expired once their deadline comes. The same
//! purge takes jobs answered 408 while still queued (`pipeline::run_stage`, and a stream's
//! first-chunk deadline), counted then as expired.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Stage;

/// Shortest time between two sweeps of the whole queue for dead jobs.
pub(super) const PURGE_EVERY: Duration = Duration::from_millis(10);

impl Stage {
    /// Clears out jobs whose clients left or whose deadline passed: called when a request's
    /// wait is dropped unanswered (its client left, [`Departure`]), so that its jobs leave the
    /// queue, and its depth, at once and count as cancelled, not as expired once their deadline
    /// comes; and when a wait answered queued jobs 408, so that they leave it then. At most once every [`PURGE_EVERY`], so that a burst of departures does not scan a
    /// long queue once each: within it, one more purge is set for when the limit allows, and
    /// takes every job left behind meanwhile.
    pub fn purge(self: &Arc<Self>) {
        let now = Instant::now();
        let mut queue = self.lock();
        let due = queue.last_purge.map_or(now, |last| last + PURGE_EVERY);
        if now >= due {
            self.clear_dead(&mut queue, now, true);
            queue.last_purge = Some(now);
            return;
        }
        if queue.purge_pending {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        queue.purge_pending = true;
        let stage = Arc::clone(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(due).await;
            stage.lock().purge_pending = false;
            stage.purge();
        });
    }
}

/// A request's wait for its jobs on a stage, from admission until it ends: dropped before it
/// ended (its client left, and hyper dropped the handler), the stage purges the jobs left
/// behind ([`Stage::purge`]). It must drop after the jobs' receivers, so that the purge finds
/// the jobs abandoned: `pipeline::Queued` declares it after them, and its callers drop the
/// receivers they move out before it.
pub struct Departure<'a> {
    stage: Option<&'a Arc<Stage>>,
}

impl<'a> Departure<'a> {
    pub fn new(stage: &'a Arc<Stage>) -> Self {
        Self { stage: Some(stage) }
    }

    /// The wait ended (answered, expired, or its jobs were never admitted): nothing to purge.
    pub fn ended(&mut self) {
        self.stage = None;
    }
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        if let Some(stage) = self.stage {
            stage.purge();
        }
    }
}
