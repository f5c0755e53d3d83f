//! The protocols' part of `/openapi.json`: their paths, request and answer shapes, and the error
//! statuses each can answer (in its own error shape).

use serde_json::{json, Map, Value};

use super::super::openapi::{
    answer_headers, infer_error_headers, job_headers, request_id_header, timeout_header, CROWDED,
};
use super::super::{App, Protocol};
use super::openai::EMBEDDINGS_PATH;

pub fn paths(app: &App) -> Map<String, Value> {
    let mut paths = Map::new();
    let models: Vec<&str> = app.routes.iter().map(|route| route.model.as_str()).collect();
    let name = json!({
        "name": "name",
        "in": "path",
        "required": true,
        "description": "The model: a route's name in the config file (`default` for the default route).",
        "schema": {"type": "string", "enum": models},
    });
    let v1_error = json!({"type": "object", "required": ["error"],
        "properties": {"error": {"type": "string"}}});
    let mut predict = errors(&v1_error, "instance");
    predict.insert(
        "200".into(),
        answered(json!({"type": "object", "required": ["predictions"],
            "properties": {"predictions": {"type": "array"}}})),
    );
    paths.insert(
        "/v1/models/{name}:predict".into(),
        json!({"post": {
            "operationId": "kserve_v1_predict",
            "summary": "KServe v1: one job per instance, answered in order.",
            "parameters": job_parameters(app, [name.clone()]),
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "required": ["instances"],
                "properties": {"instances": {"type": "array", "minItems": 1}},
            }}}},
            "responses": predict,
        }}),
    );
    let readiness = json!({"type": "object", "required": ["name", "ready"],
        "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}});
    let crowded = |mut responses: Value| {
        or_crowded(&mut responses, &v1_error);
        responses
    };
    paths.insert(
        "/v1/models".into(),
        json!({"get": {
            "operationId": "kserve_v1_models",
            "summary": "KServe v1: the models served, one per route.",
            "responses": crowded(json!({"200": ok(json!({"type": "object", "required": ["models"],
                "properties": {"models": {"type": "array", "items": {"type": "string"}}}})),
                "405": get_only(&v1_error), "431": head_too_large(&v1_error),
                "400": no_host(&v1_error)})),
        }}),
    );
    paths.insert(
        "/v1/models/{name}".into(),
        json!({"get": {
            "operationId": "kserve_v1_model",
            "summary": "KServe v1 readiness: every stage of the model's route has a worker.",
            "parameters": [name],
            "responses": crowded(json!({
                "200": ok(readiness.clone()),
                "404": response("No such model.", &v1_error),
                "503": response("Not ready.", &readiness),
                "405": get_only(&v1_error),
                "431": head_too_large(&v1_error),
                "400": no_host(&v1_error),
            })),
        }}),
    );
    if app.routes.iter().any(|route| route.protocol == Some(Protocol::OpenAiEmbeddings)) {
        paths.insert(EMBEDDINGS_PATH.into(), embeddings(app));
    }
    v2(app, &mut paths, &name, &v1_error);
    paths
}

/// Open Inference Protocol v2: health, metadata and infer (whose error body is v1's).
fn v2(app: &App, paths: &mut Map<String, Value>, name: &Value, error: &Value) {
    let get = |id: &str, summary: &str, parameters: Value, mut responses: Value| {
        responses["405"] = get_only(error);
        responses["431"] = head_too_large(error);
        responses["400"] = no_host(error);
        or_crowded(&mut responses, error);
        json!({"get": {"operationId": id, "summary": summary, "parameters": parameters,
            "responses": responses}})
    };
    let flag = |key: &str| json!({"type": "object", "required": [key], "properties": {key: {"type": "boolean"}}});
    let live = get("v2_live", "v2: the server is up.", json!([]), json!({"200": ok(flag("live"))}));
    paths.insert("/v2/health/live".into(), live);
    let ready = json!({"200": ok(flag("ready")), "503": response("Not ready.", &flag("ready"))});
    let server_ready = get("v2_ready", "v2: every stage has a worker.", json!([]), ready);
    paths.insert("/v2/health/ready".into(), server_ready);
    let server = json!({"type": "object", "required": ["name", "version", "extensions"],
        "properties": {"name": {"type": "string"}, "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}}}});
    paths.insert(
        "/v2".into(),
        get("v2_server", "v2: server metadata.", json!([]), json!({"200": ok(server)})),
    );
    let tensor = json!({"type": "object", "required": ["name", "datatype", "shape"],
        "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}}}});
    let tensors = json!({"type": "array", "items": tensor});
    let model = json!({"type": "object", "required": ["name", "versions", "platform", "inputs",
        "outputs"], "properties": {"name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"}, "inputs": tensors, "outputs": tensors}});
    let not_found = response("No such model.", error);
    let metadata = get(
        "v2_model",
        "v2: the tensors the model's workers declared (the batch dimension first, as -1).",
        json!([name]),
        json!({"200": ok(model), "404": not_found,
            "503": failed("503", "No worker has connected yet: its tensors are not known.", error)}),
    );
    paths.insert("/v2/models/{name}".into(), metadata);
    let readiness = json!({"type": "object", "required": ["name", "ready"],
        "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}});
    let model_ready = get(
        "v2_model_ready",
        "v2: every stage of the model's route has a worker.",
        json!([name]),
        json!({"200": ok(readiness.clone()), "404": not_found,
            "503": response("Not ready.", &readiness)}),
    );
    paths.insert("/v2/models/{name}/ready".into(), model_ready);
    let config_tensor = json!({"type": "object", "required": ["name", "data_type", "dims"],
        "properties": {"name": {"type": "string"}, "data_type": {"type": "string"},
            "format": {"type": "string"},
            "dims": {"type": "array", "items": {"type": "integer"}}}});
    let config = json!({"type": "object",
        "required": ["name", "platform", "max_batch_size", "input", "output"],
        "properties": {"name": {"type": "string"}, "platform": {"type": "string"},
            "backend": {"type": "string"}, "max_batch_size": {"type": "integer", "minimum": 1},
            "input": {"type": "array", "items": config_tensor.clone()},
            "output": {"type": "array", "items": config_tensor},
            "dynamic_batching": {"type": "object"}, "version_policy": {"type": "object"}}});
    let model_config = get(
        "v2_model_config",
        "Triton's model configuration extension: the declared tensors without the batch \
         dimension, Triton's type names (TYPE_FP32; BYTES is TYPE_STRING), and the first \
         stage's max batch size, or its workers' own max_batch where each takes fewer.",
        json!([name]),
        json!({"200": ok(config), "404": not_found,
            "503": failed("503", "No worker has connected yet: its tensors are not known.", error)}),
    );
    paths.insert("/v2/models/{name}/config".into(), model_config);
    let count = json!({"type": "integer", "minimum": 0});
    let duration = json!({"type": "object", "required": ["count", "ns"],
        "properties": {"count": count, "ns": count}});
    let durations = |names: &[&str]| {
        let properties: Map<String, Value> =
            names.iter().map(|name| (name.to_string(), duration.clone())).collect();
        json!({"type": "object", "required": names, "properties": properties})
    };
    let computed = ["compute_input", "compute_infer", "compute_output"];
    let mut batch = durations(&computed);
    batch["required"].as_array_mut().expect("a list").push(json!("batch_size"));
    batch["properties"]["batch_size"] = json!({"type": "integer", "minimum": 1});
    let inference = durations(&[
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ]);
    let model_stat = json!({"type": "object", "required": ["name", "version", "last_inference",
        "inference_count", "execution_count", "inference_stats", "batch_stats"],
        "properties": {"name": {"type": "string"}, "version": {"type": "string"},
            "last_inference": count, "inference_count": count, "execution_count": count,
            "inference_stats": inference, "response_stats": {"type": "object"},
            "batch_stats": {"type": "array", "items": batch},
            "memory_usage": {"type": "array"}}});
    let stats = json!({"type": "object", "required": ["model_stats"],
        "properties": {"model_stats": {"type": "array", "items": model_stat}}});
    let summary = "Triton's statistics extension: the model's requests (success, fail, and the \
        successful ones' queue and compute_infer time), rows inferred, and its stages' batches \
        by size; since the proxy started.";
    let model_stats = get(
        "v2_model_stats",
        summary,
        json!([name]),
        json!({"200": ok(stats.clone()), "404": not_found}),
    );
    paths.insert("/v2/models/{name}/stats".into(), model_stats);
    let entry = json!({"type": "object", "required": ["name", "version", "state"],
        "properties": {"name": {"type": "string"}, "version": {"type": "string"},
            "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]},
            "reason": {"type": "string"}}});
    let index = json!({"post": {"operationId": "v2_repository_index",
        "summary": "Triton's model repository extension: every model, READY once each stage of \
            its route has a worker, else UNAVAILABLE with the reason. {\"ready\": true} lists \
            the ready ones only. (Workers load models: load and unload are not served.)",
        "requestBody": {"required": false, "content": {"application/json": {"schema":
            {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}},
        "responses": {"200": ok(json!({"type": "array", "items": entry})),
            "400": failed("400", "The body is not JSON, or ready is not a boolean.", error),
            "405": failed("405", "The endpoint takes POST only; see Allow.", error),
            "408": failed("408", "The body did not arrive in time.", error),
            "413": failed("413", "The body is over 4 KiB.", error),
            "503": failed("503", &format!("The proxy is stopping and the body was still \
                arriving; or {CROWDED}."), error),
            "415": failed("415", "The body is compressed (Content-Encoding): send it \
                uncompressed; see Accept-Encoding.", error),
            "431": head_too_large(error)}}});
    paths.insert("/v2/repository/index".into(), index);
    let every = "Triton's statistics extension, for every model.";
    paths.insert(
        "/v2/models/stats".into(),
        get("v2_stats", every, json!([]), json!({"200": ok(stats)})),
    );

    let parameters = json!({"type": "object", "properties": {
        "binary_data_size": {"type": "integer", "minimum": 0},
        "binary_data": {"type": "boolean"},
        "binary_data_output": {"type": "boolean"}}});
    let input = json!({"type": "object", "required": ["name", "shape", "datatype"],
        "properties": {"name": {"type": "string"},
            "shape": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32",
                "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]},
            "parameters": parameters, "data": {"type": "array"}}});
    // The request's own parameters: Triton's `timeout` (README) besides the tensors' ones.
    let mut request_parameters = parameters.clone();
    request_parameters["properties"]["timeout"] = json!({"type": "integer", "minimum": 0,
        "description": "Microseconds: the job's deadline, as tritonclient's infer(timeout=...) \
            sends it (0: none)."});
    let request = json!({"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"}, "parameters": request_parameters,
        "inputs": {"type": "array", "minItems": 1, "items": input},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": parameters}}}}});
    let output = json!({"type": "object", "required": ["name", "datatype", "shape"],
        "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "parameters": parameters, "data": {"type": "array"}}});
    let answer = json!({"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"},
        "id": {"type": "string"}, "outputs": {"type": "array", "items": output}}});
    let mut responses = errors(error, "row");
    // Binary tensors come as application/octet-stream; what is refused is a compressed body.
    let compressed =
        "The body is compressed (Content-Encoding): send it uncompressed; see Accept-Encoding.";
    responses.insert("415".into(), response(compressed, error));
    responses.insert(
        "200".into(),
        json!({
            "description": "The outputs, each row's results stacked. With binary data, the body is \
                the JSON header (Inference-Header-Content-Length bytes) followed by the tensors.",
            "headers": answer_headers(),
            "content": {"application/json": {"schema": answer},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }),
    );
    let header_length = json!({"name": "Inference-Header-Content-Length", "in": "header",
        "required": false,
        "description": "Binary tensor extension: the JSON header's length; tensors follow it.",
        "schema": {"type": "integer", "minimum": 0}});
    paths.insert(
        "/v2/models/{name}/infer".into(),
        json!({"post": {
            "operationId": "v2_infer",
            "summary": "Open Inference Protocol v2: one job per row of the first dimension.",
            "parameters": job_parameters(app, [name.clone(), header_length]),
            "requestBody": {"required": true, "content": {
                "application/json": {"schema": request},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
            "responses": responses,
        }}),
    );
}

fn embeddings(app: &App) -> Value {
    let error = json!({"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "enum": ["invalid_request_error", "server_error"]},
            "code": {"type": "string", "description": "Corral's code word."},
            "param": {"type": ["string", "null"],
                "description": "The request field a client error is about, if one is."},
        },
    }}});
    let strings =
        json!({"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}});
    let request = json!({
        "type": "object",
        "required": ["input", "model"],
        "properties": {
            "input": {"anyOf": [{"type": "string", "minLength": 1}, strings]},
            "model": {"type": "string", "description": "Echoed back."},
            // null as leaving it out, as OpenAI's own server reads it.
            "encoding_format": {"enum": ["float", "base64", null]},
        },
    });
    let answer = json!({
        "type": "object",
        "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {"anyOf": [
                        {"type": "array", "items": {"type": "number"}},
                        {"type": "string", "description": "base64 of little-endian float32s"},
                    ]},
                },
            }},
            "model": {"type": "string"},
            "usage": {"type": "object", "description": "Tokens counted as whitespace-separated words."},
        },
    });
    let mut responses = errors(&error, "input");
    responses.insert("200".into(), answered(answer));
    json!({"post": {
        "operationId": "openai_embeddings",
        "summary": "OpenAI embeddings: one job per input string.",
        "parameters": job_parameters(app, []),
        "requestBody": {"required": true, "content": {"application/json": {"schema": request}}},
        "responses": responses,
    }})
}

/// The statuses a protocol's job-taking endpoint answers, each with the protocol's error body.
fn errors(schema: &Value, row: &str) -> Map<String, Value> {
    let described = [
        ("400", "Malformed body, or not of the protocol's shape.".to_string()),
        ("404", "No such model.".to_string()),
        ("405", "The endpoint takes POST only; see Allow.".to_string()),
        ("408", "The deadline passed, or the body did not arrive in time.".to_string()),
        ("413", "Body or a row too large, or too many rows.".to_string()),
        (
            "415",
            "Content-Type is not JSON, or the body is compressed (Content-Encoding; see \
             Accept-Encoding)."
                .to_string(),
        ),
        ("422", format!("The worker rejected a row; the message names the {row}.")),
        ("431", "The request head is larger than --max-header-bytes.".to_string()),
        ("500", "The worker failed, or its output does not fit the protocol.".to_string()),
        (
            "503",
            format!(
                "Shed, stopping, or no worker has connected yet (see Retry-After); or {CROWDED}."
            ),
        ),
    ];
    // With the headers they come with, as the native route's errors are documented (a client
    // generator had no Retry-After to read on a 503).
    described
        .into_iter()
        .map(|(status, text)| (status.into(), failed(status, &text, schema)))
        .collect()
}

/// Any endpoint's answer to a head larger than `--max-header-bytes`.
fn head_too_large(error: &Value) -> Value {
    failed("431", "The request head is larger than --max-header-bytes.", error)
}

/// Any endpoint's answer to an HTTP/1.1 head without exactly one Host field.
fn no_host(error: &Value) -> Value {
    failed(
        "400",
        "The request head is malformed: an HTTP/1.1 request without exactly one \
        Host field.",
        error,
    )
}

/// A read-only endpoint's answer to another method.
fn get_only(error: &Value) -> Value {
    failed("405", "The endpoint takes GET and HEAD only; see Allow.", error)
}

/// An error answer of `schema` with the headers its `status` comes with (`Retry-After`,
/// `Allow`, `Accept-Encoding`), as the native route's are.
fn failed(status: &str, description: &str, schema: &Value) -> Value {
    let mut answer = response(description, schema);
    answer["headers"] = infer_error_headers(status);
    answer
}

/// Adds to a page's answers the one any page may give: a connection past --max-connections
/// and its reserve is answered 503 `too_many_connections` whatever it asks (a page that is no
/// probe, on the reserve too), with Retry-After; the pages had listed no such 503.
fn or_crowded(responses: &mut Value, error: &Value) {
    match responses.get_mut("503") {
        Some(said) => {
            let before = said["description"].as_str().unwrap_or_default().trim_end_matches('.');
            said["description"] = format!("{before}; or {CROWDED}.").into();
        }
        None => responses["503"] = failed("503", &format!("Only where {CROWDED}."), error),
    }
}

/// An answer of `schema`, with the id every answer carries.
fn response(description: &str, schema: &Value) -> Value {
    json!({"description": description, "headers": request_id_header(),
        "content": {"application/json": {"schema": schema}}})
}

fn ok(schema: Value) -> Value {
    response("OK.", &schema)
}

/// A job-taking operation's 200: with the headers every job's answer carries.
fn answered(schema: Value) -> Value {
    let mut ok = ok(schema);
    ok["headers"] = answer_headers();
    ok
}

/// A job-taking operation's parameters: its own, then the headers every such path reads.
fn job_parameters<const N: usize>(app: &App, own: [Value; N]) -> Vec<Value> {
    let mut all: Vec<Value> = own.into();
    all.push(timeout_header());
    all.extend(job_headers(app));
    all
}
