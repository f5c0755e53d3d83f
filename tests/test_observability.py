"""Observability end to end: Prometheus metrics read with Prometheus' own parser, JSON logs that
carry request ids, and an OpenAPI document that a real validator accepts and that schemathesis
cannot break against a typed worker."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT
from test_failures import shed_behind_a_held_job
from test_pipelines import write

TYPED = str(ROOT / "examples" / "typed" / "worker.py")


def test_metrics_count_every_kind_of_answer(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    # One job at a time and none sent ahead, with a deadline no prediction refuses: a request
    # is shed only when the queue is full.
    proxy = corral_factory(
        "--max-batch-size=1",
        "--max-wait-ms=0",
        "--queue-capacity=1",
        "--worker-prefetch=false",
        "--timeout-ms=60000",
        env={"SCRIPTED_LOG": str(log)},
    )
    assert proxy.post({"n": 1}).status_code == 200
    assert proxy.post({"invalid": "no"}).status_code == 422
    # The worker answers only once the client has had its 408: a late result, dropped. (The
    # deadline leaves a loaded machine time to hand the job to the worker: it expires there.)
    late = tmp_path / "late"
    expired = proxy.post({"hold": str(late)}, headers={"x-corral-timeout-ms": "1000"})
    late.touch()
    assert expired.status_code == 408
    shed_behind_a_held_job(proxy, log, tmp_path / "gate", over=3)
    assert proxy.post("after").status_code == 200

    def count(name, **labels):
        return proxy.metric(name, **labels)

    assert count("corral_requests_total", route="/infer", code="200") == 4  # n, held, queued, after
    assert count("corral_requests_total", route="/infer", code="422") == 1
    assert count("corral_requests_total", route="/infer", code="408") == 1
    assert count("corral_requests_total", route="/infer", code="503") == 3
    assert count("corral_jobs_shed_total", reason="queue_full") == 3
    assert count("corral_jobs_shed_total", reason="deadline_unreachable") == 0
    assert count("corral_jobs_expired_total", where="worker") == 1
    assert count("corral_late_results_total") == 1
    assert count("corral_request_duration_seconds_count", route="/infer") == 4 + 1 + 1 + 3
    # Six jobs reached the worker (the 200s, the 422 and the 408), each in a batch of its own.
    assert count("corral_batch_size_count", stage="default") == 6
    assert count("corral_batch_size_sum", stage="default") == 6
    assert count("corral_batch_duration_seconds_count", stage="default") == 6
    assert count("corral_queue_wait_seconds_count", stage="default") == 6
    assert count("corral_workers_connected", stage="default") == 1
    assert count("corral_queue_depth", stage="default") == 0


def test_worker_failure_series_are_there_at_zero_before_any_failure(corral_factory, tmp_path):
    # Created with the first failure, that failure had no sample before it, and increase()
    # missed it: the crash-loop alert took a sidecar worker's fourth death, not its third.
    proxy = corral_factory(worker=None)
    text = proxy.client.get("/metrics").text
    series = {
        (sample.labels["stage"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "corral_worker_failures_total"
    }
    reasons = ["died", "hung", "protocol", "refused"]
    expected = {("default", reason): 0.0 for reason in reasons} | {("unknown", "refused"): 0.0}
    assert series == expected


def test_json_logs_carry_request_ids(corral_factory):
    proxy = corral_factory(
        "--log-format=json", env={"RUST_LOG": "info,corral::http=debug"}, workers=1
    )
    response = proxy.post("hi", headers={"x-request-id": "client-abc"})
    ours = response.headers["x-request-id"]
    line = proxy.wait_for_log(r'"message":"answered"')
    record = json.loads(line)
    assert record["span"]["request_id"] == ours
    assert record["span"]["client_request_id"] == "client-abc"
    assert record["status"] == 200
    # Every line is JSON, the workers' output too (as objects of their own): the Python
    # worker says where it connected.
    proxy.wait_for_log(r'"target":"corral::worker"[,}]')
    records = [json.loads(line) for line in proxy.lines]
    workers = [r for r in records if r.get("target") == "corral::worker"]
    assert workers and all(r["worker"] == 0 for r in workers), records
    # Keyed as the proxy's own lines about a worker are: `worker` the index (the label had made
    # it a string here and a number there) and its `stage`.
    assert all(r["stage"] == "default" for r in workers), records
    started = [r for r in records if r.get("message") == "worker started"]
    assert started and all(isinstance(r["worker"], int) for r in started), started
    # Fields are values, not Rust's debug forms (`"\"Scripted\""`, `"[\"default\"]"`).
    (connected,) = [r for r in records if r.get("message") == "worker connected"]
    assert connected["name"] == "Scripted", connected
    (route,) = [r for r in records if r.get("message") == "serving route"]
    assert route["stages"] == "default", route


def test_a_log_filter_that_does_not_parse_is_said_so(corral_factory):
    """A misspelt level in RUST_LOG had logged at info without a word."""
    proxy = corral_factory(env={"RUST_LOG": "warn,corral::http=degub"}, workers=1)
    line = proxy.wait_for_log(r"is not a log filter")
    assert "WARN" in line and "degub" in line and "logging at info" in line
    proxy.wait_for_log(r"INFO .*worker connected")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("warning", '["warning"]: a word alone names a target'),
        ("hyper=debug", "own lines;"),
        # A part of Corral's alone: its other lines, the error it exits with too, went unlogged.
        ("corral::http=debug", "own lines;"),
    ],
)
def test_a_log_filter_that_sets_no_level_for_corral_logs_it_at_info(corral_factory, text, said):
    """`RUST_LOG=warning` parsed, as a filter for a target named `warning`: every line of the
    proxy's went unlogged, the error it exits with included."""
    proxy = corral_factory(env={"RUST_LOG": text}, workers=1)
    line = proxy.wait_for_log(r"sets no level for Corral's own lines")
    assert "WARN" in line and said in line and "logging at info" in line
    proxy.wait_for_log(r"INFO .*worker connected")


