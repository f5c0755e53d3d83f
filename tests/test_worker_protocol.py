"""The proxy against scripted workers that break the protocol: each breakage costs that worker's
connection and its batch (500), never the proxy, never a hang."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest

from corral import _protocol as protocol


class FakeWorker:
    """A worker scripted by the test, speaking raw frames over the proxy's socket."""

    def __init__(self, path, version: int = protocol.PROTOCOL_VERSION, **hello_keys) -> None:
        """`hello_keys` are added to the hello (`features`, a schema)."""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.stream = self.sock.makefile("rb")
        hello = {**protocol.hello("default", os.getpid(), "fake"), **hello_keys}
        hello["version"] = version
        self.sock.sendall(protocol.encode_frame(hello))

    def receive(self):
        return protocol.read_frame(self.stream)

    def send(self, message) -> None:
        self.sock.sendall(protocol.encode_frame(message))

    def closed_by_proxy(self) -> bool:
        try:
            return self.stream.read(1) == b""
        except ConnectionResetError:
            # Closed with our unread frames still in its buffer: the kernel resets instead.
            return True

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


@pytest.fixture
def sidecar(corral_factory):
    """A proxy with no spawned workers: the tests connect their own. No retries, so that a
    broken worker's job is answered at once (retries have a test of their own)."""
    return corral_factory("--max-wait-ms=0", "--retries=0", worker=None)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def echo_back(worker, batch):
    """A well-behaved answer: each job's payload as its result."""
    worker.send(protocol.results([protocol.ok(j["id"], j["payload"]) for j in batch["jobs"]]))


def serve_one_batch(sidecar, pool, answer):
    """Connect a fake worker, send one request, let `answer(batch)` reply; return the client's
    response and the fake worker."""
    worker = FakeWorker(sidecar.socket)
    sidecar.wait_for_log(r"worker connected")
    response = pool.submit(sidecar.post, {"x": 1}, headers={"x-corral-timeout-ms": "20000"})
    batch = worker.receive()
    assert batch["type"] == "batch" and len(batch["jobs"]) == 1
    answer(worker, batch)
    return response.result(timeout=30), worker


def test_batch_carries_id_payload_and_remaining_time(sidecar, pool):
    seen = []

    def answer(worker, batch):
        job = batch["jobs"][0]
        seen.append(job)
        assert len(job["id"]) == 16
        assert 0 < job["timeout_ms"] <= 20000
        worker.send(protocol.results([protocol.ok(job["id"], job["payload"])]))

    response, worker = serve_one_batch(sidecar, pool, answer)
    assert response.status_code == 200 and response.json() == {"x": 1}
    (job,) = seen
    assert msgpack.unpackb(job["payload"]) == {"x": 1}
    # The request's id is the job id the worker saw.
    assert uuid.UUID(response.headers["x-request-id"]).bytes == job["id"]
    worker.close()


@pytest.mark.parametrize(
    "breakage",
    [
        "unknown id",
        "missing result",
        "repeated id",
        "ok without data",
        "not a map",
        "undecodable",
        "frame over the limit",
        "hello again",
        "disconnect",
        "closed mid-frame",
    ],
)
def test_a_broken_worker_costs_its_batch_and_connection_only(sidecar, pool, breakage):
    def answer(worker, batch):
        job_id = batch["jobs"][0]["id"]
        ok = protocol.ok(job_id, b"\x01")
        stranger = protocol.ok(b"?" * 16, b"\x01")
        frames = {
            "unknown id": protocol.encode_frame(protocol.results([stranger])),
            "missing result": protocol.encode_frame(protocol.results([])),
            "repeated id": protocol.encode_frame(protocol.results([ok, ok])),
            "ok without data": protocol.encode_frame(
                protocol.results([{"id": job_id, "status": "ok"}])
            ),
            "not a map": struct.pack(">I", 3) + b"\x92\x01\x02",
            "undecodable": struct.pack(">I", 2) + b"\x81\xc1",
            "frame over the limit": struct.pack(">I", 0xFFFFFFFF),
            "hello again": protocol.encode_frame(protocol.hello("default", 1, "again")),
            "disconnect": b"",
            "closed mid-frame": protocol.encode_frame(protocol.results([ok]))[:9],
        }
        if frames[breakage]:
            worker.sock.sendall(frames[breakage])
        if not frames[breakage] or breakage == "closed mid-frame":
            worker.sock.shutdown(socket.SHUT_WR)

    response, worker = serve_one_batch(sidecar, pool, answer)
    assert response.status_code == 500, response.text
    assert response.json()["error"] == "worker_died"
    assert worker.closed_by_proxy()
    worker.close()
    line = sidecar.wait_for_log(r"worker disconnected")
    assert "name=fake" in line, line  # named as its connect line names it
    if breakage == "closed mid-frame":  # said so, not as tokio-util's "bytes remaining on stream"
        assert "connection closed in the middle of a frame" in line, line

    # The proxy is unharmed: a well-behaved worker is served next.
    response, good = serve_one_batch(sidecar, pool, echo_back)
    assert response.status_code == 200
    good.close()


def test_a_broken_worker_s_job_is_retried_on_the_next_worker(corral_factory, pool):
    proxy = corral_factory("--max-wait-ms=0", worker=None)
    first = FakeWorker(proxy.socket)
    proxy.wait_for_log(r"worker connected")
    response = pool.submit(proxy.post, {"x": 1})
    job = first.receive()["jobs"][0]
    first.sock.sendall(struct.pack(">I", 3) + b"\x92\x01\x02")  # garbage
    assert first.closed_by_proxy()
    first.close()
    second = FakeWorker(proxy.socket)
    retried = second.receive()["jobs"][0]
    assert retried["id"] == job["id"] and retried["payload"] == job["payload"]
    second.send(protocol.results([protocol.ok(retried["id"], retried["payload"])]))
    assert response.result().json() == {"x": 1}
    second.close()


def test_an_incompatible_version_is_refused_with_a_reason(sidecar):
    worker = FakeWorker(sidecar.socket, version=99)
    reject = worker.receive()
    assert reject["type"] == "reject"
    assert "version 99" in reject["message"]
    assert worker.closed_by_proxy()
    worker.close()
    sidecar.wait_for_log(r"worker refused.*version 99")
    assert sidecar.client.get("/healthz").status_code == 200
    assert sidecar.client.get("/readyz").status_code == 503


