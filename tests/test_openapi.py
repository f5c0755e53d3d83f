"""`/openapi.json` stays a valid OpenAPI document whatever a worker calls its schema components:
a name OpenAPI does not allow as a component's key is respelled in the document, with the
worker's `$ref`s rewritten to match, and the worker is served as any other."""

from __future__ import annotations

import json
import os
import re
import socket

from openapi_spec_validator import validate

from corral import _protocol as protocol

SCHEMAS = "#/components/schemas/"


def test_a_component_name_openapi_does_not_allow_is_respelled(corral_factory):
    """A worker not written with msgspec (which respells its names itself) may call a type
    `Page[Item]`: such a key once made the whole document invalid."""
    proxy = corral_factory(worker=None)
    page = {"type": "array", "items": {"$ref": SCHEMAS + "my item"}}
    schemas = {
        "input_schema": json.dumps({"$ref": SCHEMAS + "Page[Item]"}),
        # As a URI fragment strictly writes it.
        "output_schema": json.dumps({"$ref": SCHEMAS + "my%20item"}),
        "schema_components": json.dumps({"Page[Item]": page, "my item": {"type": "integer"}}),
    }
    hello = protocol.hello("default", os.getpid(), "typed", schemas=schemas)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as worker:
        worker.connect(str(proxy.socket))
        worker.sendall(protocol.encode_frame(hello))
        proxy.wait_for_log(r"worker connected")
        document = proxy.client.get("/openapi.json").json()
    validate(document)
    components = document["components"]["schemas"]
    assert all(re.fullmatch(r"[a-zA-Z0-9._-]+", name) for name in components), components
    assert components["Page_Item_"] == {"type": "array", "items": {"$ref": SCHEMAS + "my_item"}}
    assert components["my_item"] == {"type": "integer"}
    operation = document["paths"]["/infer"]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]["anyOf"][0]
    response = operation["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"][0]
    assert (request, response) == ({"$ref": SCHEMAS + "Page_Item_"}, {"$ref": SCHEMAS + "my_item"})


def say_hello(proxy, schemas: dict | None, features: list[str] | None = None) -> socket.socket:
    """A worker connected to `proxy` that said hello declaring `schemas` (None: none)."""
    hello = protocol.hello("default", os.getpid(), "typed", schemas=schemas, features=features)
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker.connect(str(proxy.socket))
    worker.sendall(protocol.encode_frame(hello))
    return worker


def infer_schemas(document: dict) -> tuple[dict, dict]:
    """The one-item request and answer schemas of `POST /infer`."""
    operation = document["paths"]["/infer"]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]["anyOf"][0]
    response = operation["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"][0]
    return request, response


def test_a_departed_worker_s_schemas_leave_with_it(corral_factory):
    # A typed worker's schemas stayed in the document after it left, required of the clients
    # of the untyped worker that took its place (which served anything).
    proxy = corral_factory(worker=None)
    schemas = {"input_schema": '{"type": "integer"}', "output_schema": '{"type": "string"}'}
    with say_hello(proxy, schemas):
        proxy.wait_for_log(r"worker connected")
        document = proxy.client.get("/openapi.json").json()
        assert infer_schemas(document) == ({"type": "integer"}, {"type": "string"})
    proxy.wait_for_log(r"worker disconnected")
    with say_hello(proxy, None):
        proxy.wait_for_log(r"worker connected", count=2)
        document = proxy.client.get("/openapi.json").json()
    validate(document)
    assert infer_schemas(document) == ({}, {})


def test_a_streaming_worker_s_one_shot_answer_is_documented_as_its_chunks(corral_factory):
    # Its schema is a chunk's: a one-shot client gets the array of chunks (one per item, with
    # x-corral-items: many), which the document had described as one chunk.
    proxy = corral_factory(worker=None)
    schemas = {"output_schema": '{"type": "string"}'}
    with say_hello(proxy, schemas, features=["stream"]):
        proxy.wait_for_log(r"worker connected")
        document = proxy.client.get("/openapi.json").json()
    validate(document)
    # (Or the `ok` result's data as it is, for a job that sent no chunk.)
    chunks = {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]}
    assert infer_schemas(document)[1] == chunks
    operation = document["paths"]["/infer"]["post"]
    many = operation["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"][1]
    assert many == {"type": "array", "items": chunks}
    # Its successor, declaring nothing and not streaming, answers one value: not an array.
    proxy.wait_for_log(r"worker disconnected")
    with say_hello(proxy, None):
        proxy.wait_for_log(r"worker connected", count=2)
        document = proxy.client.get("/openapi.json").json()
    assert infer_schemas(document) == ({}, {})


def test_a_departed_worker_s_declarations_leave_though_its_successor_came_first(corral_factory):
    # A rolling update: the new (untyped) worker joins while the old (typed, tensor-declaring)
    # one is still there, then the old one stops. Its tensors stayed in force (v2 and KServe v1
    # requests refused for its inputs) and its schemas in the document.
    proxy = corral_factory(worker=None)
    schemas = {"input_schema": '{"type": "integer"}', "output_schema": '{"type": "string"}'}
    tensors = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [3]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1]}],
    }
    hello = protocol.hello("default", os.getpid(), "typed", schemas=schemas, **tensors)
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.connect(str(proxy.socket))
    old.sendall(protocol.encode_frame(hello))
    proxy.wait_for_log(r"worker connected")
    assert [i["name"] for i in proxy.client.get("/v2/models/default").json()["inputs"]] == ["X"]
    with say_hello(proxy, None):
        proxy.wait_for_log(r"worker connected", count=2)
        old.close()
        proxy.wait_for_log(r"worker disconnected")
        document = proxy.client.get("/openapi.json").json()
        metadata = proxy.client.get("/v2/models/default").json()
    assert infer_schemas(document) == ({}, {})
    assert metadata["inputs"] == [] and metadata["outputs"] == []


