//! `GET /openapi.json`: an OpenAPI 3.1 description of this proxy, built from what the workers
//! declared (their JSON Schemas arrive in the handshake) and from the answers Corral itself can
//! give; built again only when a stage's declarations changed ([`Built`]), since a worker's
//! schema may be megabytes and the document several times that.
//!  Without declared schemas, requests and results are any JSON value. A route
//! also takes raw bytes of any other media type, and answers raw bytes to a client that accepts
//! them: both are listed as `application/octet-stream` and `*/*`. The workers' schema components
//! are named apart where they would collide, and respelled where OpenAPI does not allow their
//! names ([`components`]).

mod components;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::deadline::{ENVOY_HEADER, GRPC_HEADER, REQUEST_TIMEOUT_HEADER};
use super::protocols::native::{ITEMS_HEADER, TIMEOUT_HEADER};
use super::routes::REQUEST_ID_HEADER;
use super::traffic;
use super::{App, Route};
use crate::stage::{Declared, Stage};
use crate::timing::{BATCH_SIZE_HEADER, SERVER_TIMING_HEADER};
use components::Schemas;

/// Corral's own component: the error body of its native answers.
const ERROR: &str = "Error";

/// The document as last built, and the declarations (each stage's, by identity) it was built
/// from: a stage's declarations are replaced, never changed in place, so the same `Arc`s mean
/// the same document.
#[derive(Default)]
pub struct Built {
    from: Vec<Option<Arc<Declared>>>,
    body: Bytes,
}

/// The document's JSON, from the last build while no stage's declarations changed.
pub fn body(app: &App) -> Bytes {
    let now: Vec<Option<Arc<Declared>>> = app.stages.iter().map(|stage| stage.declared()).collect();
    let same = |built: &Built| {
        built.from.len() == now.len()
            && built.from.iter().zip(&now).all(|(was, is)| match (was, is) {
                (Some(was), Some(is)) => Arc::ptr_eq(was, is),
                (None, None) => true,
                _ => false,
            })
    };
    let mut built = app.openapi.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(built) = built.as_ref().filter(|built| same(built)) {
        return built.body.clone();
    }
    let body = Bytes::from(serde_json::to_vec(&document(app)).expect("JSON values encode"));
    *built = Some(Built { from: now, body: body.clone() });
    body
}

/// Every error status a route (`/infer`) can answer, with what it means.
const INFER_ERRORS: &[(&str, &str)] = &[
    ("400", "Malformed body or header (`bad_request`)."),
    ("405", "The route takes POST only (`method_not_allowed`); see Allow."),
    (
        "406",
        "Accept allows neither JSON nor msgpack, nor (for an output of raw bytes) \
         application/octet-stream or the output's media type (`not_acceptable`); before the job \
         runs unless Accept names another type, which a raw output may have.",
    ),
    (
        "408",
        "The deadline passed, queued or in the worker, or the worker skipped the job as one \
         its deadline would pass before it was done (`deadline_exceeded`); or the body did not \
         arrive in time (`body_timeout`).",
    ),
    ("413", "Body or item too large, or too many items (`body_too_large`, `too_many_items`)."),
    (
        "415",
        "Content-Type is a form (application/x-www-form-urlencoded: send JSON with its type) \
         or not a media type, a JSON body that does not read as UTF-8 names another charset, \
         or the body is compressed (Content-Encoding other than identity; see Accept-Encoding) \
         (`unsupported_media_type`).",
    ),
    ("422", "The worker rejected this input (`invalid_input`)."),
    (
        "431",
        "The request head (request line and headers) is over --max-header-bytes \
         (`request_head_too_large`). A head past the HTTP layer's read buffer (the power of two \
         at or above that bound, 8 KiB at least), or over --max-headers, is answered 431 by \
         the HTTP layer itself, without a body.",
    ),
    (
        "500",
        "The worker failed (`worker_error`, `worker_died`), or its output for this job is not \
         one well-formed msgpack value (`bad_output`) or has no JSON form \
         (`unrepresentable_output`).",
    ),
    (
        "503",
        "Shed: `queue_full`, `deadline_unreachable`, `tenant_quota`, `preempted` (evicted for a \
         higher priority class) or `shutting_down`; or the connection is over \
         --max-connections (`too_many_connections`, and it is closed); see Retry-After.",
    ),
];