def test_a_worker_for_an_unknown_stage_is_refused(sidecar):
    worker = FakeWorker(sidecar.socket)
    worker.close()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.connect(str(sidecar.socket))
    other.sendall(protocol.encode_frame(protocol.hello("resize", 1, "x")))
    stream = other.makefile("rb")
    assert "unknown stage" in protocol.read_frame(stream)["message"]
    stream.close()
    other.close()


def test_a_flood_of_unsolicited_frames_closes_that_connection_only(sidecar, pool):
    flooder = FakeWorker(sidecar.socket)
    sidecar.wait_for_log(r"worker connected")
    for _ in range(1000):  # results nobody asked for, while idle
        try:
            flooder.send(protocol.results([]))
        except OSError:
            break  # the proxy has hung up on it already
    assert flooder.closed_by_proxy()
    flooder.close()
    # A warning, as a protocol breach is an operator's to see (a worker leaving is info).
    sidecar.wait_for_log(r"WARN.*worker disconnected.*protocol error: message while idle: results")
    assert sidecar.metric("corral_worker_failures_total", stage="default", reason="protocol") == 1

    response, good = serve_one_batch(sidecar, pool, echo_back)
    assert response.status_code == 200
    good.close()


def test_a_truncated_frame_then_silence_is_a_hung_worker(corral_factory, pool):
    proxy = corral_factory("--max-wait-ms=0", "--retries=0", "--batch-timeout-ms=300", worker=None)
    worker = FakeWorker(proxy.socket)
    proxy.wait_for_log(r"worker connected")
    response = pool.submit(proxy.post, {"x": 1})
    worker.receive()
    worker.sock.sendall(struct.pack(">I", 1000) + b"\x81")  # 1 byte of 1000, then nothing
    answer = response.result(timeout=30)
    assert answer.status_code == 500 and answer.json()["error"] == "worker_died"
    assert worker.closed_by_proxy()
    worker.close()
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 1


def test_output_that_is_not_one_msgpack_value_fails_that_job_alone(sidecar, pool):
    """A result's data is checked: trailing bytes or a truncated value answer that job 500
    `bad_output` (msgpack and JSON clients alike); its batch-mates keep their answers and the
    worker keeps its connection."""
    msgpack_only = {"accept": "application/msgpack"}
    requests = {
        "good": pool.submit(sidecar.post, {"job": "good"}, headers=msgpack_only),
        "trailing": pool.submit(sidecar.post, {"job": "trailing"}, headers=msgpack_only),
        "truncated": pool.submit(sidecar.post, {"job": "truncated"}),  # answered as JSON
    }
    sidecar.wait_until(
        lambda: sidecar.metric("corral_queue_depth", stage="default") == 3, what="three queued jobs"
    )
    worker = FakeWorker(sidecar.socket)
    batch = worker.receive()
    assert len(batch["jobs"]) == 3
    data = {"good": b"\x92\x01\x02", "trailing": b"\x92\x01\x02\xc0", "truncated": b"\x92\x01"}
    worker.send(
        protocol.results(
            [
                protocol.ok(job["id"], data[msgpack.unpackb(job["payload"])["job"]])
                for job in batch["jobs"]
            ]
        )
    )
    good = requests["good"].result(timeout=30)
    assert good.status_code == 200 and good.content == data["good"]
    for name, problem in [("trailing", "1 bytes after the value"), ("truncated", "truncated")]:
        response = requests[name].result(timeout=30)
        assert response.status_code == 500, (name, response.content)
        assert response.json()["error"] == "bad_output", response.text
        assert problem in response.json()["message"]

    # The worker kept the protocol: its connection stays and it is sent the next job.
    response = pool.submit(sidecar.post, {"x": 1})
    echo_back(worker, worker.receive())
    assert response.result(timeout=30).json() == {"x": 1}
    worker.close()


@pytest.mark.parametrize(
    ("status", "code", "error"), [("invalid", 422, "invalid_input"), ("error", 500, "worker_error")]
)
@pytest.mark.parametrize("message", [None, ""])
def test_a_result_without_a_message_says_the_worker_gave_no_reason(
    sidecar, pool, status, code, error, message
):
    def answer(worker, batch):
        result = {"id": batch["jobs"][0]["id"], "status": status}
        if message is not None:
            result["message"] = message
        worker.send(protocol.results([result]))

    response, worker = serve_one_batch(sidecar, pool, answer)
    assert response.status_code == code
    assert response.json() == {"error": error, "message": "the worker gave no reason"}
    worker.close()


def test_a_job_the_worker_skips_as_expired_before_the_proxy_saw_it_is_counted(sidecar, pool):
    # The worker reads the deadline as time left, on its own clock: it may call a job expired
    # while the proxy's clock has a little left. The client's 408 comes from that answer, and
    # had been in no count.
    def answer(worker, batch):
        worker.send(protocol.results([{"id": batch["jobs"][0]["id"], "status": "expired"}]))

    response, worker = serve_one_batch(sidecar, pool, answer)
    assert response.status_code == 408
    # True with seconds left too: not "the deadline passed" (it had not).
    assert response.json() == {
        "error": "deadline_exceeded",
        "message": "the job could not be answered within its deadline",
    }
    assert sidecar.metric("corral_jobs_expired_total", where="worker") == 1
    assert sidecar.metric("corral_late_results_total") == 0, "answered in time: not late"
    worker.close()


def test_a_job_given_back_by_a_dead_worker_that_expires_in_the_queue_leaves_it(
    corral_factory, pool
):
    # Sent once, it was taken for held by a worker: at its 408 nothing purged it, and it stayed
    # in the queue's depth (aging to `high`), uncounted as expired, until a worker came back.
    proxy = corral_factory("--max-wait-ms=0", "--retries=1", worker=None)
    short = {"x-corral-timeout-ms": "1000"}
    sse = {**short, "accept": "text/event-stream"}  # a stream, before its first chunk

    def metric(name: str) -> float:
        return proxy.metric(name, stage="default")

    for round, (features, headers) in enumerate([([], short), (["stream"], sse)], start=1):
        worker = FakeWorker(proxy.socket, features=features)
        proxy.wait_for_log(r"worker connected", count=round)
        answer = pool.submit(proxy.post, {"x": round}, headers=headers)
        worker.receive()
        worker.close()  # dies holding it: the job goes back to the queue, no worker is left
        proxy.wait_until(lambda n=round: metric("corral_jobs_retried_total") == n, what="retried")
        assert answer.result(timeout=30).status_code == 408
        proxy.wait_until(lambda: metric("corral_queue_depth") == 0, what="purged")
        assert proxy.metric("corral_jobs_expired_total", where="queue") == round


