"""Spans end to end: the real binary exports over OTLP/HTTP to a real receiver that decodes with
OpenTelemetry's own protobuf package (tests/otlp_receiver.py), and the tests read the tree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import BINARY, ROOT
from otlp_receiver import Receiver

TRACED = str(ROOT / "tests" / "workers" / "traced.py")

# A batch of up to 16 leaves when full; the wait lets a burst gather.
BATCH = ("--max-batch-size", "16", "--max-wait-ms", "200")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def traced(corral_factory, receiver):
    env = {"OTEL_SERVICE_NAME": "proxy", "TRACED_ENDPOINT": f"{receiver.url}/v1/traces"}
    return corral_factory(*BATCH, "--otlp-endpoint", receiver.url, worker=TRACED, env=env)


def requests_of(spans):
    """The proxy's spans of inference requests (not of the probes a test made meanwhile)."""
    return [  # SPAN_KIND_SERVER
        s for s in spans if s.kind == 2 and s.service == "proxy" and s.name.startswith("POST")
    ]


def test_a_client_traceparent_is_the_parent_of_the_request_span(traced, receiver):
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    answer = traced.post({"x": 1}, headers={"traceparent": traceparent})
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(lambda spans: any(s.name.startswith("batch") for s in spans))
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 1)
    (request,) = requests_of(spans)
    assert request.trace_id == CLIENT_TRACE
    assert request.parent_span_id == CLIENT_SPAN
    assert request.name == "POST /infer"
    assert request.attributes["http.route"] == "/infer"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["corral.request_id"] == answer.headers["x-request-id"]
    children = {s.name: s for s in spans if s.parent_span_id == request.span_id}
    assert {"admission", "queue default"} <= set(children), children
    assert children["admission"].attributes["corral.shed"] is False
    queue = children["queue default"]
    assert queue.trace_id == CLIENT_TRACE
    (batch,) = [s for s in spans if s.name == "batch default"]
    assert queue.links == [(batch.trace_id, batch.span_id)]
    assert (CLIENT_TRACE, request.span_id) in batch.links
    assert batch.attributes["corral.batch.size"] == 1
    assert batch.attributes["process.pid"] == answer.json()["pid"]

    # The worker's spans (its own SDK, its own export) continue the same trace.
    spans = receiver.wait_for(lambda spans: any(s.name == "user work" for s in spans))
    worker = {s.name: s for s in spans if s.service == "worker"}
    assert {"preprocess", "forward", "postprocess", "user work"} <= set(worker), worker
    assert all(s.trace_id == CLIENT_TRACE for s in worker.values())
    forward = worker["forward"]
    assert forward.parent_span_id == request.span_id
    assert forward.links == [(CLIENT_TRACE, request.span_id)]
    assert worker["user work"].parent_span_id == forward.span_id
    assert worker["preprocess"].parent_span_id == request.span_id
    assert worker["postprocess"].parent_span_id == request.span_id


def test_the_items_of_one_request_link_the_forward_span_to_it_once(traced, receiver):
    """A request of several items gives each job its own traceparent, naming the same request
    span: the worker's forward span had one link per item, all of them to that span."""
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    headers = {"traceparent": traceparent, "x-corral-items": "many"}
    answer = traced.post([{"x": 1}, {"x": 2}, {"x": 3}], headers=headers)
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(lambda spans: any(s.name == "forward" for s in spans))
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 1)
    (request,) = requests_of(spans)
    forwards = [s for s in spans if s.name == "forward"]
    assert sum(s.attributes["corral.batch.size"] for s in forwards) == 3
    for forward in forwards:
        assert forward.links == [(CLIENT_TRACE, request.span_id)]


def test_a_request_of_more_items_than_128_links_every_batch_it_rode(corral_factory, receiver):
    """The SDK's default limit of 128 links a span cut the rest: 150 batches, 128 links."""
    env = {"OTEL_SERVICE_NAME": "proxy"}
    proxy = corral_factory("--otlp-endpoint", receiver.url, "--max-batch-size=1", env=env)
    answer = proxy.post([{"x": n} for n in range(150)], headers={"x-corral-items": "many"})
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(lambda spans: any(s.name == "queue default" for s in spans))
    (queue,) = [s for s in spans if s.name == "queue default"]
    assert len(set(queue.links)) == 150