def test_a_schema_that_is_no_json_object_is_ignored(corral_factory):
    # `5` is JSON but no schema: copied in, it made the whole document invalid.
    proxy = corral_factory(worker=None)
    schemas = {
        "input_schema": "5",
        "output_schema": '{"$ref": "#/components/schemas/Out"}',
        "schema_components": '{"Out": {"type": "string"}, "Bad": 5}',
    }
    with say_hello(proxy, schemas):
        proxy.wait_for_log(r"worker connected")
        document = proxy.client.get("/openapi.json").json()
    validate(document)
    assert infer_schemas(document) == ({}, {"$ref": SCHEMAS + "Out"})
    assert "Bad" not in document["components"]["schemas"]


def test_the_405_and_431_that_infer_answers_are_documented_with_their_error_body(corral_factory):
    """Every status `/infer` answers with Corral's error body is in the document, with its code
    word: a wrong method (405, with Allow) and a head over --max-header-bytes that the HTTP
    layer's 8 KiB read buffer still took in (431) were answered but not listed."""
    proxy = corral_factory("--max-header-bytes", "1000", worker=None)
    wrong_method = proxy.client.get("/infer")
    head_too_large = proxy.client.post("/infer", json=1, headers={"x-big": "a" * 2000})
    document = proxy.client.get("/openapi.json").json()
    validate(document)
    responses = document["paths"]["/infer"]["post"]["responses"]
    for answer in (wrong_method, head_too_large):
        status = str(answer.status_code)
        assert status in responses, (status, sorted(responses))
        documented = responses[status]
        body = answer.json()
        assert f"`{body['error']}`" in documented["description"], (body, documented)
        schema = documented["content"]["application/json"]["schema"]
        assert schema == {"$ref": SCHEMAS + "Error"}, schema
        assert "x-request-id" in documented["headers"] and "x-request-id" in answer.headers
        # Its timing too: listed under 200 alone before.
        assert "server-timing" in answer.headers and "server-timing" in documented["headers"]
    assert (wrong_method.status_code, head_too_large.status_code) == (405, 431)
    for status in ("408", "422", "500"):
        assert "x-corral-batch-size" in responses[status]["headers"], status
    assert wrong_method.headers["allow"] == "POST"
    assert "Allow" in responses["405"]["headers"]


def test_the_statuses_the_protocol_endpoints_answer_are_documented(corral_factory):
    """A 405 on every endpoint, v2 metadata's 503 before any worker, and v2's 415 for a
    compressed body (tritonclient's `request_compression_algorithm`) were answered, unlisted."""
    proxy = corral_factory("--max-header-bytes=20000", worker=None)
    document = proxy.client.get("/openapi.json").json()
    validate(document)
    big = {"x-big": "a" * 25_000}  # past the bound, within hyper's buffer: the proxy's 431
    asked = {
        ("/healthz", "get", 431): proxy.client.get("/healthz", headers=big),
        ("/v2/models/{name}/ready", "get", 431): proxy.client.get(
            "/v2/models/default/ready", headers=big
        ),
        ("/v2/models/default", "get", 503): proxy.client.get("/v2/models/default"),
        ("/v2/models/{name}", "get", 405): proxy.client.post("/v2/models/default", json={}),
        ("/v2/health/live", "get", 405): proxy.client.post("/v2/health/live", json={}),
        ("/v1/models", "get", 405): proxy.client.post("/v1/models", json={}),
        ("/v1/models/{name}:predict", "post", 405): proxy.client.get("/v1/models/default:predict"),
        ("/v2/models/{name}/infer", "post", 415): proxy.client.post(
            "/v2/models/default/infer", content=b"x", headers={"content-encoding": "gzip"}
        ),
        ("/healthz", "get", 405): proxy.client.post("/healthz", json={}),
        # Documented with their 200 alone before.
        ("/metrics", "get", 405): proxy.client.post("/metrics", json={}),
        ("/openapi.json", "get", 431): proxy.client.get("/openapi.json", headers=big),
        ("/v1/models/{name}:predict", "post", 503): proxy.client.post(
            "/v1/models/default:predict", json={"instances": [1]}
        ),
    }
    # An HTTP/1.1 head without its Host field: 400, from every page (listed for none).
    address = proxy.url.removeprefix("http://").rsplit(":", 1)
    for path in ("/healthz", "/v2/health/ready", "/v1/models", "/v2/models/{name}/ready"):
        with socket.create_connection((address[0], int(address[1])), timeout=10) as raw:
            target = path.replace("{name}", "default")
            raw.sendall(f"GET {target} HTTP/1.1\r\n\r\n".encode())
            head = raw.makefile("rb").readline()
        assert head.startswith(b"HTTP/1.1 400"), (path, head)
        assert "400" in document["paths"][path]["get"]["responses"], path
    for (path, method, expected), answer in asked.items():
        assert answer.status_code == expected, (path, answer.status_code, answer.text)
        path = path.replace("/v2/models/default", "/v2/models/{name}")
        responses = document["paths"][path][method]["responses"]
        assert str(expected) in responses, (path, method, expected, sorted(responses))
        # The headers it came with that a client reads are documented too (the client
        # protocols' errors had none: no Retry-After on a 503, no Allow on a 405).
        documented = {name.lower() for name in responses[str(expected)].get("headers", {})}
        for header in ("x-request-id", "allow", "retry-after"):
            if header in answer.headers:
                assert header in documented, (path, method, expected, header, documented)