def refused(sidecar, hello) -> tuple[dict | None, bool]:
    """Says `hello` as a worker would: the proxy's first frame back, and whether the proxy then
    closed the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(sidecar.socket))
        sock.sendall(protocol.encode_frame(hello))
        with sock.makefile("rb") as stream:
            return protocol.read_frame(stream), stream.read(1) == b""


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"pid": None}, "missing field `pid`"),
        ({"pid": "1234"}, 'invalid type: string "1234"'),
        ({"version": "1"}, 'invalid type: string "1"'),
        ({"version": 1.0}, "invalid type: floating point"),
        ({"stage": None}, "missing field `stage`"),
    ],
)
def test_a_malformed_hello_is_refused_with_a_reason(sidecar, change, problem):
    hello = protocol.hello("default", os.getpid(), "malformed")
    hello.update(change)
    hello = {key: value for key, value in hello.items() if value is not None}
    reject, closed = refused(sidecar, hello)
    assert reject is not None, "closed without a reject"
    assert reject["type"] == "reject"
    assert reject["message"].startswith("malformed hello: "), reject
    assert problem in reject["message"]
    assert "`pid` (an integer)" in reject["message"]  # what a hello needs
    assert closed
    sidecar.wait_for_log(r"worker refused.*malformed hello")


def test_a_hello_bounding_its_batches_to_none_is_refused(sidecar):
    hello = protocol.hello("default", os.getpid(), "nothing", max_batch=0)
    reject, closed = refused(sidecar, hello)
    assert reject["type"] == "reject" and "max_batch 0 would take no job" in reject["message"]
    assert closed


@pytest.mark.parametrize(
    ("weight", "reason"),
    [("text", "must start with /"), ("/a~2", '"a~2" has a ~ not followed by 0 or 1')],
)
def test_a_weight_that_is_no_json_pointer_is_refused_saying_why(sidecar, weight, reason):
    # "/a~2" had been refused as not starting with /.
    hello = protocol.hello("default", os.getpid(), "weighs", weight=weight)
    reject, closed = refused(sidecar, hello)
    assert reject["type"] == "reject" and reason in reject["message"], reject
    assert closed


def test_a_worker_bounding_its_batches_is_sent_none_larger(sidecar, pool):
    worker = FakeWorker(sidecar.socket, max_batch=2)
    sidecar.wait_for_log(r"worker connected")
    worker.close()  # gone: the requests below queue for the next worker
    sidecar.wait_until(lambda: sidecar.metric("corral_workers_connected") == 0, what="gone")
    answers = [pool.submit(sidecar.post, {"n": n}) for n in range(3)]
    sidecar.wait_until(lambda: sidecar.metric("corral_queue_depth") == 3, what="3 queued")
    worker = FakeWorker(sidecar.socket, max_batch=2)
    first = worker.receive()
    assert len(first["jobs"]) == 2, "bounded by the hello, not --max-batch-size"
    echo_back(worker, first)
    second = worker.receive()
    assert len(second["jobs"]) == 1
    echo_back(worker, second)
    assert sorted(a.result(timeout=30).json()["n"] for a in answers) == [0, 1, 2]
    worker.close()


def test_a_workers_name_is_logged_escaped_and_clipped(sidecar):
    """A hello's name is the worker's own words: a line break in it must not forge a log line,
    and megabytes of it must not become a log line of megabytes."""
    hello = protocol.hello("default", os.getpid(), "x")
    hello["name"] = "evil\n2026-01-01T00:00:00Z  INFO corral: FORGED line " + "n" * 5000
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(sidecar.socket))
        sock.sendall(protocol.encode_frame(hello))
        connected = sidecar.wait_for_log(r"worker connected")
    assert not any(line.startswith("2026-01-01") for line in sidecar.lines)
    assert "evil\\u{a}2026" in connected  # escaped, on the one line, as other words logged
    assert len(connected) < 1000


@pytest.mark.parametrize("where", ["hello type", "result status"])
def test_words_a_decoder_quotes_are_logged_escaped_and_clipped(sidecar, where):
    """A decoder's error quotes what it could not read (an unknown `type` or `status`): logged as
    it came, a line break in it wrote a line of the worker's choosing into the log, and megabytes
    of it a line of megabytes (a security probe's finds)."""
    forged = "x\n2026-01-01T00:00:00Z ERROR corral::http: FORGED " + "n" * 100_000
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(sidecar.socket))
        if where == "hello type":
            sock.sendall(protocol.encode_frame({"type": forged, "version": 1}))
            line = sidecar.wait_for_log(r"worker refused|connection closed before its hello")
        else:
            sock.sendall(protocol.encode_frame(protocol.hello("default", os.getpid(), "x")))
            sidecar.wait_for_log(r"worker connected")
            sock.sendall(protocol.encode_frame({"type": "results", "results": [
                {"id": b"i" * 16, "status": forged}
            ]}))  # fmt: skip
            line = sidecar.wait_for_log(r"worker disconnected")
    assert not any(line.startswith("2026-01-01") for line in sidecar.lines)
    assert "x\\u{a}2026" in line  # escaped, on the one line
    assert len(line) < 1000


@pytest.mark.parametrize(
    "outputs, reason",
    [
        (
            [{"name": "y", "datatype": "WAT", "shape": [-1]}],
            'tensor "y": unsupported datatype "WAT"',
        ),
        (
            [{"name": "y", "datatype": "FP32", "shape": [3]}] * 2,
            'tensor "y" is declared twice',  # it was listed twice in every answer
        ),
        (
            [{"name": "y", "datatype": "FP32", "shape": [-5]}],
            'tensor "y": a dimension is a length or -1 (any), not -5',  # taken as "any"
        ),
        (
            [{"name": "", "datatype": "FP32", "shape": [1]}],
            "a tensor's name is empty",  # served as "", which no v2 client names
        ),
    ],
)
def test_tensors_declared_so_that_they_cannot_be_served_are_refused_with_a_reason(
    sidecar, outputs, reason
):
    hello = protocol.hello("default", os.getpid(), "odd", outputs=outputs)
    reject, closed = refused(sidecar, hello)
    assert reject is not None and reject["type"] == "reject" and closed
    assert reason in reject["message"], reject