def test_every_request_of_a_burst_links_to_its_shared_batch(traced, receiver, tmp_path):
    # The first request holds the worker until the other 15 are queued: they share a batch.
    gate = tmp_path / "gate"
    items = [{"n": 0, "hold": str(gate)}] + [{"n": i} for i in range(1, 16)]
    with ThreadPoolExecutor(16) as pool:
        first = pool.submit(traced.post, items[0])
        traced.wait_until(
            lambda: traced.metric("corral_workers_busy", stage="default") == 1, what="held"
        )
        rest = [pool.submit(traced.post, item) for item in items[1:]]
        traced.wait_until(
            lambda: traced.metric("corral_queue_depth", stage="default") == 15, what="queued"
        )
        gate.touch()
        answers = [first.result()] + [answer.result() for answer in rest]
    assert all(a.status_code == 200 for a in answers)
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 16)
    batches = {s.span_id: s for s in spans if s.name == "batch default"}
    assert sum(b.attributes["corral.batch.size"] for b in batches.values()) == 16
    for request in requests_of(spans):
        (queue,) = [
            s for s in spans if s.parent_span_id == request.span_id and s.name.startswith("queue")
        ]
        ((_, batch_id),) = queue.links
        batch = batches[batch_id]
        # The batch is no request's child, and links back to each of its members.
        assert batch.parent_span_id == ""
        assert (request.trace_id, request.span_id) in batch.links
    # The burst shared batches: the held one and the 15 queued behind it.
    assert sorted(b.attributes["corral.batch.size"] for b in batches.values()) == [1, 15]
    # One forward span per batch in the worker, linked to each of its members.
    requests = {(r.trace_id, r.span_id) for r in requests_of(spans)}
    spans = receiver.wait_for(
        lambda spans: sum(len(s.links) for s in spans if s.name == "forward") == 16
    )
    forwards = [s for s in spans if s.name == "forward"]
    assert len(forwards) == len(batches)
    assert {link for f in forwards for link in f.links} == requests


def test_forward_follows_a_sampled_job_when_the_batchs_first_is_not(corral_factory, receiver):
    """A batch whose first job its client did not sample, and a sampled one behind it: the
    worker's `forward` (and the user's span in it) is recorded under the sampled request, not
    dropped with the first job's unsampled context."""
    env = {"OTEL_SERVICE_NAME": "proxy", "TRACED_ENDPOINT": f"{receiver.url}/v1/traces"}
    # A batch of two leaves when full: the two requests below are one batch, the quiet first.
    proxy = corral_factory(
        "--max-batch-size", "2", "--max-wait-ms", "60000", "--batch-policy", "fixed",
        "--otlp-endpoint", receiver.url,
        worker=TRACED, env=env,
    )  # fmt: skip
    unsampled = "5" * 32
    with ThreadPoolExecutor(2) as pool:
        quiet = pool.submit(
            proxy.post, {"x": 1}, headers={"traceparent": f"00-{unsampled}-{CLIENT_SPAN}-00"}
        )
        proxy.wait_until(
            lambda: proxy.metric("corral_queue_depth", stage="default") == 1,
            what="the unsampled request queued first",
        )
        loud = proxy.post({"x": 2}, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        assert quiet.result().json()["batch_size"] == 2 and loud.json()["batch_size"] == 2
    # The sampled request's span (the metrics scrapes above have theirs) and the worker's.
    posts = lambda spans: [s for s in requests_of(spans) if s.name == "POST /infer"]  # noqa: E731
    spans = receiver.wait_for(
        lambda spans: posts(spans) and any(s.name == "user work" for s in spans)
    )
    (request,) = posts(spans)
    (forward,) = [s for s in spans if s.name == "forward"]
    assert (forward.trace_id, forward.parent_span_id) == (CLIENT_TRACE, request.span_id)
    assert forward.links == [(CLIENT_TRACE, request.span_id)]  # the unsampled one is not linked
    (work,) = [s for s in spans if s.name == "user work"]
    assert work.parent_span_id == forward.span_id
    # The proxy's batch span links to the sampled member alone: the other's span was never
    # exported.
    (batch,) = [s for s in spans if s.name == "batch default"]
    assert batch.links == [(CLIENT_TRACE, request.span_id)]


def test_a_request_its_client_did_not_sample_exports_no_batch_span(traced, receiver):
    # Its batch was drawn at the ratio (1 here) of its own, and exported linked to a request
    # span that never was. A sampled request after it shows what was exported by then.
    unsampled = "5" * 32
    quiet = traced.post({"x": 1}, headers={"traceparent": f"00-{unsampled}-{CLIENT_SPAN}-00"})
    assert quiet.status_code == 200
    loud = traced.post({"x": 2}, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert loud.status_code == 200
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 1)
    spans = receiver.wait_for(lambda spans: any(s.name == "batch default" for s in spans))
    (batch,) = [s for s in spans if s.name == "batch default"]
    assert batch.links == [(CLIENT_TRACE, requests_of(spans)[0].span_id)]
    assert not [s for s in spans if s.trace_id == unsampled and s.service == "proxy"]


def test_without_a_traceparent_a_new_trace_starts(traced, receiver):
    assert traced.post({"x": 1}).status_code == 200
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 1)
    (request,) = requests_of(spans)
    assert request.parent_span_id == "" and request.trace_id != CLIENT_TRACE