def test_a_log_filter_s_directives_are_read_with_spaces_around_them(corral_factory):
    """The README's filter with a space after its comma was refused ("not a log filter"), and
    `hyper=debug, info` was a filter for a target named " info": nothing of Corral's logged."""
    proxy = corral_factory(env={"RUST_LOG": "hyper=debug, info , corral::http=debug"}, workers=1)
    proxy.wait_for_log(r"INFO .*worker connected")
    assert proxy.client.post("/infer", json={"n": 1}).status_code == 200
    proxy.wait_for_log(r"DEBUG .*corral::http")
    assert not [line for line in proxy.lines if "log filter" in line or "own lines" in line]


@pytest.mark.parametrize("empty", ["", ","])
def test_a_log_filter_with_no_directive_logs_at_info(corral_factory, empty):
    """An empty filter logged nothing, errors included."""
    proxy = corral_factory(env={"RUST_LOG": empty}, workers=1)
    proxy.wait_for_log(r"INFO .*worker connected")


def test_a_worker_s_failures_are_logged_with_their_jobs_once_a_minute(corral_factory):
    """A model failing every batch once wrote a traceback per batch, naming no job, and in JSON
    logs every one of its lines was an INFO line of its own. Each kind of failure is logged in
    full once a minute, naming the jobs (a client's x-request-id), and counted meanwhile; as JSON
    the record keeps its level and its traceback in one object."""
    proxy = corral_factory("--log-format=json", "--max-wait-ms=0", workers=1)
    failed = [proxy.post({"raise": "the model is broken"}) for _ in range(5)]
    assert [f.status_code for f in failed] == [500] * 5
    first = failed[0].headers["x-request-id"]
    line = proxy.wait_for_log(r'"message":"forward failed')
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["worker"] == 0
    assert record["message"] == f"forward failed for job {first}"
    assert record["exception"].endswith("RuntimeError: the model is broken")
    assert "Traceback (most recent call last)" in record["exception"]
    # The other four were alike (same hook, type and line): counted, not logged.
    assert proxy.post("fine").status_code == 200
    assert sum("forward failed" in line for line in proxy.lines) == 1
    assert sum("RuntimeError" in line for line in proxy.lines) == 1, "one traceback, whole"