def test_a_refusal_naming_another_worker_s_tensors_forges_no_log_line(sidecar):
    """The connected worker's tensor names are its own words: one with a line break wrote a
    line of its choosing into Corral's log, one of megabytes a line as long (each refusal)."""
    forged = "x\n2026-11-27T13:00:00.000000Z ERROR corral: FORGED" + "y" * 100_000
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
        first.connect(str(sidecar.socket))
        inputs = [{"name": forged, "datatype": "FP32", "shape": [-1] * 1000}]
        first.sendall(protocol.encode_frame(protocol.hello("default", 1, "a", inputs=inputs)))
        sidecar.wait_for_log(r"worker connected")
        other = [{"name": "z", "datatype": "INT64", "shape": [5]}]
        reject, _ = refused(sidecar, protocol.hello("default", 2, "b", inputs=other))
        assert reject["type"] == "reject" and len(reject["message"]) < 4_000, len(reject["message"])
        line = sidecar.wait_for_log(r"worker refused.*served under other tensors")
    assert not any(line.startswith("2026-11-27T13:00:00") for line in sidecar.lines)
    assert len(line) < 4_000, len(line)


def test_a_worker_declaring_other_tensors_than_the_connected_ones_is_refused(sidecar):
    """The latest hello's tensors won silently and stayed: with A (FP32 [3]) and B (INT64 [5])
    on one stage, a request fitting A was refused 400 and one fitting B was sent to A."""
    fp32 = [{"name": "x", "datatype": "FP32", "shape": [3]}]
    int64 = [{"name": "x", "datatype": "INT64", "shape": [5]}]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
        first.connect(str(sidecar.socket))
        first.sendall(protocol.encode_frame(protocol.hello("default", 1, "a", inputs=fp32)))
        sidecar.wait_for_log(r"worker connected")
        # The same tensors join; others are refused, naming the ones served.
        same = protocol.hello("default", 2, "a2", inputs=fp32)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
            second.connect(str(sidecar.socket))
            second.sendall(protocol.encode_frame(same))
            sidecar.wait_for_log(r"worker connected", count=2)
        reject, closed = refused(sidecar, protocol.hello("default", 3, "b", inputs=int64))
        assert reject is not None and reject["type"] == "reject" and closed
        served = 'is served under other tensors (inputs: "x" FP32 [3]; outputs: none)'
        assert served in reject["message"]
        metadata = sidecar.client.get("/v2/models/default").json()
        assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    # With none connected, a newcomer's tensors replace what the last ones left.
    sidecar.wait_until(lambda: sidecar.metric("corral_workers_connected", stage="default") == 0,
                       what="no worker connected")  # fmt: skip
    with joined(sidecar, protocol.hello("default", 4, "b", inputs=int64), count=3):
        metadata = sidecar.client.get("/v2/models/default").json()
        assert metadata["inputs"] == [{"name": "x", "datatype": "INT64", "shape": [-1, 5]}]