def test_64_clients_of_1000_requests_all_arrive_in_exports_of_at_most_2048_spans(
    corral_factory, receiver
):
    env = {"OTEL_SERVICE_NAME": "proxy"}
    proxy = corral_factory("--max-batch-size", "32", "--otlp-endpoint", receiver.url, env=env)
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda i: proxy.post({"n": i}), range(1000)))
    assert all(a.status_code == 200 for a in answers)
    ids = {a.headers["x-request-id"] for a in answers}
    spans = receiver.wait_for(lambda spans: len(requests_of(spans)) == 1000, timeout=60)
    requests = requests_of(spans)
    assert {r.attributes["corral.request_id"] for r in requests} == ids
    batches = {s.span_id for s in spans if s.name == "batch default"}
    queues = [s for s in spans if s.name == "queue default"]
    assert len(queues) == 1000
    assert all(len(q.links) == 1 and q.links[0][1] in batches for q in queues)
    # Several exports, each within the export batch (the proxy's BATCH_SPANS), every one decoded.
    assert len(receiver.exports) >= 2 and max(receiver.exports) <= 2048
    assert sum(receiver.exports) == len(receiver.spans)


def test_a_collector_answering_errors_drops_spans_and_counts_them(corral_factory):
    failing = Receiver(status=500)
    try:
        proxy = corral_factory("--otlp-endpoint", failing.url)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: proxy.post({"n": i}), range(32)))
        assert all(a.status_code == 200 for a in answers)
        proxy.wait_until(
            lambda: proxy.metric("corral_spans_dropped_total") > 0, what="dropped spans counted"
        )
        # The collector got the exports (and refused them): what it refused is what was counted.
        assert proxy.metric("corral_spans_dropped_total") <= sum(failing.exports)
    finally:
        failing.stop()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_collector_drops_spans_and_counts_them_and_requests_are_served(corral_factory):
    proxy = corral_factory(*BATCH, "--otlp-endpoint", f"http://127.0.0.1:{dead_port()}")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: proxy.post({"n": i}), range(32)))
    assert all(a.status_code == 200 for a in answers)
    proxy.wait_until(
        lambda: proxy.metric("corral_spans_dropped_total") > 0, what="dropped spans counted"
    )
    # Said at the default level, once (not a line per failed export): a collector down or a
    # mistyped endpoint once dropped every span with nothing in the log.
    proxy.wait_for_log(r"WARN.*exports of spans to the OTLP endpoint failed")
    for i in range(32):
        assert proxy.post({"n": i}).status_code == 200
    proxy.wait_until(
        lambda: proxy.metric("corral_spans_dropped_total") >= 64, what="later drops counted"
    )
    assert sum("exports of spans" in line for line in proxy.lines) == 1


