//! KServe's v1 prediction protocol, served for every route under its model name (the route's
//! name in the config file, `default` for the default route):
//!
//! - `POST /v1/models/{name}:predict` with `{"instances": [...]}` answers `{"predictions": [...]}`,
//!   each instance a job (as the elements of a native request of several items are);
//! - `GET /v1/models/{name}` answers `{"name", "ready"}`: 200 once every stage of the route has a
//!   connected worker, else 503;
//! - `GET /v1/models` lists them: `{"models": [...]}`.
//!
//! Errors are `{"error": "<message>"}` with the status a native request would get; a failed
//! instance fails the request (v1 has no per-instance errors) and the message names its index.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::super::body::{self, Received};
use super::super::error::ApiError;
use super::super::format::{self, Format};
use super::super::infer;
use super::super::routes::json;
use super::super::{get_only, items, App, Body, Route};
use super::{first_failure, model_readiness, plain_error_response, unknown_model};
use crate::job::Outcome;

pub const PREFIX: &str = "/v1/models/";
/// KServe v1's list of the models served.
pub const MODELS_PATH: &str = "/v1/models";
const PREDICT: &str = ":predict";

pub struct Endpoint<'a> {
    /// The model as the path names it.
    name: String,
    /// The route of that name, if there is one (404 otherwise).
    route: Option<&'a Route>,
    predict: bool,
}

impl<'a> Endpoint<'a> {
    pub fn find(app: &'a App, path: &str) -> Option<Endpoint<'a>> {
        let rest = path.strip_prefix(PREFIX)?;
        let (name, predict) = match rest.strip_suffix(PREDICT) {
            Some(name) => (name, true),
            None => (rest, false),
        };
        if name.is_empty() || name.contains(['/', ':']) {
            return None;
        }
        let name = super::model_name(name);
        let route = app.model(&name);
        Some(Endpoint { name, route, predict })
    }

    pub async fn answer(
        self,
        app: &App,
        method: &Method,
        request: Request<Incoming>,
    ) -> (&'static str, Response<Body>) {
        let label = if self.predict { "/v1/models/{name}:predict" } else { "/v1/models/{name}" };
        let answer = match self.route {
            None => Err(unknown_model(&self.name)),
            Some(route) if self.predict => match app.admit(method) {
                Ok(()) => predict(app, route, request).await,
                Err(error) => Err(error),
            },
            Some(route) => get_only(method).map(|()| model_readiness(app, route)),
        };
        (label, answer.unwrap_or_else(|error| plain_error_response(&error)))
    }
}

const NO_INSTANCES: &str = r#"the body must be a JSON object with an "instances" array"#;

async fn predict(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let input = body::request_format(request.headers()).map_err(body::before_body)?;
    let Received { body, arrived, deadline, traffic } = body::receive(app, route, request).await?;
    let payload = format::to_msgpack(input, body).map_err(ApiError::bad_request)?;
    let instances = items::field(&payload, "instances")
        .ok()
        .flatten()
        .ok_or_else(|| ApiError::bad_request(NO_INSTANCES))?;
    if let Some(count) = items::declared_len(&instances) {
        infer::check_item_count(route, count)?;
    }
    let rows = items::split(&instances).map_err(|_| ApiError::bad_request(NO_INSTANCES))?;
    if rows.is_empty() {
        return Err(ApiError::bad_request(r#""instances" is empty"#));
    }
    let outcomes = infer::run_items(app, route, rows, arrived, deadline, traffic).await?;
    Ok(json(StatusCode::OK, predictions(outcomes)?))
}

/// The instances' outcomes as v1's JSON answer, `{"predictions": [...]}`, or the first failure.
pub(crate) fn predictions(outcomes: Vec<Outcome>) -> Result<Bytes, ApiError> {
    first_failure(&outcomes, "instance")?;
    let predictions = items::assemble(outcomes, Format::Msgpack)?;
    // A one-entry map around the results' array, which is copied once, into the JSON.
    let mut data = Vec::with_capacity(16);
    rmp::encode::write_map_len(&mut data, 1).expect("writing to a Vec cannot fail");
    rmp::encode::write_str(&mut data, "predictions").expect("writing to a Vec cannot fail");
    let data = Bytes::from([&data[..], &predictions[..]].concat());
    format::from_msgpack(Format::Json, data).map_err(|e| {
        // One conversion for the whole answer; only when it fails are the instances looked at
        // one by one, for the message to name the first that JSON cannot carry (v1 answers in
        // JSON whatever the client accepts: no other format to offer).
        let bad = |row: Bytes| format::from_msgpack(Format::Json, row).is_err();
        let index = items::split(&predictions).ok().and_then(|rows| rows.into_iter().position(bad));
        let message = match index {
            Some(index) => format!("instance {index}: {e}"),
            None => e.to_string(),
        };
        e.into_error_saying(message)
    })
}

/// `{"models": [...]}`: the model names, one per route, as KServe v1's list answers them.
pub fn models(app: &App) -> Response<Body> {
    let names: Vec<&str> = app.routes.iter().map(|route| route.model.as_str()).collect();
    json(StatusCode::OK, serde_json::json!({ "models": names }).to_string())
}