@contextlib.contextmanager
def joined(sidecar, hello: dict, count: int):
    """A worker that said `hello` and was taken, the `count`-th to connect, until the block ends."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(sidecar.socket))
        sock.sendall(protocol.encode_frame(hello))
        sidecar.wait_for_log(r"worker connected", count=count)
        yield sock


def test_a_worker_declaring_no_tensors_keeps_no_departed_worker_s_tensors_in_force(sidecar):
    """A worker that declares none is not compared, and holds no tensors either: with it the
    only one connected, a departed worker's tensors had refused every newcomer of others, in
    the name of "the 1 worker(s) connected" (a probe's worker written from PROTOCOL.md)."""
    fp32 = [{"name": "a", "datatype": "FP32", "shape": [3]}]
    int64 = [{"name": "b", "datatype": "INT64", "shape": [5]}]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
        plain.connect(str(sidecar.socket))
        plain.sendall(protocol.encode_frame(protocol.hello("default", 1, "plain")))
        sidecar.wait_for_log(r"worker connected")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
            first.connect(str(sidecar.socket))
            first.sendall(protocol.encode_frame(protocol.hello("default", 2, "a", inputs=fp32)))
            sidecar.wait_for_log(r"worker connected", count=2)
            # While it is connected, others are refused.
            reject, _ = refused(sidecar, protocol.hello("default", 3, "b", inputs=int64))
            assert reject is not None and "served under other tensors" in reject["message"]
        sidecar.wait_until(
            lambda: sidecar.metric("corral_workers_connected", stage="default") == 1,
            what="the worker of tensors gone",
        )
        with joined(sidecar, protocol.hello("default", 4, "b", inputs=int64), count=3):
            metadata = sidecar.client.get("/v2/models/default").json()
            assert metadata["inputs"] == [{"name": "b", "datatype": "INT64", "shape": [-1, 5]}]


def left_behind(sidecar, tensors: list) -> None:
    """A worker of `tensors` connects and leaves: its tensors stay declared, with no worker."""
    old = FakeWorker(sidecar.socket, inputs=tensors)
    sidecar.wait_for_log(r"worker connected")
    old.close()
    sidecar.wait_until(lambda: sidecar.metric("corral_workers_connected", stage="default") == 0,
                       what="its worker gone")  # fmt: skip


def test_a_v2_row_queued_under_tensors_a_newcomer_replaced_is_answered_503_not_sent(sidecar, pool):
    """A v2 request queued after the last worker of tensors `x` left was read against `x`; a
    newcomer of tensors `y` was sent it as a row of `x` (PROTOCOL.md had called it a known
    limit). It is answered 503 `tensors_changed` with Retry-After, and sent again it is read
    against the newcomer's tensors and served."""
    x = [{"name": "x", "datatype": "FP32", "shape": [3]}]
    y = [{"name": "y", "datatype": "INT64", "shape": [2]}]
    left_behind(sidecar, x)
    infer = "/v2/models/default/infer"
    of_x = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    within = {"x-corral-timeout-ms": "8000"}
    queued = pool.submit(sidecar.client.post, infer, json=of_x, headers=within)
    sidecar.wait_until(lambda: sidecar.metric("corral_queue_depth", stage="default") == 1,
                       what="the row of x queued")  # fmt: skip
    new = FakeWorker(sidecar.socket, inputs=y)
    response = queued.result(timeout=30)
    assert response.status_code == 503, response.text
    assert "tensors changed while the request was queued" in response.json()["error"]
    assert response.headers["retry-after"] == "1"
    of_y = {"inputs": [{"name": "y", "datatype": "INT64", "shape": [1, 2], "data": [4, 5]}]}
    again = pool.submit(sidecar.client.post, infer, json=of_y, headers=within)
    batch = new.receive()
    assert batch["type"] == "batch" and len(batch["jobs"]) == 1, batch
    row = msgpack.unpackb(batch["jobs"][0]["payload"])
    assert list(row) == ["y"], row
    echo_back(new, batch)
    answer = again.result(timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [4, 5]
    new.close()


def test_a_kserve_v1_body_is_read_against_the_tensors_in_force_once_it_is_in(sidecar, pool):
    """KServe v1 read the declared tensors before the body's upload: tensors replaced during a
    slow one, a body of the newcomer's instances was read against the old ones (400), and one
    of the old was answered 503 `tensors_changed`. Read once the body is in, as v2 does."""
    from test_http_edge import connect, read_all

    x = [{"name": "x", "datatype": "FP32", "shape": [3]}]
    y = [{"name": "y", "datatype": "FP32", "shape": [2]}]
    old = FakeWorker(sidecar.socket, inputs=x)
    sidecar.wait_for_log(r"worker connected")
    body = json.dumps({"instances": [[1.5, 2.5]]}).encode()
    with connect(sidecar) as conn:
        conn.sendall(
            b"POST /v1/models/default:predict HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
            b"content-type: application/json\r\nexpect: 100-continue\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
        )
        # hyper says 100 Continue as the handler first reads the body: past its head now.
        assert conn.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        old.close()
        sidecar.wait_until(lambda: sidecar.metric("corral_workers_connected", stage="default") == 0,
                           what="the worker of x gone")  # fmt: skip
        new = FakeWorker(sidecar.socket, inputs=y)
        sidecar.wait_for_log(r"worker connected", count=2)
        conn.sendall(body)
        batch = new.receive()
        assert list(msgpack.unpackb(batch["jobs"][0]["payload"])) == ["y"], batch
        echo_back(new, batch)
        answer = read_all(conn)
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer
    assert json.loads(rest) == {"predictions": [{"y": [1.5, 2.5]}]}
    new.close()


def test_16_multi_mib_v2_requests_queued_under_replaced_tensors_are_each_answered_503(sidecar):
    """At users' sizes: 16 clients, each of 8 rows of 256 KiB (2 MiB of tensor data a request,
    128 jobs queued), all read against `x`; a newcomer of `y` joins. Every one is answered 503
    `tensors_changed`, and none of their rows reaches the newcomer: its first batch is the
    request of `y` sent after."""
    x = [{"name": "x", "datatype": "FP32", "shape": [65536]}]
    y = [{"name": "y", "datatype": "INT64", "shape": [2]}]
    left_behind(sidecar, x)
    infer = "/v2/models/default/infer"
    rows = {"name": "x", "datatype": "FP32", "shape": [8, 65536], "data": [0] * (8 * 65536)}
    # Encoded once (16 threads encoding 2 MiB of JSON each took a loaded machine past the wait).
    body = json.dumps({"inputs": [rows]}).encode()
    within = {"x-corral-timeout-ms": "60000", "content-type": "application/json"}
    with ThreadPoolExecutor(16) as clients:
        queued = [clients.submit(sidecar.client.post, infer, content=body, headers=within,
                                 timeout=90) for _ in range(16)]  # fmt: skip
        sidecar.wait_until(lambda: sidecar.metric("corral_queue_depth", stage="default") == 128,
                           timeout=90, what="16 requests of 8 rows queued")  # fmt: skip
        new = FakeWorker(sidecar.socket, inputs=y)
        answers = [response.result(timeout=60) for response in queued]
        assert [a.status_code for a in answers] == [503] * 16, [a.text[:200] for a in answers]
        assert all(a.headers["retry-after"] == "1" for a in answers)
        of_y = {"inputs": [{"name": "y", "datatype": "INT64", "shape": [1, 2], "data": [4, 5]}]}
        again = clients.submit(sidecar.client.post, infer, json=of_y, headers=within)
        batch = new.receive()
        assert [list(msgpack.unpackb(job["payload"])) for job in batch["jobs"]] == [["y"]]
        echo_back(new, batch)
        assert again.result(timeout=30).status_code == 200
    new.close()


def test_two_hellos_of_other_tensors_at_once_on_an_empty_stage_are_never_both_taken(sidecar):
    """Each hello was checked against the workers connected, then joined: two at once on an
    empty stage each saw none, and workers of other tensors served it together (18 rounds in
    300). Every round must refuse one of the two. Against the old code a round is caught only
    when the hellos race, so this catches it most runs, not every one."""
    tensors = [
        [{"name": "a", "datatype": "FP32", "shape": [2]}],
        [{"name": "b", "datatype": "INT64", "shape": [3]}],
    ]
    for round_ in range(40):
        frames = [protocol.encode_frame(protocol.hello("default", 1 + i, "w", inputs=t))
                  for i, t in enumerate(tensors)]  # fmt: skip
        socks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in frames]
        for sock in socks:
            sock.settimeout(10)
            sock.connect(str(sidecar.socket))
        for sock, frame in zip(socks, frames):
            sock.sendall(frame)
        # The one refused is told so; the one taken hears nothing until it is sent a batch.
        # Whichever was refused, a worker taken never sees a reject.
        streams = [sock.makefile("rb") for sock in socks]
        refused = round_ + 1
        sidecar.wait_until(
            lambda refused=refused: sidecar.metric(
                "corral_worker_failures_total", stage="default", reason="refused"
            ) >= refused,
            timeout=5,
            what=f"one of the two refused in round {round_}",
        )  # fmt: skip
        for stream, sock in zip(streams, socks):
            stream.close()
            sock.close()
        sidecar.wait_until(
            lambda: sidecar.metric("corral_workers_connected", stage="default") == 0,
            what="no worker connected",
        )
    assert sidecar.metric("corral_worker_failures_total", stage="default", reason="refused") == 40


def test_a_map_with_a_key_twice_is_passed_through_as_is(sidecar, pool):
    """PROTOCOL.md: a result map with a key twice (msgpack allows it) reaches a msgpack client as
    sent and a JSON client as an object with that name twice, in order: the proxy transcodes,
    it does not rebuild the map (which would keep one of the two)."""
    packer = msgpack.Packer()
    # {"a": 1, "b": [{"k": "first", "k": "second"}], "a": 2}, written header by header.
    data = (
        packer.pack_map_header(3)
        + packer.pack("a") + packer.pack(1)
        + packer.pack("b") + packer.pack_array_header(1)
        + packer.pack_map_header(2)
        + packer.pack("k") + packer.pack("first")
        + packer.pack("k") + packer.pack("second")
        + packer.pack("a") + packer.pack(2)
    )  # fmt: skip
    assert msgpack.unpackb(data) == {"a": 2, "b": [{"k": "second"}]}  # a dict keeps one
    requests = {
        "json": pool.submit(sidecar.post, {"client": "json"}),
        "msgpack": pool.submit(
            sidecar.post, {"client": "msgpack"}, headers={"accept": "application/msgpack"}
        ),
    }
    sidecar.wait_until(
        lambda: sidecar.metric("corral_queue_depth", stage="default") == 2, what="two queued jobs"
    )
    worker = FakeWorker(sidecar.socket)
    batch = worker.receive()
    assert len(batch["jobs"]) == 2
    worker.send(protocol.results([protocol.ok(job["id"], data) for job in batch["jobs"]]))

    as_json = requests["json"].result(timeout=30)
    assert as_json.status_code == 200, as_json.text
    assert as_json.headers["content-type"] == "application/json"
    pairs = json.loads(as_json.text, object_pairs_hook=lambda pairs: pairs)
    assert pairs == [("a", 1), ("b", [[("k", "first"), ("k", "second")]]), ("a", 2)]
    as_msgpack = requests["msgpack"].result(timeout=30)
    assert as_msgpack.status_code == 200
    assert as_msgpack.headers["content-type"] == "application/msgpack"
    assert as_msgpack.content == data  # byte for byte
    worker.close()


def one_full_batch(corral_factory, pool, size: int):
    """A proxy with no retries, `size` requests sent, and the fake worker holding them in one
    batch (sent once full): the proxy, the worker, the answers to come and the batch's jobs."""
    proxy = corral_factory(
        "--batch-policy=fixed",
        f"--max-batch-size={size}",
        "--max-wait-ms=60000",
        "--retries=0",
        "--timeout-ms=60000",
        worker=None,
    )
    worker = FakeWorker(proxy.socket)
    answers = [pool.submit(proxy.post, {"i": i}) for i in range(size)]
    jobs = worker.receive()["jobs"]
    assert len(jobs) == size
    return proxy, worker, answers, jobs


def test_a_frame_that_breaks_a_rule_tells_no_client_another_s_request_id(corral_factory, pool):
    """Every client of the batch is told why its worker failed; the message named the repeated
    result by its job's id, which is one client's `x-request-id`, to all three."""
    _, worker, answers, jobs = one_full_batch(corral_factory, pool, 3)
    first = protocol.ok(jobs[0]["id"], b"\x01")
    worker.send(protocol.results([first, first]))
    responses = [answer.result(timeout=30) for answer in answers]
    ids = [uuid.UUID(bytes=job["id"]) for job in jobs]
    for response in responses:
        assert response.status_code == 500
        message = response.json()["message"]
        assert "the result at index 1 of the frame answers a job answered before" in message
        for id in ids:
            assert str(id) not in message and id.hex not in message, message
    worker.close()


@pytest.mark.parametrize(
    "data", ["alice's answer: token=s3cr3t", 73317, 0.73317], ids=["str", "int", "float"]
)
def test_a_value_of_the_wrong_type_in_a_frame_is_not_quoted_to_the_batch_s_clients(
    corral_factory, pool, data
):
    """One client's output written as `str` (as old msgpack writers write bytes) or as a number
    broke the frame, and the decoder's quote of it reached the other client of the batch in its
    500."""
    proxy, worker, answers, jobs = one_full_batch(corral_factory, pool, 2)
    secret = str(data).removeprefix("alice's answer: token=")
    results = [
        {"id": jobs[0]["id"], "status": "ok", "data": data},  # not the `bin` that is due
        {"id": jobs[1]["id"], "status": "ok", "data": b"\x01"},
    ]
    worker.send({"type": "results", "results": results})
    for answer in answers:
        response = answer.result(timeout=30)
        assert response.status_code == 500
        message = response.json()["message"]
        assert message.endswith("frame is not a valid message (the proxy's log says why)")
        assert secret not in message, message
    # The operator's log keeps the whole reason.
    assert secret in proxy.wait_for_log(r"worker disconnected")
    worker.close()


def test_a_multi_mib_output_of_the_wrong_type_reaches_none_of_64_batch_mates(corral_factory):
    """At the sizes users send: one client's 4 MiB output written as `str` (a frame larger than
    the socket's buffer) in a batch of 64; each of the 64 is told only that the frame was not a
    message, and the log's line is cut to a few hundred bytes."""
    secret = "s3cr3t" * (4 * 1024 * 1024 // 6)
    with ThreadPoolExecutor(64) as pool:
        proxy, worker, answers, jobs = one_full_batch(corral_factory, pool, 64)
        results = [{"id": job["id"], "status": "ok", "data": b"\x01"} for job in jobs]
        results[17]["data"] = secret
        worker.send({"type": "results", "results": results})
        messages = [answer.result(timeout=60).json()["message"] for answer in answers]
    assert {len(messages)} == {64}
    assert set(messages) == {
        "the worker failed: protocol error: frame is not a valid message (the proxy's log says why)"
    }
    line = proxy.wait_for_log(r"worker disconnected")
    assert "s3cr3t" in line and len(line) < 1_000, len(line)
    worker.close()


def test_answering_the_batch_sent_ahead_first_is_named_as_such(corral_factory, pool):
    """It said "result for unknown or repeated job id X" of a job the worker held."""
    proxy = corral_factory("--max-batch-size=1", "--max-wait-ms=0", "--retries=0", worker=None)
    worker = FakeWorker(proxy.socket)
    # One batch answered first: nothing goes ahead before the stage has learned a batch's cost.
    warm = pool.submit(proxy.post, "w")
    job = worker.receive()["jobs"][0]
    worker.send(protocol.results([protocol.ok(job["id"], job["payload"])]))
    assert warm.result(timeout=30).status_code == 200
    first = pool.submit(proxy.post, "a")
    batch = worker.receive()
    second = pool.submit(proxy.post, "b")
    ahead = worker.receive()  # sent while the worker holds the first
    proxy.wait_until(
        lambda: proxy.metric("corral_batches_sent_ahead_total", stage="default") >= 1,
        what="the second batch counted as sent ahead",
    )
    worker.send(protocol.results([protocol.ok(job["id"], b"\xc0") for job in ahead["jobs"]]))
    line = proxy.wait_for_log(r"worker disconnected")
    assert "of the batch sent after the one being answered" in line, line
    assert "answer batches in the order they came" in line
    assert first.result(timeout=30).status_code == 500
    assert second.result(timeout=30).status_code == 500
    assert batch["jobs"][0]["id"] != ahead["jobs"][0]["id"]
    worker.close()


def silent_connections(proxy, count: int) -> list[socket.socket]:
    """`count` connections to the worker socket that say nothing (the caller closes them)."""
    silent = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)  # a full backlog blocks a connect: a failure, not a hang
        sock.connect(str(proxy.socket))
        silent.append(sock)
    return silent


def test_connections_that_never_say_hello_are_bounded(corral_factory):
    # Each one held a descriptor (and a task) until the 10 s hello timeout: 1,100 of them took
    # every descriptor, and HTTP, probes included, could not accept. Past the bound (32 more
    # than the workers spawned, here 1), a connection waits a moment for a slot (100 ms), then
    # is closed.
    proxy = corral_factory()
    silent = silent_connections(proxy, 33)
    try:
        # Accepted in order: the one after them finds the bound reached, waits, and is closed.
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.append(extra)
        extra.connect(str(proxy.socket))
        extra.settimeout(5)  # the hello timeout (10 s) would close it too: not that
        assert extra.recv(1) == b""
        proxy.wait_for_log(r"yet to say hello")
        # The connected worker and HTTP serve on.
        assert proxy.client.get("/healthz").status_code == 200
        assert proxy.post({"n": 1}).status_code == 200
    finally:
        for sock in silent:
            sock.close()


def test_connected_workers_corral_did_not_spawn_are_bounded(sidecar):
    # Each holds a descriptor, buffers and a task: a peer saying hello on connection after
    # connection took the descriptors HTTP needs. 128 are let in.
    hello = protocol.encode_frame(protocol.hello("default", os.getpid(), "many"))
    connected = []
    count = lambda: sidecar.metric("corral_workers_connected", stage="default")  # noqa: E731
    try:
        # All at once, each saying hello as it connects (workers reconnecting together after a
        # restart): the accept loop outran the tasks reading the hellos, and past 32 waiting to
        # say hello the rest were closed (54 of 128).
        for _ in range(128):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(sidecar.socket))
            sock.sendall(hello)
            connected.append(sock)
        sidecar.wait_until(lambda: count() == len(connected), what="all connected")
        reject, closed = refused(sidecar, protocol.hello("default", os.getpid(), "one more"))
        assert reject["type"] == "reject"
        assert "128 connected workers it did not spawn" in reject["message"]
        assert closed
        # One leaves: its place is free again.
        connected.pop().close()
        sidecar.wait_until(lambda: count() == 127, what="one gone")
        again = FakeWorker(sidecar.socket)
        sidecar.wait_until(lambda: count() == 128, what="let in again")
        again.close()
    finally:
        for sock in connected:
            sock.close()


