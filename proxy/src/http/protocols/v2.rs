//! Open Inference Protocol v2 (REST), served for every route under its model name (the route's
//! name in the config file, `default` for the default route) — what `tritonclient`, KServe's and
//! MLServer's clients speak:
//!
//! - `GET /v2/health/live`, `GET /v2/health/ready` (every stage has a worker), `GET /v2` (server
//!   metadata);
//! - `GET /v2/models/{name}` (model metadata: the tensors the workers declared, with the batch
//!   dimension as `-1`), `GET /v2/models/{name}/ready`, and Triton's model configuration
//!   extension, `GET /v2/models/{name}/config` ([`config`]: what tritonclient's
//!   `get_model_config` and the tools built on it read);
//! - Triton's statistics extension, `GET /v2/models/stats` and `GET /v2/models/{name}/stats`
//!   ([`statistics`]: tritonclient's `get_inference_statistics`). As in Triton,
//!   `/v2/models/stats` is the extension's, not the metadata of a model named so;
//! - the index of Triton's model repository extension, `POST /v2/repository/index` (tritonclient's
//!   `get_model_repository_index`): every model, `READY` or `UNAVAILABLE` as its readiness says
//!   (`{"ready": true}` asks for the ready ones). Models are loaded by their workers, not
//!   through the proxy: the extension's load and unload answer 404;
//! - `POST /v2/models/{name}/infer`: JSON tensors or the binary tensor extension
//!   ([`request`]); the first dimension is the batch, each row a job, and the rows' results are
//!   stacked back into tensors ([`response`]).
//!
//! `/versions/{version}` after the model name is accepted and ignored: a route has one version.
//! Errors are `{"error": "<message>"}` with the status a native request would get; v2 has no
//! per-row errors, so one failed row fails the request, its message naming the row.

pub mod request;
pub mod response;
pub mod result_row;
pub mod statistics;
pub mod tensor;

use bytes::Bytes;
use corral_protocol::TensorSpec;
use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::json;

use super::super::body::{self, Gap, Received};
use super::super::error::ApiError;
use super::super::infer;
use super::super::routes::json;
use super::super::{get_only, App, Body, Route};
use super::{
    declarations_unknown, first_failure, model_readiness, not_ready_yet, plain_error_response,
    unknown_model,
};
use crate::job::Outcome;

/// The binary tensor extension's header: how many bytes of the body are the JSON header.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The fields v2 reads once ([`super::super::head::refusal`]): where a binary request's JSON
/// header ends. (Its body is read whatever `Content-Type` says.)
pub static SINGLE_FIELDS: [http::HeaderName; 1] = [http::HeaderName::from_static(HEADER_LENGTH)];

/// What a request's rows may take beyond 4x its body (each row repeats the input names and a
/// tensor header, so many rows of little data weigh more than their body).
pub(super) const MIN_ROWS_ALLOWANCE: u128 = 1024 * 1024;

/// Which v2 endpoint a path names.
enum Kind {
    Live,
    Ready,
    Server,
    Model,
    ModelReady,
    Config,
    Statistics,
    /// Every model's statistics, `GET /v2/models/stats`.
    AllStatistics,
    /// The models, `POST /v2/repository/index`.
    RepositoryIndex,
    Infer,
}

pub struct Endpoint<'a> {
    kind: Kind,
    /// The model as the path names it (model endpoints).
    name: String,
    /// The route of that name, if there is one (404 otherwise).
    route: Option<&'a Route>,
}

impl<'a> Endpoint<'a> {
    pub fn find(app: &'a App, path: &str) -> Option<Endpoint<'a>> {
        let kind = match path {
            "/v2" => Kind::Server,
            "/v2/health/live" => Kind::Live,
            "/v2/health/ready" => Kind::Ready,
            "/v2/models/stats" => Kind::AllStatistics,
            "/v2/repository/index" => Kind::RepositoryIndex,
            _ => {
                let rest = path.strip_prefix("/v2/models/")?;
                let (name, rest) = rest.split_once('/').unwrap_or((rest, ""));
                // A version, if named, is ignored: each route is one version of its model.
                let rest = match rest.strip_prefix("versions/") {
                    Some(versioned) => versioned.split_once('/').map_or("", |(_, r)| r),
                    None => rest,
                };
                let kind = match rest {
                    "" => Kind::Model,
                    "ready" => Kind::ModelReady,
                    "config" => Kind::Config,
                    "stats" => Kind::Statistics,
                    "infer" => Kind::Infer,
                    _ => return None,
                };
                if name.is_empty() {
                    return None;
                }
                let name = super::model_name(name);
                let route = app.model(&name);
                return Some(Endpoint { kind, name, route });
            }
        };
        Some(Endpoint { kind, name: String::new(), route: None })
    }

    /// The route label its metrics go under.
    pub fn label(&self) -> &'static str {
        match self.kind {
            Kind::Live => "/v2/health/live",
            Kind::Ready => "/v2/health/ready",
            Kind::Server => "/v2",
            Kind::Model => "/v2/models/{name}",
            Kind::ModelReady => "/v2/models/{name}/ready",
            Kind::Config => "/v2/models/{name}/config",
            Kind::Statistics => "/v2/models/{name}/stats",
            Kind::AllStatistics => "/v2/models/stats",
            Kind::RepositoryIndex => "/v2/repository/index",
            Kind::Infer => "/v2/models/{name}/infer",
        }
    }