pub fn document(app: &App) -> Value {
    // The stages whose schemas describe a route: the first stage's request, the last's response.
    let ends = |stage: &Stage| {
        app.routes.iter().any(|route| {
            let stages = &route.pipeline.stages;
            [stages.first(), stages.last()]
                .into_iter()
                .flatten()
                .any(|end| end.name() == stage.name())
        })
    };
    let declared: Vec<(&str, Arc<Declared>)> = app
        .stages
        .iter()
        .filter(|stage| ends(stage))
        .filter_map(|stage| Some((stage.name(), stage.declared()?)))
        .collect();
    let named = components::name(declared.iter().map(|(stage, d)| (*stage, &**d)), &[ERROR]);
    let mut paths = Map::new();
    for route in &app.routes {
        let operation = route_operation(app, route, &named.stages);
        paths.insert(route.path.clone(), json!({"post": operation}));
    }
    let mut components = named.components;
    components.insert(ERROR.into(), error_schema());
    paths.extend(super::protocols::openapi::paths(app));
    paths.insert(
        "/healthz".into(),
        json!({"get": plain_get("healthz", "The process serves.", false)}),
    );
    paths.insert(
        "/readyz".into(),
        json!({"get": plain_get("readyz", "Every stage has a warmed-up worker.", true)}),
    );
    // Their 405 and 431 as every page of Corral's own answers them (they had only a 200).
    let metrics = json!({
        "description": "Prometheus text exposition format.",
        "headers": request_id_header(),
        "content": {"text/plain": {"schema": {"type": "string"}}},
    });
    paths.insert(
        "/metrics".into(),
        json!({"get": own_get("metrics", "Prometheus metrics.", metrics, false)}),
    );
    let openapi = json!({
        "description": "OpenAPI 3.1.",
        "headers": request_id_header(),
        "content": {"application/json": {"schema": {"type": "object"}}},
    });
    paths.insert(
        "/openapi.json".into(),
        json!({"get": own_get("openapi", "This document.", openapi, false)}),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Corral",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A batching proxy in front of a model: each request is a job, \
                answered with its result or a JSON error body.",
        },
        "paths": paths,
        "components": {"schemas": components},
    })
}