def test_a_sign_of_life_sent_as_a_streaming_workers_last_job_ends_is_no_breach(sidecar, pool):
    # An empty `chunks` frame racing the end of the worker's last job reached an idle
    # connection and closed it as "message while idle" (a `pull` there was already forgiven).
    worker = FakeWorker(sidecar.socket, features=["stream"])
    sidecar.wait_for_log(r"worker connected")
    try:
        for n in range(2):
            response = pool.submit(sidecar.post, {"n": n})
            (job,) = worker.receive()["jobs"]
            worker.send(protocol.results([protocol.ok(job["id"], b"\x01")]))
            worker.send(protocol.chunks([]))
            assert response.result().status_code == 200
        assert not any("message while idle" in line for line in sidecar.lines)
    finally:
        worker.close()


def test_a_streaming_worker_holding_a_job_past_its_stream_timeout_is_hung(corral_factory, pool):
    # A worker that does not listen for `cancel` keeps the job and sends signs of life: they
    # reset the silence clock, and it held its seat for ever (no batch again, nothing logged).
    proxy = corral_factory(
        "--stream-timeout-ms=500", "--timeout-ms=500", "--retries=0", worker=None
    )
    worker = FakeWorker(proxy.socket, features=["stream"])
    proxy.wait_for_log(r"worker connected")
    started = time.monotonic()
    try:
        response = pool.submit(proxy.post, {"n": 1}, headers={"accept": "text/event-stream"})
        (job,) = worker.receive()["jobs"]
        worker.send(protocol.chunks([protocol.chunk(job["id"], msgpack.packb("first"))]))
        try:
            while True:  # a sign of life every 100 ms, the job never ended
                worker.send(protocol.chunks([]))
                time.sleep(0.1)  # the worker's own pace, not a wait for an event
                # A guard against the old behaviour's endless hold, not a measure of speed.
                assert time.monotonic() - started < 30, "the worker kept its job"
        except (BrokenPipeError, ConnectionResetError):
            pass  # the proxy closed the connection: the worker is hung
        assert response.result().status_code == 200  # its stream had begun
        proxy.wait_for_log(r"held a job past its stream timeout of 500 ms by more than 1500 ms")
        assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 1
    finally:
        worker.close()


