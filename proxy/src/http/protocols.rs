//! Client protocols: envelopes around rows. Each protocol — Corral's own ([`native`]) among
//! them — is a module that turns a request of its
//! shape into payloads, one per row, runs them as one request of several items (every row a job,
//! admitted together, kept in one batch where they fit, under the same deadline and timeout
//! headers as a native request), and turns the rows' outcomes back into its own answer and error
//! shape. Nothing here reaches into the request path's core: a protocol sees the body
//! ([`body::receive`](super::body::receive)), the outcomes
//! ([`infer::run_items`](super::infer::run_items)) and [`ApiError`], and decides only how they
//! are written.
//!
//! Their paths live under `/v1/` and `/v2/`, which no configured route may take, so that a
//! route's own path never shadows a protocol's.

pub mod kserve_v1;
pub mod native;
pub mod openai;
pub mod openapi;
pub mod v2;

use http::{Method, Request, Response};
use hyper::body::Incoming;

use super::error::ApiError;
use super::{App, Body, Protocol};
use crate::job::Outcome;

/// A request addressed to one of the protocols, found from its path alone.
pub enum Endpoint<'a> {
    KServe(kserve_v1::Endpoint<'a>),
    V2(v2::Endpoint<'a>),
    OpenAi(&'a super::Route),
    /// KServe v1's list of models, `GET /v1/models`.
    KServeModels,
    /// A path under a protocol's prefix that names none of its endpoints: 404 in that
    /// protocol's error shape, which its clients read (`/v2/`, `/v1/models/`).
    Unknown(String),
    /// Any other path under `/v1/` (OpenAI's API: `/v1/embeddings` where no route serves it,
    /// `/v1/chat/completions`): 404 in OpenAI's error shape, whose clients lost the message in
    /// Corral's.
    UnknownOpenAi(String),
}

impl<'a> Endpoint<'a> {
    pub fn find(app: &'a App, path: &str) -> Option<Endpoint<'a>> {
        if let Some(endpoint) = kserve_v1::Endpoint::find(app, path) {
            return Some(Endpoint::KServe(endpoint));
        }
        if let Some(endpoint) = v2::Endpoint::find(app, path) {
            return Some(Endpoint::V2(endpoint));
        }
        if path == kserve_v1::MODELS_PATH {
            return Some(Endpoint::KServeModels);
        }
        if path == openai::EMBEDDINGS_PATH {
            let route = app.routes.iter().find(|r| r.protocol == Some(Protocol::OpenAiEmbeddings));
            if let Some(route) = route {
                return Some(Endpoint::OpenAi(route));
            }
        }
        if path.starts_with("/v2/") || path.starts_with(kserve_v1::PREFIX) {
            return Some(Endpoint::Unknown(path.to_string()));
        }
        if path.starts_with("/v1/") {
            return Some(Endpoint::UnknownOpenAi(path.to_string()));
        }
        None
    }

    /// The route label its metrics go under: a fixed one per endpoint, so that no client can
    /// grow the label set (an unknown path's is the one native 404s go under).
    pub fn label(&self) -> &'static str {
        match self {
            Endpoint::KServe(endpoint) => endpoint.label(),
            Endpoint::V2(endpoint) => endpoint.label(),
            Endpoint::OpenAi(_) => openai::EMBEDDINGS_PATH,
            Endpoint::KServeModels => kserve_v1::MODELS_PATH,
            Endpoint::Unknown(_) | Endpoint::UnknownOpenAi(_) => "other",
        }
    }

    /// The fields the endpoint reads once, checked with its head ([`super::head::refusal`]):
    /// none where it reads no body.
    pub fn single_fields(&self) -> &'static [http::HeaderName] {
        static CONTENT_TYPE: [http::HeaderName; 1] = [http::header::CONTENT_TYPE];
        match self {
            Endpoint::V2(_) => &v2::SINGLE_FIELDS,
            Endpoint::KServe(_) | Endpoint::OpenAi(_) => &CONTENT_TYPE,
            _ => &[],
        }
    }

    /// `error`, found before the request was looked at (its head refused: too large, without
    /// one `Host`, a field given twice), in the protocol's own error shape: its clients read no
    /// other (openai's lost the message in Corral's).
    pub fn refuse(&self, error: &ApiError) -> Response<Body> {
        match self {
            Endpoint::OpenAi(_) | Endpoint::UnknownOpenAi(_) => openai::error_response(error),
            _ => plain_error_response(error),
        }
    }

    /// The answer, in the protocol's own shape whatever went wrong.
    pub async fn answer(
        self,
        app: &App,
        method: &Method,
        request: Request<Incoming>,
    ) -> Response<Body> {
        match self {
            Endpoint::KServe(endpoint) => endpoint.answer(app, method, request).await,
            Endpoint::V2(endpoint) => endpoint.answer(app, method, request).await,
            Endpoint::OpenAi(route) => {
                let answer = match app.admit(method, route) {
                    Ok(()) => openai::embeddings(app, route, request).await,
                    Err(error) => Err(error),
                };
                answer.unwrap_or_else(|e| openai::error_response(&e))
            }
            Endpoint::KServeModels => {
                let answer = super::get_only(method).map(|()| kserve_v1::models(app));
                answer.unwrap_or_else(|error| plain_error_response(&error))
            }
            Endpoint::Unknown(path) => plain_error_response(&ApiError::not_found(&path)),
            Endpoint::UnknownOpenAi(path) => {
                let mut error = ApiError::not_found(&path);
                if path == openai::EMBEDDINGS_PATH {
                    error.message = format!(
                        "no route serves {path} here: a route with `protocol = \"openai-embeddings\"` \
                         in the config file would"
                    );
                }
                openai::error_response(&error)
            }
        }
    }
}

/// A model's name as a path segment carries it: percent-decoded, as clients encode it
/// (tritonclient quotes the name); a segment that does not decode to UTF-8 is taken as it is.
fn model_name(segment: &str) -> String {
    super::percent_decoded(segment).map_or_else(|| segment.to_string(), |name| name.into_owned())
}

/// The first row that failed, as the request's error, its message naming the row (`row` says
/// what the protocol calls one: "instance", "input"). The protocols here have no per-row errors,
/// so one failed row fails the request; the other rows' work was done all the same.
fn first_failure(outcomes: &[Outcome], row: &str) -> Result<(), ApiError> {
    let Some((index, failed)) =
        outcomes.iter().enumerate().find(|(_, outcome)| !matches!(outcome, Outcome::Done(..)))
    else {
        return Ok(());
    };
    let error = ApiError::from_outcome(failed.clone());
    let message = format!("{row} {index}: {}", error.message);
    Err(ApiError { message, ..error })
}

/// `{"error": "<message>"}`: the error body of KServe v1 and of Open Inference Protocol v2,
/// with the headers every error answer carries.
fn plain_error_response(error: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(&serde_json::json!({"error": error.message}))
        .expect("a JSON object of strings always serializes");
    super::routes::error_response_with(error, body)
}

/// A model's readiness, as KServe v1 and v2 both answer it: `{"name", "ready"}`, 200 once every
/// stage of the route has a connected worker (and no shutdown has begun), else 503.
fn model_readiness(app: &App, route: &super::Route) -> Response<Body> {
    let ready = app.unready(route.pipeline.stages.iter()).is_none();
    let status = if ready { http::StatusCode::OK } else { http::StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({"name": route.model, "ready": ready}).to_string();
    super::routes::json(status, body)
}

/// Whether what a route's rows are, or its answers, is not known yet: its first or last stage
/// has neither declarations kept nor a worker connected (a worker that declares none takes plain
/// values, and says so by connecting). A protocol that writes its rows as the declared tensors,
/// or reads its answers from them, cannot turn a request into jobs before then.
fn declarations_unknown(route: &super::Route) -> bool {
    let stages = &route.pipeline.stages;
    stages.first().into_iter().chain(stages.last()).any(|stage| !stage.declarations_known())
}

/// 503 `not_ready` with `Retry-After: 1`: the model's first worker is still to connect (loading
/// its model at start), and then what a request becomes is known. Queued meanwhile, it would
/// reach a worker that declares tensors unchecked. (A request with a body says it before the
/// body is read: [`before_body`](super::body::before_body).)
fn not_ready_yet(message: String) -> ApiError {
    ApiError { retry_after: Some(1), ..ApiError::not_ready(message) }
}

/// 404 for a model name no route has, in every protocol's words.
fn unknown_model(name: &str) -> ApiError {
    ApiError { message: format!("no model named {name:?}"), ..ApiError::not_found(name) }
}