/// A route's POST operation: its request is what the pipeline's first stage takes, its result
/// what the last stage gives (as their workers declared, each stage's `$ref`s pointing at the
/// names its components have in the document; any JSON value otherwise).
fn route_operation(app: &App, route: &Route, schemas: &HashMap<String, Schemas>) -> Value {
    let stages = &route.pipeline.stages;
    let declared = |stage: Option<&Arc<Stage>>| schemas.get(stage?.name());
    let any = json!({});
    let input = declared(stages.first()).and_then(|s| s.input.clone());
    let output = declared(stages.last()).and_then(|s| s.output.clone());
    // A streaming worker's schema is a chunk's: a one-shot client gets the array of them (one
    // per item, with x-corral-items: many), or the `ok` result's data as it is where the job
    // sent no chunk. Documented as one result, real answers failed it.
    let chunks = declared(stages.last()).is_some_and(|s| s.chunks);
    let output = match output {
        Some(chunk) if chunks => Some(json!({"anyOf": [{"type": "array", "items": chunk}, chunk]})),
        output => output,
    };
    let (input, output) = (input.unwrap_or_else(|| any.clone()), output.unwrap_or(any));

    let body = |one: &Value| json!({"anyOf": [one, {"type": "array", "items": one}]});
    // Raw bytes: any media type but JSON and msgpack, one job each, in and out.
    let bytes = json!({"schema": {"type": "string", "format": "binary"}});
    let formats = |schema: Value| {
        json!({
            "application/json": {"schema": schema.clone()},
            "application/msgpack": {"schema": schema},
            "application/octet-stream": bytes.clone(),
            "*/*": bytes.clone(),
        })
    };
    let mut content = formats(body(&output));
    // A client whose Accept asks for a stream gets the worker's chunks as they come.
    let events = json!({"schema": {"type": "string"}});
    content["text/event-stream"] = events.clone();
    content["application/x-ndjson"] = events;
    let mut responses = Map::new();
    responses.insert(
        "200".into(),
        json!({
            "description": "The worker's result (an array of results for a multi-item request; \
                a streaming worker's result is the array of its chunks, or its ok data where it \
                sent none). \
                An output of raw bytes goes to a client that accepts them (Accept naming \
                application/octet-stream or the worker's media type, or a raw request's Accept \
                absent or */*) as the body, with that media type. With Accept: \
                text/event-stream (or application/x-ndjson), the job's chunks as they come, \
                then a done (or error) event.",
            "headers": answer_headers(),
            "content": content,
        }),
    );
    for (status, description) in INFER_ERRORS {
        responses
            .insert((*status).into(), error_response(description, infer_error_headers(status)));
    }
    let names: Vec<&str> = stages.iter().map(|stage| stage.name()).collect();
    let summary = if names.len() == 1 {
        "Run one job (or one per element, with x-corral-items: many).".to_string()
    } else {
        format!(
            "Run one job (or one per element, with x-corral-items: many) through stages {}.",
            names.join(" → ")
        )
    };
    let mut parameters = vec![
        timeout_header(),
        json!({
            "name": ITEMS_HEADER,
            "in": "header",
            "required": false,
            "description": "`many`: the body is an array, one job per element.",
            "schema": {"type": "string", "enum": ["one", "many"]},
        }),
    ];
    parameters.extend(job_headers(app));
    let operation = json!({
        "summary": summary,
        "operationId": operation_id(&route.name),
        "parameters": parameters,
        "requestBody": {
            "required": true,
            "description": "JSON or msgpack; or raw bytes of any other media type (an image, \
                audio, application/octet-stream), one job whose worker gets the bytes and their \
                Content-Type. A form (application/x-www-form-urlencoded) is refused.",
            "content": formats(body(&input)),
        },
        "responses": responses,
    });
    operation
}

/// `x-corral-timeout-ms`, as every job-taking path reads it.
pub fn timeout_header() -> Value {
    json!({
        "name": TIMEOUT_HEADER,
        "in": "header",
        "required": false,
        "description": "Deadline in milliseconds (capped by the route's timeout).",
        "schema": {"type": "integer", "minimum": 1},
    })
}

/// The request headers every job-taking path reads besides its own: priority, weight, the tenant
/// (under the name `--tenant-header` gives it), the other meshes' deadline headers (the earliest
/// of all of them wins) and W3C trace context.
pub fn job_headers(app: &App) -> Vec<Value> {
    let header = |name: &str, description: &str, schema: Value| {
        json!({"name": name, "in": "header", "required": false, "description": description,
            "schema": schema})
    };
    let milliseconds = json!({"type": "integer", "minimum": 1});
    vec![
        priority_header(),
        weight_header(),
        header(
            app.tenant_header.as_str(),
            "The tenant: within a class, tenants take turns, each holding at most \
             --tenant-queue-share of the queue. Hashed on arrival, never logged.",
            json!({"type": "string"}),
        ),
        header(ENVOY_HEADER, "Envoy's deadline, in milliseconds.", milliseconds),
        header(
            GRPC_HEADER,
            "gRPC's deadline: 1 to 8 digits and a unit (H, M, S, m, u or n).",
            // Above zero (0m is a 400), 8 digits at most.
            json!({"type": "string", "pattern": "^0*[1-9][0-9]*[HMSmun]$", "maxLength": 9}),
        ),
        header(
            REQUEST_TIMEOUT_HEADER,
            "Deadline in seconds, a positive number.",
            json!({"type": "string", "minLength": 1}),
        ),
        header(
            "traceparent",
            "W3C trace context: the request's span continues this trace and follows its \
             sampled flag.",
            json!({"type": "string"}),
        ),
    ]
}