def test_a_schema_over_8_mib_is_ignored_not_copied_into_openapi(sidecar):
    # One of 50 MB made /openapi.json 209 MB and the proxy's memory 1.2 GB.
    huge = json.dumps({"type": "object", "description": "x" * (9 * 1024 * 1024)})
    worker = FakeWorker(sidecar.socket, input_schema=huge)
    try:
        sidecar.wait_for_log(r"worker connected")
        sidecar.wait_for_log(r"ignoring a worker's schema larger than 8 MiB")
        document = sidecar.client.get("/openapi.json")
        assert document.status_code == 200 and len(document.content) < 1024 * 1024
    finally:
        worker.close()


def test_a_spawned_worker_is_let_in_while_silent_connections_hold_the_hello_slots(
    corral_factory,
):
    # The slots for connections yet to say hello are not a spawned worker's to wait for: a
    # restarted one was turned away until the hello timeout (10 s) freed them. Nor is the
    # waiting room past them: waited out in the accept loop, 100 ms a connection, 300 silent
    # ones kept a restarted worker out for 20 s.
    import signal

    proxy = corral_factory()
    pid = proxy.post({"n": 1}).json()["pid"]  # it has served: restarted without delay
    silent = silent_connections(proxy, 300)
    try:
        os.kill(pid, signal.SIGKILL)
        proxy.wait_for_log(r"worker connected", count=2, timeout=8)
        assert proxy.post({"n": 2}).status_code == 200
    finally:
        for sock in silent:
            sock.close()