    pub async fn answer(
        self,
        app: &App,
        method: &Method,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let answer = match self.kind {
            Kind::Live => get_only(method).map(|()| live()),
            Kind::Ready => get_only(method).map(|()| server_ready(app)),
            Kind::Server => get_only(method).map(|()| server_metadata()),
            Kind::Model => self.model(method).and_then(metadata),
            Kind::ModelReady => self.model(method).map(|route| model_readiness(app, route)),
            Kind::Config => self.model(method).and_then(config),
            Kind::Statistics => {
                self.model(method).map(|route| stats(statistics::of(std::iter::once(route))))
            }
            Kind::AllStatistics => {
                get_only(method).map(|()| stats(statistics::of(app.routes.iter())))
            }
            Kind::RepositoryIndex => match *method {
                Method::POST => repository_index(app, request).await,
                _ => Err(ApiError::method_not_allowed(method, "POST")),
            },
            Kind::Infer => match self.route {
                None => Err(unknown_model(&self.name)),
                Some(route) => match app.admit(method, route) {
                    Ok(()) => infer(app, route, request).await,
                    Err(error) => Err(error),
                },
            },
        };
        answer.unwrap_or_else(|error| plain_error_response(&error))
    }

    /// The route of a model endpoint that answers `GET`.
    fn model(&self, method: &Method) -> Result<&'a Route, ApiError> {
        let route = self.route.ok_or_else(|| unknown_model(&self.name))?;
        get_only(method)?;
        Ok(route)
    }
}

fn live() -> Response<Body> {
    json(StatusCode::OK, r#"{"live":true}"#)
}

/// Ready as `/readyz` is: every stage has a connected worker, and no shutdown has begun.
fn server_ready(app: &App) -> Response<Body> {
    let ready = app.unready(app.stages.iter()).is_none();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    json(status, json!({"ready": ready}).to_string())
}

fn server_metadata() -> Response<Body> {
    let body = json!({
        "name": "corral",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"],
    });
    json(StatusCode::OK, body.to_string())
}

fn stats(body: serde_json::Value) -> Response<Body> {
    json(StatusCode::OK, body.to_string())
}

/// The largest repository index request read: `{"ready": true}` and room to spare.
const INDEX_REQUEST_BYTES: usize = 4096;

/// Every model with its state, as Triton's repository index lists them: `READY` once every
/// stage of its route has a worker (and no shutdown has begun), else `UNAVAILABLE` with the
/// reason `/readyz` gives. A body of `{"ready": true}` asks for the ready ones only; an empty
/// body (what tritonclient sends) for all.
async fn repository_index(
    app: &App,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let bytes = body::read_small(app, request, INDEX_REQUEST_BYTES).await?;
    let ready_only = if bytes.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        let asked: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
        if !asked.is_object() {
            let message = "the body must be a JSON object, such as {\"ready\": true}";
            return Err(ApiError::bad_request(message));
        }
        match asked.get("ready") {
            None => false,
            Some(serde_json::Value::Bool(ready)) => *ready,
            Some(_) => return Err(ApiError::bad_request("\"ready\" must be true or false")),
        }
    };
    let models: Vec<serde_json::Value> = app
        .routes
        .iter()
        .filter_map(|route| {
            let unready = app.unready(route.pipeline.stages.iter());
            match unready {
                None => Some(json!({"name": route.model, "version": "1", "state": "READY"})),
                Some(_) if ready_only => None,
                Some(reason) => Some(json!({"name": route.model, "version": "1",
                    "state": "UNAVAILABLE", "reason": reason})),
            }
        })
        .collect();
    Ok(json(StatusCode::OK, serde_json::Value::from(models).to_string()))
}