/// A job's answer's headers: its id, and where its time went.
pub fn answer_headers() -> Value {
    let mut headers = request_id_header();
    headers[SERVER_TIMING_HEADER] = server_timing_header();
    headers[BATCH_SIZE_HEADER] = json!({
        "description": "The size of the batch the job went in (the largest, for several items).",
        "schema": {"type": "integer"},
    });
    headers
}

fn server_timing_header() -> Value {
    json!({
        "description": "Where the request's time went: `queue`, `batch` and `total`, in \
            milliseconds (docs/TRACING.md); `total` alone where no job was queued.",
        "schema": {"type": "string"},
    })
}

/// `x-corral-priority`, as every job-taking path reads it.
pub fn priority_header() -> Value {
    json!({
        "name": traffic::PRIORITY_HEADER,
        "in": "header",
        "required": false,
        "description": "Priority class: higher classes go first and may evict queued lower ones \
            (default: the route's, normally `normal`).",
        "schema": {"type": "string", "enum": ["high", "normal", "low"]},
    })
}

/// `x-corral-weight`, as every job-taking path reads it.
pub fn weight_header() -> Value {
    json!({
        "name": traffic::WEIGHT_HEADER,
        "in": "header",
        "required": false,
        "description": "Each item's weight toward the batch weight budget (capped at 1000000).",
        "schema": {"type": "integer", "minimum": 1},
    })
}

/// The route's name, unless one of Corral's own operations or a protocol's may have it (their
/// ids are `v2_…`, `kserve_v1_…`, `openai_…`): a route named `v2_infer` once gave the document
/// two operations of that id, which makes it invalid.
fn operation_id(name: &str) -> String {
    let own = ["healthz", "readyz", "metrics", "openapi"].contains(&name)
        || ["v2_", "kserve_v1_", "openai_", "route_"].iter().any(|p| name.starts_with(p));
    if own {
        format!("route_{name}")
    } else {
        name.to_string()
    }
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string", "description": "A stable code word."},
            "message": {"type": "string"},
            "items": {
                "type": "array",
                "description": "For a multi-item request: each failed element.",
                "items": {
                    "type": "object",
                    "required": ["index", "status", "error", "message"],
                    "properties": {
                        "index": {"type": "integer"},
                        "status": {"type": "integer"},
                        "error": {"type": "string"},
                        "message": {"type": "string"},
                    },
                },
            },
        },
    })
}

pub(super) fn request_id_header() -> Value {
    json!({REQUEST_ID_HEADER: {
        "description": "The request's (and its job's) UUID.",
        "schema": {"type": "string", "format": "uuid"},
    }})
}

/// The headers an `/infer` error of `status` comes with: its id and `server-timing` (its
/// `total` at least), the batch's size where one ran for the job, and a 503's `Retry-After`, a
/// 405's `Allow` or a 415's `Accept-Encoding`.
pub(super) fn infer_error_headers(status: &str) -> Value {
    let mut headers = request_id_header();
    headers[SERVER_TIMING_HEADER] = server_timing_header();
    if ["406", "408", "422", "500"].contains(&status) {
        headers[BATCH_SIZE_HEADER] = json!({
            "description": "Where a batch ran for the job: its size (the largest, for several \
                items).",
            "schema": {"type": "integer"},
        });
    }
    match status {
        "503" => {
            headers["Retry-After"] = json!({
                "description": "Seconds after which a retry may succeed.",
                "schema": {"type": "integer"},
            });
        }
        "405" => {
            headers["Allow"] = json!({
                "description": "The methods the route takes.",
                "schema": {"type": "string"},
            });
        }
        "415" => {
            headers["Accept-Encoding"] = json!({
                "description": "`identity`, on a body refused for its Content-Encoding: the \
                    coding Corral reads.",
                "schema": {"type": "string"},
            });
        }
        _ => {}
    }
    headers
}