def test_a_model_that_cannot_load_is_one_error_record(corral_factory):
    """An exception from the worker's `__init__` (the commonest start-up failure) reached
    Python's own handler: its traceback a line per frame, each forwarded as an INFO line, so
    that an alert on errors never fired for a worker restarting forever."""
    import sys

    scripted = str(ROOT / "tests" / "workers" / "scripted.py")
    env = {"SCRIPTED_BROKEN": "/models/weights.bin"}
    # Spawned by hand: it never connects, which the factory would wait for.
    command = ["--log-format=json", "--workers=1", "--", sys.executable, scripted]
    proxy = corral_factory(*command, worker=None, env=env)
    line = proxy.wait_for_log(r'"message":"the worker failed to start')
    record = json.loads(line)
    assert record["level"] == "ERROR"
    assert record["exception"].startswith("Traceback (most recent call last)")
    assert record["exception"].endswith("FileNotFoundError: /models/weights.bin")
    proxy.wait_for_log(r"worker exited; restarting")
    # No traceback came as lines of its own (each start logs the one record).
    split = [other for other in proxy.lines if re.search(r'"message":"(Traceback|  File )', other)]
    assert not split, split


def test_a_worker_s_failure_of_megabytes_stays_one_error_record(corral_factory):
    """Corral forwards a worker's output in lines of at most 16 KiB: a record longer than that
    (an exception quoting a 1 MB input) came in pieces, none of them JSON, each an INFO line of
    raw text. The package shortens its middle to stay one record, level and traceback kept."""
    proxy = corral_factory("--log-format=json", "--max-wait-ms=0", workers=1)
    reason = "begin " + "x" * 1_000_000 + " end"
    assert proxy.post({"raise": reason}).status_code == 500
    line = proxy.wait_for_log(r'"message":"forward failed')
    record = json.loads(line)
    assert record["level"] == "ERROR" and len(line) <= 16 * 1024
    assert record["exception"].startswith("Traceback (most recent call last)")
    assert record["exception"].endswith(" end") and "characters left out" in record["exception"]
    # No other line carries a piece of it.
    assert [other for other in proxy.lines if "xxxx" in other] == [line]