/// The tensors the route's first stage takes and its last stage gives, as their workers declared
/// them, each shape led by the batch dimension, `-1`. Before a worker of either stage has
/// connected they are not known: 503, where empty lists would say the model has no tensors (and
/// a client may cache that). A worker that declares none gives empty lists.
fn metadata(route: &Route) -> Result<Response<Body>, ApiError> {
    if let Some(message) = not_declared_yet(route) {
        return Err(not_ready_yet(message));
    }
    let declared = route.pipeline.declared_ends();
    let tensors = |specs: &[TensorSpec]| {
        specs
            .iter()
            .map(|spec| {
                let shape: Vec<i64> =
                    std::iter::once(-1).chain(spec.shape.iter().copied()).collect();
                json!({"name": spec.name, "datatype": spec.datatype, "shape": shape})
            })
            .collect::<Vec<_>>()
    };
    let body = json!({
        "name": route.model,
        "versions": ["1"],
        "platform": "corral",
        "inputs": tensors(declared.inputs()),
        "outputs": tensors(declared.outputs()),
    });
    Ok(json(StatusCode::OK, body.to_string()))
}

/// The route's model configuration in Triton's form (its `ModelConfig` as JSON): the declared
/// tensors as `input` and `output`, each `dims` one row's shape (the batch dimension left out, as
/// Triton leaves it out wherever `max_batch_size` is above 0), `data_type` as Triton names it
/// (`TYPE_FP32`; `BYTES` is `TYPE_STRING`), and the first stage's batch bound (its workers' own
/// `max_batch` where every one takes fewer): a client that sizes its requests by
/// `max_batch_size` (as Triton's own examples do) fills one batch a request. Larger requests
/// are still served, cut across batches. 503 before the tensors are known, as the metadata is.
fn config(route: &Route) -> Result<Response<Body>, ApiError> {
    if let Some(message) = not_declared_yet(route) {
        return Err(not_ready_yet(message));
    }
    let declared = route.pipeline.declared_ends();
    let tensors = |specs: &[TensorSpec], input: bool| {
        specs
            .iter()
            .map(|spec| {
                let data_type = match spec.datatype.as_str() {
                    "BYTES" => "TYPE_STRING".to_string(),
                    other => format!("TYPE_{other}"),
                };
                let mut tensor =
                    json!({"name": spec.name, "data_type": data_type, "dims": spec.shape});
                if input {
                    tensor["format"] = json!("FORMAT_NONE");
                }
                tensor
            })
            .collect::<Vec<_>>()
    };
    let first = route.pipeline.stages.first().expect("a pipeline has a stage");
    // What one batch takes now: a worker bounding its batches lower (`max_batch`) makes a
    // request of the stage's bound several batches.
    let max_batch_size = first.batch_bound();
    // (A `max_wait_ms` near u64's end is past u64's microseconds: JSON numbers stop there.)
    let delay_us = first.settings().max_wait.as_micros();
    let delay_us = u64::try_from(delay_us).unwrap_or(u64::MAX);
    let body = json!({
        "name": route.model,
        "platform": "corral",
        "backend": "corral",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": tensors(declared.inputs(), true),
        "output": tensors(declared.outputs(), false),
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
    });
    Ok(json(StatusCode::OK, body.to_string()))
}

/// Why the route's tensors are not known yet, if they are not ([`declarations_unknown`]).
fn not_declared_yet(route: &Route) -> Option<String> {
    declarations_unknown(route).then(|| {
        format!(
            "model {:?} has no metadata yet: its workers declare its tensors when they connect",
            route.model
        )
    })
}