def test_a_streaming_workers_forward_span_spans_its_stream(corral_factory, receiver):
    env = {"OTEL_SERVICE_NAME": "proxy", "TRACED_ENDPOINT": f"{receiver.url}/v1/traces"}
    worker = str(ROOT / "tests" / "workers" / "traced_stream.py")
    proxy = corral_factory("--otlp-endpoint", receiver.url, worker=worker, env=env)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    headers = {"traceparent": traceparent, "accept": "application/x-ndjson"}
    answer = proxy.post({"text": "abc"}, headers=headers)
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(
        lambda spans: (
            sum(s.name == "user step" for s in spans) == 3
            and any(s.name == "forward" for s in spans)
            and len(requests_of(spans)) == 1
            and any(s.name == "batch default" for s in spans)
            and any(s.name == "queue default" for s in spans)
        )
    )
    (request,) = requests_of(spans)
    (forward,) = [s for s in spans if s.name == "forward"]
    assert forward.trace_id == CLIENT_TRACE
    assert forward.parent_span_id == request.span_id
    steps = [s for s in spans if s.name == "user step"]
    assert all(s.parent_span_id == forward.span_id for s in steps)
    # The proxy's side of a stream: admission under the request, a batch linked to it.
    admission = [s for s in spans if s.name == "admission"]
    assert [s.parent_span_id for s in admission] == [request.span_id]
    (batch,) = [s for s in spans if s.name == "batch default"]
    assert (CLIENT_TRACE, request.span_id) in batch.links
    # Its queue wait, from entering the queue until its batch was sent, linked to that batch.
    (queue,) = [s for s in spans if s.name == "queue default"]
    assert queue.parent_span_id == request.span_id
    assert queue.links == [(batch.trace_id, batch.span_id)]
    assert queue.attributes["corral.dispatched"] is True


def test_a_stream_answered_408_before_its_first_chunk_has_its_queue_span(
    corral_factory, receiver, tmp_path
):
    # The worker holds the job's first chunk past its deadline: the client's 408 is a slow
    # stream's trace, and it had the admission span alone, no queue wait nor link to the batch.
    worker = str(ROOT / "tests" / "workers" / "streamer.py")
    env = {"OTEL_SERVICE_NAME": "proxy"}
    proxy = corral_factory("--otlp-endpoint", receiver.url, worker=worker, env=env)
    gate = tmp_path / "gate"
    headers = {
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "accept": "text/event-stream",
        "x-corral-timeout-ms": "300",
    }
    answer = proxy.post({"chunks": 1, "gate_first": str(gate)}, headers=headers)
    gate.touch()
    assert answer.status_code == 408, answer.text
    spans = receiver.wait_for(
        lambda spans: (
            any(s.name == "queue default" for s in spans)
            and any(s.name == "batch default" for s in spans)
            and requests_of(spans)
        )
    )
    (request,) = requests_of(spans)
    (batch,) = [s for s in spans if s.name == "batch default"]
    (queue,) = [s for s in spans if s.name == "queue default"]
    assert queue.parent_span_id == request.span_id
    assert queue.links == [(batch.trace_id, batch.span_id)]
    assert queue.attributes["corral.dispatched"] is True


SCRIPTED = str(ROOT / "tests" / "workers" / "scripted.py")


def batch_events(receiver, count):
    """The events of the proxy's batch spans, once `count` batch spans are in."""
    spans = receiver.wait_for(lambda spans: sum(s.name == "batch default" for s in spans) >= count)
    return [s.events for s in spans if s.name == "batch default"]