/// An answer with Corral's error body and these headers.
fn error_response(description: &str, headers: Value) -> Value {
    let error = format!("#/components/schemas/{ERROR}");
    json!({
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": {"$ref": error}}},
    })
}

/// Why any page may be answered 503 (`too_many_connections`), as every page's 503 says it.
pub(super) const CROWDED: &str = "the connection is over --max-connections \
    (`too_many_connections`, and it is closed: on the reserve of 16 above it (where probes and \
    Corral's own pages are still answered), in the endpoint's own error shape; past the \
    reserve, its request unread, in Corral's own)";

fn plain_get(operation: &str, summary: &str, may_be_unavailable: bool) -> Value {
    let ok = json!({
        "description": "OK.",
        "headers": request_id_header(),
        "content": {"application/json": {"schema": {"type": "object"}}},
    });
    own_get(operation, summary, ok, may_be_unavailable)
}

/// A GET of one of Corral's own pages, answered `ok`, or as every such page answers a method
/// or head it does not take.
fn own_get(operation: &str, summary: &str, ok: Value, may_be_unavailable: bool) -> Value {
    let mut responses = json!({"200": ok});
    responses["405"] = error_response(
        "The path takes GET and HEAD only (`method_not_allowed`); see Allow.",
        infer_error_headers("405"),
    );
    responses["431"] = error_response(
        "The request head is larger than --max-header-bytes (`request_head_too_large`).",
        request_id_header(),
    );
    responses["400"] = error_response(
        "The request head is malformed: an HTTP/1.1 request without exactly one Host field \
         (`bad_request`).",
        request_id_header(),
    );
    // Every page may meet the connection limit: a connection past --max-connections and its
    // reserve is answered so whatever it asks (the pages had listed no 503, or `not_ready`).
    let unavailable = match may_be_unavailable {
        true => format!("Not ready (`not_ready`): no worker yet, or stopping; or {CROWDED}."),
        false => format!("Only where {CROWDED}; see Retry-After."),
    };
    let mut headers = request_id_header();
    headers["Retry-After"] = json!({
        "description": "Seconds after which a retry may succeed (`too_many_connections`).",
        "schema": {"type": "integer"},
    });
    responses["503"] = error_response(&unavailable, headers);
    json!({"operationId": operation, "summary": summary, "responses": responses})
}

#[cfg(test)]
mod tests {
    use super::{infer_error_headers as headers, operation_id, INFER_ERRORS};

    #[test]
    fn a_405_names_its_allow_header_and_a_503_its_retry_after() {
        assert!(headers("405").get("Allow").is_some());
        assert!(headers("503").get("Retry-After").is_some());
        assert!(headers("415").get("Accept-Encoding").is_some());
        assert!(
            headers("431").get("Allow").is_none() && headers("431").get("Retry-After").is_none()
        );
        let listed: Vec<&str> = INFER_ERRORS.iter().map(|(status, _)| *status).collect();
        assert!(listed.contains(&"405") && listed.contains(&"431"), "{listed:?}");
    }

    #[test]
    fn a_route_named_like_one_of_corrals_own_operations_gets_a_prefix() {
        assert_eq!(operation_id("embed"), "embed");
        assert_eq!(operation_id("metrics"), "route_metrics");
        assert_eq!(operation_id("healthz"), "route_healthz");
    }
}