async fn infer(
    app: &App,
    route: &Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let header_length = match request.headers().get(HEADER_LENGTH) {
        None => None,
        Some(value) => Some(
            value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()).ok_or_else(|| {
                let message = "Inference-Header-Content-Length must be a whole number";
                body::before_body(ApiError::bad_request(message))
            })?,
        ),
    };
    // With nothing declared yet and no worker connected (a model still loading at start), the
    // inputs cannot be checked: queued, a row of the wrong shape failed its batch-mates' rows
    // (a worker stacking them), and one of the wrong datatype was served. Not ready yet, as
    // the metadata says then, and KServe v1's predict.
    // (A body it could never take is told so first: retrying would not help it.)
    body::check_encoding(request.headers()).map_err(body::before_body)?;
    if let Some(message) = not_declared_yet(route) {
        return Err(body::before_body(not_ready_yet(message)));
    }
    // A binary request keeps room after its header for a one-row payload's head, where it is
    // read into shared memory (`body::Buffer::for_body` leaves none elsewhere).
    let room = request::HEAD_ROOM;
    let content_type = request.headers().get(http::header::CONTENT_TYPE).cloned();
    let (received, room) = match header_length {
        Some(at) => {
            let gap = Gap { at, len: room, fill: request::single_row_head };
            body::receive_with_gap(app, route, request, gap).await?
        }
        _ => (body::receive(app, route, request).await?, 0),
    };
    let Received { body, arrived, deadline, traffic } = received;
    let declared = route.pipeline.declared_ends();
    let outputs = declared.outputs();
    let mut parsed =
        request::parse(&body, header_length, room, declared.inputs()).map_err(|refused| {
            // 415 for a header in another encoding its `charset` names, as on every route.
            let json = &body[..header_length.unwrap_or(body.len()).min(body.len())];
            ApiError::or_charset(ApiError::bad_request(refused), content_type.as_ref(), json)
        })?;
    if !outputs.is_empty() {
        response::check_requested(&parsed, outputs.iter().map(|s| s.name.as_str()))?;
    }
    // Bounds checked before the rows are built, not after: a request of a few bytes may
    // describe millions of empty rows, or repeat a long name in each.
    let capacity = route.pipeline.capacity();
    if parsed.rows > capacity {
        return Err(ApiError::too_many_items(parsed.rows, capacity));
    }
    let cut = parsed.payload_bytes();
    let allowed = 4 * body.len() as u128 + MIN_ROWS_ALLOWANCE;
    if cut > allowed {
        let message = format!(
            "cut into rows, the request would take {cut} bytes, more than 4x its body plus 1 MiB: \
             send fewer rows or shorter names"
        );
        return Err(ApiError { message, ..ApiError::body_too_large(app.max_body_bytes) });
    }
    // The rows share the body's binary data (no copy): it stays in memory until they are done.
    let mut payloads = parsed.payloads();
    drop(body);
    // A row past a job's size, told in a v2 client's terms (the shared check speaks of items
    // encoded as msgpack, which a tritonclient user never sends).
    for (row, payload) in payloads.iter().enumerate() {
        infer::check_payload_size_said(app, route, payload.len(), |limit| {
            format!(
                "row {row} of the inputs takes {} bytes as its worker is sent it, more than one \
                 row may ({limit}: what the worker protocol's 64 MiB frame carries of it): send \
                 fewer elements per row, in more rows of the batch dimension",
                payload.len()
            )
        })?;
    }
    // A large row not in one piece of the shared memory (several rows or inputs, or a body that
    // did not go there) is gathered into a slot of its own, here on the request's task, so that
    // a worker that maps the memory reads it there; the body is freed once every row is.
    if let Some(memory) = &app.shared_memory {
        for payload in &mut payloads {
            if let Some(gathered) = memory.gather(payload) {
                *payload = gathered;
            }
        }
    }
    // Triton's `timeout` parameter tightens the deadline as a shorter deadline header would;
    // one past the clock's range sets none. The request's whole time with it: admission keeps
    // 5% of that as its margin, and 5% of the route's 5 s (250 ms) had refused every 200 ms
    // timeout on an idle stage, which the same deadline as a header got served.
    let mut traffic = traffic;
    traffic.tensors = Some(declared.epoch);
    let deadline = match parsed.timeout.and_then(|timeout| arrived.checked_add(timeout)) {
        Some(shorter) if shorter < deadline => {
            traffic.budget = traffic.budget.map(|budget| budget.min(shorter - arrived));
            shorter
        }
        _ => deadline,
    };
    let outcomes = infer::run_items(app, route, payloads, deadline, traffic).await?;
    first_failure(&outcomes, "row")?;
    let results: Vec<&[u8]> = outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Done(data, _) => &data[..],
            _ => unreachable!("first_failure passed only if every row is done"),
        })
        .collect();
    let answer = response::build(&route.model, &parsed, outputs, &results)?;
    let mut builder = Response::builder().status(StatusCode::OK);
    builder = match answer.header_length {
        Some(length) => {
            builder.header(CONTENT_TYPE, "application/octet-stream").header(HEADER_LENGTH, length)
        }
        None => builder.header(CONTENT_TYPE, "application/json"),
    };
    Ok(builder
        .body(Full::new(Bytes::from(answer.body)).boxed_unsync())
        .expect("static headers are valid"))
}
