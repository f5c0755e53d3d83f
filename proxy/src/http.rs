//! The HTTP edge: the server loop, the routes, and everything between a request and its job.

pub mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod infer;
pub mod items;
pub mod openapi;
pub mod routes;
pub mod server;
pub mod timeouts;
pub mod validate;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::pipeline::Pipeline;
use crate::stage::Stage;

/// What every request handler needs.
pub struct App {
    /// The routes jobs are posted to, each with its pipeline.
    pub routes: Vec<Route>,
    /// Every stage, once, whichever routes share it.
    pub stages: Vec<Arc<Stage>>,
    pub max_body_bytes: usize,
    /// Longest a request's body may take to arrive, from the request's start.
    pub body_read_timeout: Duration,
    /// Times a job may be retried on another worker when its worker dies with it.
    pub retries: u32,
    /// Set when shutdown begins: new jobs are answered 503 and readiness fails.
    pub draining: AtomicBool,
}

/// A path that takes jobs (`POST /infer` by default).
pub struct Route {
    /// The route's name in the config file, its operation id in `/openapi.json`.
    pub name: String,
    pub path: String,
    pub pipeline: Pipeline,
    /// Default and longest deadline of a job.
    pub timeout: Duration,
}

impl App {
    pub fn route(&self, path: &str) -> Option<&Route> {
        self.routes.iter().find(|route| route.path == path)
    }
}
