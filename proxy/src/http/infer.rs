//! A request's jobs through its route, whatever envelope they came in (native or a protocol's):
//! each payload checked against what one batch frame carries, the lot against the smallest
//! queue on the way, then the route's pipeline; a refusal at admission becomes its 503.

use corral_protocol::{JobId, Payload};
use tokio::time::Instant;

use super::error::ApiError;
use super::{shed_error, App, Route};
use crate::job::Outcome;
use crate::pipeline::Input;
use crate::timing;
use crate::traffic::Traffic;

/// Runs several payloads through the route as one request of several items: one job each,
/// admitted all or none, kept in one batch where they fit. Each payload must fit in a batch
/// frame and the lot in the smallest queue on the way (413 otherwise); a refusal at admission
/// is its 503. The outcomes come back in the payloads' order.
pub async fn run_items(
    app: &App,
    route: &Route,
    payloads: Vec<impl Into<Payload>>,
    deadline: Instant,
    traffic: Traffic,
) -> Result<Vec<Outcome>, ApiError> {
    check_item_count(route, payloads.len())?;
    let payloads: Vec<Payload> = payloads.into_iter().map(Into::into).collect();
    for payload in &payloads {
        check_payload_size(app, route, payload.len())?;
    }
    let jobs = payloads.into_iter().map(|payload| Input::new(JobId::new(), payload)).collect();
    run(app, route, jobs, deadline, traffic).await
}

/// Runs the jobs through the route's pipeline; a refusal at admission becomes its 503. The rows
/// answered with a result go in the request's timing, for the route's statistics.
pub async fn run(
    app: &App,
    route: &Route,
    jobs: Vec<Input>,
    deadline: Instant,
    traffic: Traffic,
) -> Result<Vec<Outcome>, ApiError> {
    let run = route.pipeline.run(jobs, deadline, app.retries, traffic).await;
    let done = run.as_ref().map_or(0, |outcomes| {
        outcomes.iter().filter(|outcome| matches!(outcome, Outcome::Done(..))).count()
    });
    // Counted in the route's statistics when the edge answers, whatever the envelope makes of
    // the outcomes.
    timing::rows_done(done);
    run.map_err(|shed| shed_error(shed, traffic.class))
}

/// A request of `count` items must fit in the smallest queue on its route's way (413). An
/// envelope checks this as soon as it knows the count, before it makes the items' payloads.
pub fn check_item_count(route: &Route, count: usize) -> Result<(), ApiError> {
    let capacity = route.pipeline.capacity();
    if count > capacity {
        return Err(ApiError::too_many_items(count, capacity));
    }
    Ok(())
}

/// A single payload (`size` bytes, with its media type where it is raw: [`Input::size`]) must fit
/// in one batch frame.
///
/// [`Input::size`]: crate::pipeline::Input::size
pub fn check_payload_size(app: &App, route: &Route, size: usize) -> Result<(), ApiError> {
    // A raw body's media type travels with it: counted, and said (the message had spoken of
    // the payload alone, refused 24 bytes under the limit it named).
    check_payload_size_said(app, route, size, |limit| {
        format!(
            "an item is larger than {limit} bytes once encoded as msgpack (with its media type, \
             for raw bytes)"
        )
    })
}

/// [`check_payload_size`], its 413 told in a protocol's own terms by `said(limit)`.
pub fn check_payload_size_said(
    app: &App,
    route: &Route,
    size: usize,
    said: impl FnOnce(usize) -> String,
) -> Result<(), ApiError> {
    let limit = route.pipeline.first().settings().max_job_bytes;
    if size <= limit {
        return Ok(());
    }
    Err(ApiError { message: said(limit), ..ApiError::body_too_large(app.max_body_bytes) })
}