@pytest.mark.parametrize(
    "acknowledgement",
    [{"status": "end"}, {"status": "end", "data": b"\x01"}, {"status": "ok"}],
    ids=["end", "end with data", "ok without data"],
)
def test_a_plain_worker_may_end_a_job_it_was_told_to_cancel(sidecar, pool, acknowledgement):
    # PROTOCOL.md: a worker that declared `cancel` is told of the held jobs whose client left
    # or whose deadline passed, streaming or not, and answers each with any status, `end` the
    # usual one. From a worker that did not declare `stream`, that `end` had been taken for a
    # broken frame: its connection closed, and its batch-mate's client got a 500 (with data, or
    # an `ok` without data, until the probes of session 31).
    short = pool.submit(sidecar.post, {"x": "short"}, headers={"x-corral-timeout-ms": "3000"})
    live = pool.submit(sidecar.post, {"x": "live"}, headers={"x-corral-timeout-ms": "60000"})
    depth = lambda: sidecar.metric("corral_queue_depth", stage="default")  # noqa: E731
    sidecar.wait_until(lambda: depth() == 2, what="both queued")
    worker = FakeWorker(sidecar.socket, features=["cancel"])
    batch = worker.receive()
    ids = {msgpack.unpackb(job["payload"])["x"]: job["id"] for job in batch["jobs"]}
    assert set(ids) == {"short", "live"}, "one batch holds both"
    assert short.result(timeout=30).status_code == 408
    assert worker.receive() == protocol.cancel([ids["short"]])
    worker.send(
        protocol.results(
            [
                {"id": ids["short"], **acknowledgement},
                protocol.ok(ids["live"], msgpack.packb("done")),
            ]
        )
    )
    answer = live.result(timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == "done"
    # The connection lives on: the next request reaches the same worker.
    after = pool.submit(sidecar.post, {"x": "after"})
    echo_back(worker, worker.receive())
    assert after.result(timeout=30).json() == {"x": "after"}
    worker.close()


def test_a_joining_worker_that_pulls_and_never_reads_is_sent_no_more(corral_factory, pool):
    # A streaming worker may offer room (`pull`) while it holds jobs; one that kept offering
    # and never read its socket was answered every time: the queue went into frames waiting to
    # be written to it, job after job, each client ending 408 beside an idle worker and each
    # payload held until the stream timeout. An offer is answered only once the worker has
    # read what it was sent before.
    proxy = corral_factory("--max-wait-ms=0", "--retries=0", "--timeout-ms=60000", worker=None)
    reader = FakeWorker(proxy.socket, features=["stream", "join", "cancel"])
    proxy.wait_for_log(r"worker connected")
    first = pool.submit(proxy.post, {"x": 0})
    assert len(reader.receive()["jobs"]) == 1
    # From here it only offers room, and reads nothing: a frame larger than the socket
    # buffers stays unwritten.
    heavy = "y" * (1 << 20)
    sent = lambda: proxy.metric("corral_batch_size_count", stage="default")  # noqa: E731
    depth = lambda: proxy.metric("corral_queue_depth", stage="default")  # noqa: E731
    reader.send(protocol.pull(1))
    joined = pool.submit(proxy.post, {"x": 1, "heavy": heavy})
    proxy.wait_until(lambda: sent() == 2 and depth() == 0, what="the offer answered")
    # Offered again, with that frame unwritten: the next job waits for another worker.
    reader.send(protocol.pull(1))
    waiting = pool.submit(proxy.post, {"x": 2, "heavy": heavy})
    proxy.wait_until(lambda: depth() == 1, what="a job left for another worker")
    healthy = FakeWorker(proxy.socket)
    echo_back(healthy, healthy.receive())
    assert waiting.result(timeout=30).status_code == 200
    assert sent() == 3
    reader.close()  # what it was sent dies with it (no retries)
    assert joined.result(timeout=30).status_code == 500
    assert first.result(timeout=30).status_code == 500
    healthy.close()


def test_kserve_v1_says_a_streaming_worker_s_chunks_are_no_map_of_its_outputs(sidecar, pool):
    """A streaming worker's one-shot answer is the array of its chunks: KServe v1, held to the
    declared outputs, says so and what to serve it from (the message had no test)."""
    outputs = [{"name": "y", "datatype": "FP32", "shape": [1]}]
    worker = FakeWorker(sidecar.socket, features=["stream"], outputs=outputs)
    sidecar.wait_for_log(r"worker connected")
    try:
        answer = pool.submit(
            sidecar.client.post, "/v1/models/default:predict", json={"instances": [1]}
        )
        (job,) = worker.receive()["jobs"]
        worker.send(protocol.chunks([{"id": job["id"], "data": msgpack.packb({"y": [1.0]})}]))
        worker.send(protocol.results([{"id": job["id"], "status": "end"}]))
        response = answer.result(timeout=30)
        assert response.status_code == 500, response.text
        message = response.json()["error"]
        assert "not a map from output name to its value, not an array" in message, message
        assert "serve KServe v1 from one that returns one map per instance" in message, message
    finally:
        worker.close()