def test_a_worker_dying_with_a_batch_and_its_retry_are_events_on_the_batch_span(
    corral_factory, receiver
):
    proxy = corral_factory(
        "--max-wait-ms=0", "--otlp-endpoint", receiver.url, worker=SCRIPTED, workers=2
    )
    proxy.wait_for_log(r"worker connected", count=2)
    # Every worker that takes it dies: once retried (the default, --retries 1), then a 500.
    assert proxy.post({"exit": True}).status_code == 500
    events = batch_events(receiver, 2)
    assert sorted(events) == [["worker failed"], ["worker failed", "retry"]], events


def test_a_streaming_worker_dying_before_its_first_chunk_is_an_event_on_the_batch_span(
    corral_factory, receiver
):
    """A streaming batch's span ends at its first chunk: one whose worker died first had ended
    with no event at all, neither the failure nor the retry."""
    worker = str(ROOT / "tests" / "workers" / "streamer.py")
    proxy = corral_factory(
        "--max-wait-ms=0", "--otlp-endpoint", receiver.url, worker=worker, workers=2
    )
    proxy.wait_for_log(r"worker connected", count=2)
    answer = proxy.post({"chunks": 2, "die_after": 0}, headers={"accept": "text/event-stream"})
    assert answer.status_code == 500, answer.text
    events = batch_events(receiver, 2)
    assert sorted(events) == [["worker failed"], ["worker failed", "retry"]], events


def test_a_hung_worker_killed_is_an_event_on_its_batch_span(corral_factory, receiver):
    proxy = corral_factory(
        "--max-wait-ms=0",
        "--batch-timeout-ms=300",
        "--retries=0",
        "--timeout-ms=20000",
        "--otlp-endpoint",
        receiver.url,
        worker=SCRIPTED,
    )
    assert proxy.post({"sleep_ms": 60_000}).status_code == 500
    assert batch_events(receiver, 1) == [["worker hung: killed"]]


def test_a_job_answered_408_before_its_hung_worker_is_killed_is_not_retried(
    corral_factory, receiver
):
    """The client has its 408 when the worker is killed: the job does not go back to the queue,
    so its batch span has no `retry` event, and no late result is counted (none came). (1 s:
    time for the job to reach the worker on a loaded machine before its deadline.)"""
    proxy = corral_factory(
        "--max-wait-ms=0", "--batch-timeout-ms=3000", "--otlp-endpoint", receiver.url
    )
    answer = proxy.post({"sleep_ms": 60_000}, headers={"x-corral-timeout-ms": "1000"})
    assert answer.status_code == 408
    assert batch_events(receiver, 1) == [["worker hung: killed"]]
    proxy.wait_until(
        lambda: proxy.metric("corral_jobs_expired_total", where="worker") == 1,
        what="the expired job counted once its worker gave it back",
    )
    assert proxy.metric("corral_late_results_total") == 0
    assert proxy.metric("corral_jobs_retried_total", stage="default") == 0


def test_a_pipeline_has_a_queue_wait_and_a_batch_per_stage(corral_factory, receiver, tmp_path):
    from test_pipelines import ARITH_TOML, write

    env = {"OTEL_SERVICE_NAME": "proxy"}
    config = write(tmp_path, ARITH_TOML)
    proxy = corral_factory(
        "--config", config, "--otlp-endpoint", receiver.url, worker=None, env=env
    )
    proxy.wait_for_log(r"worker connected", count=3)
    answer = proxy.post(3)
    assert answer.status_code == 200 and answer.json() == 9, answer.text
    spans = receiver.wait_for(
        lambda spans: (
            {"batch scale", "batch shift"} <= {s.name for s in spans}
            and len(requests_of(spans)) == 1
        )
    )
    (request,) = requests_of(spans)
    children = {s.name: s for s in spans if s.parent_span_id == request.span_id}
    assert {"queue scale", "queue shift"} <= set(children), children
    for stage in ("scale", "shift"):
        (batch,) = [s for s in spans if s.name == f"batch {stage}"]
        assert children[f"queue {stage}"].links == [(batch.trace_id, batch.span_id)]
        assert (request.trace_id, request.span_id) in batch.links
    # The second stage's wait starts after the first stage's batch was sent.
    assert children["queue shift"].start >= children["queue scale"].end


