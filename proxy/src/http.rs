//! The HTTP edge: the server loop, the routes, and everything between a request and its job.

pub mod error;
pub mod format;
pub mod infer;
pub mod items;
pub mod openapi;
pub mod routes;
pub mod server;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::stage::Stage;

/// What every request handler needs.
pub struct App {
    pub stage: Arc<Stage>,
    pub max_body_bytes: usize,
    /// Default and longest deadline of a job.
    pub timeout: Duration,
    /// Times a job may be retried on another worker when its worker dies with it.
    pub retries: u32,
    /// Set when shutdown begins: new jobs are answered 503 and readiness fails.
    pub draining: AtomicBool,
}