def test_openapi_is_built_again_when_a_worker_declares_new_schemas(corral_factory):
    """The document is kept between requests, and built again once declarations change."""
    import os
    import sys

    proxy = corral_factory(worker=None)
    before = proxy.client.get("/openapi.json").json()
    assert proxy.client.get("/openapi.json").json() == before, "the same while nothing changed"
    assert "Vector" not in before["components"]["schemas"]
    worker = subprocess.Popen(
        [sys.executable, TYPED],
        env={**os.environ, "CORRAL_SOCKET": str(proxy.socket)},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        proxy.wait_for_log(r"worker connected")
        after = proxy.client.get("/openapi.json").json()
        assert {"Vector", "Norm"} <= set(after["components"]["schemas"])
        validate(after)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_openapi_of_a_multi_mib_schema_holds_under_64_concurrent_reads(corral_factory):
    """The document is built once for its declarations, however many read it at once: 64
    clients read a document around a 4 MiB schema and all get the same, whole."""
    import os
    import socket

    from corral import _protocol as protocol

    proxy = corral_factory(worker=None)
    names = {f"field{i}": {"type": "string", "description": "x" * 400} for i in range(10_000)}
    schema = json.dumps({"type": "object", "properties": names})
    assert len(schema) > 4 * 2**20
    hello = protocol.hello("default", os.getpid(), "big", schemas={"input_schema": schema})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as worker:
        worker.connect(str(proxy.socket))
        worker.sendall(protocol.encode_frame(hello))
        proxy.wait_for_log(r"worker connected")
        with ThreadPoolExecutor(64) as pool:
            bodies = list(pool.map(lambda _: proxy.client.get("/openapi.json").content, range(64)))
    assert len(set(bodies)) == 1
    document = json.loads(bodies[0])
    body = document["paths"]["/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert "field9999" in json.dumps(body)


def test_openapi_describes_the_typed_worker_and_validates(corral_factory):
    proxy = corral_factory(worker=TYPED)
    document = proxy.client.get("/openapi.json").json()
    validate(document)
    schemas = document["components"]["schemas"]
    assert set(schemas) >= {"Vector", "Norm", "Error"}
    infer = document["paths"]["/infer"]["post"]
    body = infer["requestBody"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/Vector"} in body["anyOf"]
    assert set(infer["responses"]) >= {"200", "400", "408", "413", "422", "500", "503"}
    # Every header the docs name for a job's request, on every job-taking path.
    job_headers = {
        "x-corral-timeout-ms",
        "x-corral-priority",
        "x-corral-weight",
        "x-corral-tenant",
        "x-envoy-expected-rq-timeout-ms",
        "grpc-timeout",
        "request-timeout",
        "traceparent",
    }
    assert {p["name"] for p in infer["parameters"]} == job_headers | {"x-corral-items"}
    ok = infer["responses"]["200"]
    assert set(ok["headers"]) == {"x-request-id", "server-timing", "x-corral-batch-size"}
    assert {"text/event-stream", "application/x-ndjson"} <= set(ok["content"])
    for path, method in [
        ("/v1/models/{name}:predict", "post"),
        ("/v2/models/{name}/infer", "post"),
    ]:
        operation = document["paths"][path][method]
        assert job_headers <= {p["name"] for p in operation["parameters"]}, path
        assert "server-timing" in operation["responses"]["200"]["headers"], path
    assert set(document["paths"]) == {
        "/infer",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/models/{name}:predict",
        "/v1/models/{name}",
        "/v1/models",
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{name}",
        "/v2/models/{name}/ready",
        "/v2/models/{name}/config",
        "/v2/models/{name}/stats",
        "/v2/models/stats",
        "/v2/repository/index",
        "/v2/models/{name}/infer",
    }


def test_openapi_keeps_apart_components_that_stages_name_alike(corral_factory, tmp_path):
    """Two stages' workers name different types `Item`, and one names its own `Error`: each route
    refers to its own worker's types, and error answers to Corral's error body. The last stage's
    `Item` once stood for both routes', and a worker's `Error` was replaced by Corral's."""
    import os
    import socket

    from corral import _protocol as protocol

    text = "".join(
        f'[stages.{n}]\n[pipelines.{n}]\nstages = ["{n}"]\n[routes.{n}]\npipeline = "{n}"\n'
        for n in ("left", "right")
    )
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    reason = {"type": "object", "required": ["why"], "properties": {"why": {"type": "string"}}}
    declared = {
        "left": {"Item": {"type": "integer"}, "Error": reason},
        "right": {"Item": {"type": "string"}},
    }
    workers = []
    for stage, components in declared.items():
        schemas = {
            "input_schema": json.dumps({"$ref": "#/components/schemas/Item"}),
            "output_schema": json.dumps(
                {"$ref": "#/components/schemas/" + ("Error" if "Error" in components else "Item")}
            ),
            "schema_components": json.dumps(components),
        }
        hello = protocol.hello(stage, os.getpid(), stage, schemas=schemas)
        worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        workers.append(worker)
        worker.connect(str(proxy.socket))
        worker.sendall(protocol.encode_frame(hello))
    try:
        proxy.wait_for_log(r"worker connected", count=2)
        document = proxy.client.get("/openapi.json").json()
    finally:
        for worker in workers:
            worker.close()
    validate(document)

    def resolved(schema):
        """The component `schema` refers to."""
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return document["components"]["schemas"][name]

    def one(path, side):
        """The schema of one job's request (or result) on `path`, as JSON."""
        operation = document["paths"][path]["post"]
        if side == "request":
            content = operation["requestBody"]["content"]
        else:
            content = operation["responses"]["200"]["content"]
        return content["application/json"]["schema"]["anyOf"][0]

    assert resolved(one("/left", "request")) == {"type": "integer"}
    assert resolved(one("/right", "request")) == {"type": "string"}
    assert resolved(one("/right", "response")) == {"type": "string"}
    assert resolved(one("/left", "response")) == reason
    for path in ("/left", "/right"):
        error = document["paths"][path]["post"]["responses"]["500"]["content"]
        assert set(resolved(error["application/json"]["schema"])["required"]) == {
            "error",
            "message",
        }


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(corral_factory):
    proxy = corral_factory(worker=TYPED)
    result = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "schemathesis"),
            "--config-file", str(ROOT / "tests" / "schemathesis.toml"),
            "run", proxy.url + "/openapi.json",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
            "response_headers_conformance,response_schema_conformance",
            "--max-examples", "40", "--generation-deterministic",
            "--phases", "examples,coverage,fuzzing", "--request-timeout", "10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[:8000] + result.stderr[-2000:]