def first_export(corral_factory, receiver, headers: str):
    """The proxy run with `headers` as OTEL_EXPORTER_OTLP_HEADERS, once it has exported one
    request's spans, and the headers that export carried."""
    env = {"OTEL_EXPORTER_OTLP_HEADERS": headers, "OTEL_SERVICE_NAME": "proxy"}
    proxy = corral_factory("--otlp-endpoint", receiver.url, env=env)
    assert proxy.post({"x": 1}).status_code == 200
    receiver.wait_for(lambda spans: len(requests_of(spans)) == 1)
    return proxy, receiver.headers[0]


def test_exports_carry_the_otlp_headers_the_environment_names(corral_factory, receiver):
    _, export = first_export(corral_factory, receiver, "api-key=s3cr%3Dt,x-tenant=blue")
    assert export["api-key"] == "s3cr=t" and export["x-tenant"] == "blue"
    assert export["content-type"] == "application/x-protobuf"


def test_an_otlp_header_of_the_export_request_s_own_is_left_out_with_a_warning(
    corral_factory, receiver
):
    # `content-length=5` had replaced the request's own: 5 bytes of each batch's protobuf were
    # sent as the whole, the collector answered 200, and the spans were lost without a word.
    headers = "api-key=1,Content-Length=5,content-type=text/plain"
    proxy, export = first_export(corral_factory, receiver, headers)
    assert export["api-key"] == "1" and export["content-type"] == "application/x-protobuf"
    assert int(export["content-length"]) > 5
    proxy.wait_for_log(r"ignoring an OTLP export header .*content-length")
    proxy.wait_for_log(r"ignoring an OTLP export header .*content-type")


@pytest.mark.parametrize(
    "endpoint, headers, expected, endpoint_blamed",
    [
        (
            "http://127.0.0.1:4318",
            "no-equals-sign",
            # Named by the variable it came from, and not said to be the endpoint's fault.
            ["OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign", "key=value"],
            False,
        ),
        ("ftp://127.0.0.1", "", ["must be an http:// URL"], True),
    ],
)
def test_a_malformed_otlp_setting_is_a_config_error(endpoint, headers, expected, endpoint_blamed):
    # Exit 2 as every other configuration error, before anything starts.
    env = {**os.environ, "OTEL_EXPORTER_OTLP_HEADERS": headers}
    done = subprocess.run(
        [BINARY, "--otlp-endpoint", endpoint, "--", sys.executable, "-c", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert all(word in done.stderr for word in expected), done.stderr
    assert ("--otlp-endpoint:" in done.stderr) == endpoint_blamed, done.stderr
    assert "listening" not in done.stderr


@pytest.mark.parametrize(
    "variable, named",
    [
        ("CORRAL_OTLP_ENDPOINT", "CORRAL_OTLP_ENDPOINT (--otlp-endpoint): "),
        # OpenTelemetry's two, each by itself: the error had named both, as if either.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT: "),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "),
    ],
)
def test_a_malformed_otlp_endpoint_from_its_variable_is_named_by_the_variable(variable, named):
    # A manifest's `env:` list shows no flag: the error named only `--otlp-endpoint`.
    env = {k: v for k, v in os.environ.items() if "OTLP" not in k}
    done = subprocess.run(
        [BINARY, "--", sys.executable, "-c", "0"],
        env={**env, variable: "ftp://127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert named in done.stderr, done.stderr
    assert " or OTEL_" not in done.stderr, done.stderr
    assert "must be an http:// URL" in done.stderr


def post_and_leave(proxy, body: bytes, accept: str, until, what: str) -> None:
    """POSTs `body` to /infer on a connection of its own and closes it (the client leaves) once
    `until()` holds."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"accept: {accept}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        proxy.wait_until(until, what=what)


def test_a_request_whose_client_left_ends_its_span_with_its_route_and_499(
    corral_factory, receiver, tmp_path
):
    # The span had been exported as a bare "POST": no route, no status, no request id.
    proxy = corral_factory("--otlp-endpoint", receiver.url, env={"OTEL_SERVICE_NAME": "proxy"})
    gate = tmp_path / "gate"
    body = f'{{"hold": "{gate}"}}'.encode()
    in_worker = lambda: proxy.metric("corral_batch_size_count", stage="default") == 1  # noqa: E731
    post_and_leave(proxy, body, "application/json", in_worker, "the job in its worker")
    spans = receiver.wait_for(
        lambda spans: requests_of(spans) and any(s.name == "queue default" for s in spans)
    )
    gate.touch()
    (request,) = requests_of(spans)
    assert request.name == "POST /infer"
    assert request.attributes["http.route"] == "/infer"
    assert request.attributes["http.response.status_code"] == 499
    assert "corral.request_id" in request.attributes
    # Its queue span too, linked to the batch its job rode (it had none: the wait's future was
    # dropped before it was recorded).
    (queue,) = [s for s in spans if s.name == "queue default"]
    assert queue.parent_span_id == request.span_id
    assert queue.attributes["corral.dispatched"] is True
    spans = receiver.wait_for(lambda spans: any(s.name == "batch default" for s in spans))
    (batch,) = [s for s in spans if s.name == "batch default"]
    assert queue.links == [(batch.trace_id, batch.span_id)]


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_a_request_whose_client_left_while_queued_has_a_queue_span_never_dispatched(
    corral_factory, receiver, tmp_path, accept
):
    worker = str(ROOT / "tests" / "workers" / "streamer.py") if "stream" in accept else None
    args = ("--otlp-endpoint", receiver.url, "--max-batch-size=1")
    env = {"OTEL_SERVICE_NAME": "proxy"}
    proxy = corral_factory(*args, env=env, **({"worker": worker} if worker else {}))
    gate = tmp_path / "gate"
    held = {"chunks": 1, "gate_first": str(gate)} if worker else {"hold": str(gate)}
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(proxy.post, held, headers={"accept": accept})
        proxy.wait_until(
            lambda: proxy.metric("corral_workers_busy", stage="default") == 1,
            what="the worker held",
        )
        body = b'{"a": 1}' if not worker else b'{"chunks": 1}'
        queued = lambda: proxy.metric("corral_queue_depth", stage="default") == 1  # noqa: E731
        post_and_leave(proxy, body, accept, queued, "the second job queued")
        spans = receiver.wait_for(
            lambda spans: any(
                s.name == "queue default" and s.attributes["corral.dispatched"] is False
                for s in spans
            )
        )
        gate.touch()
        assert holding.result().status_code == 200
    (left,) = [s for s in requests_of(spans) if s.attributes["http.response.status_code"] == 499]
    (queue,) = [s for s in spans if s.name == "queue default" and s.parent_span_id == left.span_id]
    assert queue.attributes["corral.dispatched"] is False
    assert queue.links == []


def test_a_path_that_is_no_route_names_its_span_by_method_alone(traced, receiver):
    # OpenTelemetry's HTTP conventions: no route, no `http.route` ("GET other" before).
    assert traced.client.get("/no/such/path").status_code == 404
    spans = receiver.wait_for(lambda spans: any(s.kind == 2 and s.name == "GET" for s in spans))
    (span,) = [s for s in spans if s.kind == 2 and s.name == "GET"]
    assert "http.route" not in span.attributes
    assert span.attributes["http.response.status_code"] == 404


def test_a_method_that_is_none_of_http_s_own_makes_no_span_name_of_its_own(traced, receiver):
    # Every method a client sent had been a span name, and an attribute value, of its own.
    odd = "QUUX" + "M" * 200
    assert traced.client.request(odd, "/infer").status_code == 405
    assert traced.client.request(odd, "/no/such/path").status_code == 404
    named = {"HTTP /infer", "HTTP"}
    spans = receiver.wait_for(lambda spans: {s.name for s in spans if s.kind == 2} >= named)
    for span in [s for s in spans if s.kind == 2 and s.name in named]:
        assert span.attributes["http.request.method"] == "_OTHER"
        assert span.attributes["http.request.method_original"] == odd[:64]
