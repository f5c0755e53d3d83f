"""Streamed answers end to end (issue #13): the real binary, real sockets, and a streaming worker
written from PROTOCOL.md alone (tests/workers/streamer.py), so that these tests are about the
proxy's side of streams.

Nothing here is timed: a stream is shown to arrive piece by piece by a worker that waits, after
its first chunk, on a file the test creates only once it has read that chunk.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import msgpack
import pytest

from conftest import ROOT

STREAMER = str(ROOT / "tests" / "workers" / "streamer.py")
SSE = {"accept": "text/event-stream"}


def events(response: httpx.Response):
    """(event, data) pairs of a Server-Sent Events answer, as they arrive."""
    name, data = "message", []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data.append(line[len("data: ") :])


def stream_all(proxy, item, headers=SSE):
    with proxy.client.stream("POST", "/infer", json=item, headers=headers) as response:
        return response, list(events(response))


def open_streams(proxy, items, stacks):
    """Opens one stream per item at once, each closed with its own ExitStack (from threads: a
    stream's headers come with its first chunk, which may wait for batch-mates)."""

    def open_one(item, stack):
        client = stack.enter_context(httpx.Client(base_url=proxy.url, timeout=30))
        return stack.enter_context(client.stream("POST", "/infer", json=item, headers=SSE))

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(open_one, items, stacks))


def ids(path) -> list[str]:
    if not path.exists():
        return []
    return [uuid.UUID(line).hex for line in path.read_text().split()]


def test_a_stream_arrives_chunk_by_chunk_and_ends_with_done(corral_factory, tmp_path):
    proxy = corral_factory(worker=STREAMER)
    gate = tmp_path / "gate"
    item = {"chunks": 3, "gate": str(gate)}
    with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert "content-length" not in response.headers
        received = events(response)
        # The worker holds the rest until the test has read the first chunk.
        assert next(received) == ("message", "c-0")
        gate.touch()
        assert list(received) == [("message", "c-1"), ("message", "c-2"), ("done", {})]
    assert proxy.metric("corral_chunks_sent_total", stage="default") == 3
    assert proxy.metric("corral_streams_open") == 0


def test_a_quiet_stream_is_kept_alive_with_comments(corral_factory, tmp_path):
    # A model thinking between chunks sent nothing: a proxy in front with an idle limit (nginx,
    # a cloud balancer: 60 s) cut the stream. A comment line now goes after each quiet spell.
    proxy = corral_factory("--stream-keepalive-ms=100", worker=STREAMER)
    gate = tmp_path / "gate"
    item = {"chunks": 2, "gate": str(gate)}
    with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
        lines = response.iter_lines()
        assert next(lines) == 'data: "c-0"'
        # The worker holds its second chunk until the test has seen a keep-alive.
        assert [next(lines) for _ in range(3)] == ["", ": keep-alive", ""]
        gate.touch()
        rest = [line for line in lines if line not in ("", ": keep-alive")]
    assert rest == ['data: "c-1"', "event: done", "data: {}"]


def test_ndjson_streams_one_object_per_line(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    headers = {"accept": "application/x-ndjson"}
    with proxy.client.stream("POST", "/infer", json={"chunks": 2}, headers=headers) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines == ["c-0", "c-1", {"done": True}]


def test_a_one_shot_client_of_a_streaming_worker_gets_every_chunk_at_once(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    response = proxy.post({"chunks": 3})
    assert response.status_code == 200
    assert response.json() == ["c-0", "c-1", "c-2"]
    # Counted as the stage's output, as a stream's are (they had been left out).
    assert proxy.metric("corral_chunks_sent_total", stage="default") == 3


def test_a_streaming_client_of_a_plain_worker_gets_one_chunk(corral_factory):
    proxy = corral_factory()  # the scripted, non-streaming worker
    response, received = stream_all(proxy, {"hello": "world"})
    assert response.status_code == 200
    (name, chunk), done = received
    assert name == "message" and chunk["echo"] == {"hello": "world"}
    assert done == ("done", {})


def test_64_concurrent_streams_each_get_their_own_chunks_in_order(corral_factory):
    proxy = corral_factory(worker=STREAMER)

    def one(n: int):
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            item = {"chunks": 5, "tag": f"s{n}"}
            with http.stream("POST", "/infer", json=item, headers=SSE) as response:
                return list(events(response))

    with ThreadPoolExecutor(64) as pool:
        streams = list(pool.map(one, range(64)))
    for n, received in enumerate(streams):
        assert received == [("message", f"s{n}-{i}") for i in range(5)] + [("done", {})]
    # Streams shared batches.
    assert proxy.metric("corral_batch_size_count", stage="default") < 64


# Any status answers a cancel: an `ok` without data from a streaming worker had been a broken
# frame, its connection closed and the batch-mate's stream ended `worker_died`.
@pytest.mark.parametrize("ack", ["end", "ok"])
def test_a_client_that_leaves_mid_stream_cancels_its_job_in_the_worker(
    corral_factory, tmp_path, ack
):
    cancels, gate = tmp_path / "cancels", tmp_path / "gate"
    proxy = corral_factory(
        "--batch-policy=fixed",
        "--max-batch-size=2",
        "--max-wait-ms=60000",
        worker=STREAMER,
        env={"STREAMER_CANCELS": str(cancels)},
    )
    leaving = {"chunks": 3, "gate": str(gate), "tag": "a", "ack": ack}
    staying = {"chunks": 3, "gate": str(gate), "tag": "b"}
    # The two jobs share one batch (it leaves only when full).
    with ExitStack() as leaves, ExitStack() as stays:
        left, kept = open_streams(proxy, [leaving, staying], [leaves, stays])
        left_id = uuid.UUID(left.headers["x-request-id"]).hex
        assert next(events(left)) == ("message", "a-0")
        leaves.close()
        # The client hung up: the worker hears of it while b's stream waits on the gate.
        proxy.wait_until(lambda: left_id in ids(cancels), what="a cancel in the worker")
        gate.touch()
        assert list(events(kept)) == [
            ("message", "b-0"),
            ("message", "b-1"),
            ("message", "b-2"),
            ("done", {}),
        ]
    assert proxy.metric("corral_streams_cancelled_total", reason="client_left") == 1
    assert proxy.metric("corral_worker_failures_total", stage="default") == 0


def test_a_slow_client_is_cancelled_and_its_batch_mates_are_not(corral_factory, tmp_path):
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--batch-policy=fixed",
        "--max-batch-size=2",
        "--max-wait-ms=60000",
        "--stream-buffer-bytes=65536",
        worker=STREAMER,
        env={"STREAMER_CANCELS": str(cancels)},
    )
    # 400 chunks of 64 KiB: more than the socket buffers take while the client reads nothing.
    slow_item = {"chunks": 400, "size": 65536, "tag": "slow"}
    with ExitStack() as slow_stack, ExitStack() as fast_stack:
        slow, fast = open_streams(
            proxy, [slow_item, {"chunks": 400, "tag": "b"}], [slow_stack, fast_stack]
        )
        slow_id = uuid.UUID(slow.headers["x-request-id"]).hex
        received = list(events(fast))
        assert received[-1] == ("done", {})
        assert len(received) == 401
        proxy.wait_until(lambda: slow_id in ids(cancels), what="the slow client cancelled")
        last = list(events(slow))[-1]
    assert last == ("error", {"error": "slow_client", "message": last[1]["message"]})
    assert proxy.metric("corral_streams_cancelled_total", reason="slow_client") == 1


def test_a_stream_outlives_the_idle_timeout_while_its_worker_is_silent(corral_factory, tmp_path):
    """A stream is a request in progress until its last event: the connection's idle clock once
    ran while its worker was silent and cut it, with no terminal event."""
    gate = tmp_path / "gate"
    proxy = corral_factory("--idle-timeout-ms=300", "--timeout-ms=60000", worker=STREAMER)
    item = {"chunks": 2, "gate": str(gate)}
    with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
        received = events(response)
        assert next(received) == ("message", "c-0")
        # A connection opened now, sending nothing, is closed by the idle timeout: once it is,
        # the stream has been silent for longer than that.
        address = proxy.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((address[0], int(address[1])), timeout=30) as idle:
            assert idle.recv(1) == b""
        gate.touch()
        assert list(received) == [("message", "c-1"), ("done", {})]


def test_a_pipelined_request_does_not_cut_a_stream_at_the_header_deadline(corral_factory, tmp_path):
    """A pipelined request's first bytes, read while a stream is written, once started the header
    clock: the stream and the request were both cut at the deadline, unanswered."""
    gate = tmp_path / "gate"
    proxy = corral_factory("--header-read-timeout-ms=300", worker=STREAMER)
    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"chunks": 2, "gate": str(gate)}).encode()
    head = (
        "POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"accept: application/x-ndjson\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(head.encode() + body)
        answer = b""
        while b'"c-0"' not in answer:
            answer += client.recv(65536)
        client.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        # As above: a silent connection's close says the header deadline has passed.
        with socket.create_connection((host, int(port)), timeout=30) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert slow.recv(1) == b""
        gate.touch()
        while answer.count(b"HTTP/1.1 200") < 2:
            more = client.recv(65536)
            assert more, f"the connection was closed: {answer!r}"
            answer += more
    assert b'"c-1"' in answer


def test_a_worker_dying_mid_stream_ends_its_streams_with_an_error(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    response, received = stream_all(proxy, {"chunks": 5, "die_after": 2})
    assert response.status_code == 200
    assert received[:2] == [("message", "c-0"), ("message", "c-1")]
    assert received[2][0] == "error" and received[2][1]["error"] == "worker_died"
    assert len(received) == 3
    # Service restored by the restarted worker.
    proxy.wait_for_log(r"worker connected", count=2)
    assert stream_all(proxy, {"chunks": 1})[1] == [("message", "c-0"), ("done", {})]


def test_a_failure_after_chunks_is_an_error_event(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    _, received = stream_all(proxy, {"chunks": 5, "fail_after": 1})
    assert received[0] == ("message", "c-0")
    assert received[1] == (
        "error",
        {"error": "worker_error", "message": "RuntimeError: scripted failure"},
    )


def test_64_streams_with_a_bad_chunk_each_are_each_cancelled_once(corral_factory, tmp_path):
    """At the sizes and concurrency users send: 64 clients at once, chunks of 100 kB (a chunks
    frame of 32 jobs is 3 MB, past any socket buffer). Each stream fails alone, and the worker
    is told to stop each job exactly once (a second cancel used to follow when the client's
    answer ended before the worker's `end`)."""
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--max-wait-ms=0", worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)}
    )
    item = {"chunks": 3, "bad_chunk_after": 1, "size": 100_000}
    with ThreadPoolExecutor(64) as pool:
        streams = list(pool.map(lambda _: stream_all(proxy, item)[1], range(64)))
    for received in streams:
        assert received[0][0] == "message" and len(received[0][1]) == 100_000
        assert received[1][0] == "error" and received[1][1]["error"] == "bad_output"
        assert len(received) == 2
    proxy.wait_until(lambda: len(set(ids(cancels))) == 64, what="a cancel for every job")
    # Frames reach the worker in order: once it streams a later job, every cancel sent before
    # that job's batch has been read (and logged).
    assert stream_all(proxy, {"chunks": 1})[1] == [("message", "c-0"), ("done", {})]
    assert len(ids(cancels)) == 64, "each job cancelled once"


def test_a_chunk_that_is_not_one_msgpack_value_fails_its_job_alone(corral_factory, tmp_path):
    # Passed on, it reached the client as an answer that does not decode, or a value short.
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--max-wait-ms=0", worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)}
    )
    _, received = stream_all(proxy, {"chunks": 3, "bad_chunk_after": 1})
    assert received[0] == ("message", "c-0")
    assert received[1][0] == "error" and received[1][1]["error"] == "bad_output"
    assert "not one msgpack value" in received[1][1]["message"]
    assert len(received) == 2
    # The worker is told to stop that job.
    proxy.wait_until(lambda: len(ids(cancels)) == 1, what="the cancel of the broken job")
    answer = proxy.post({"chunks": 3, "bad_chunk_after": 1})
    assert (answer.status_code, answer.json()["error"]) == (500, "bad_output")
    # The worker kept the protocol: the connection lives on.
    assert stream_all(proxy, {"chunks": 1})[1] == [("message", "c-0"), ("done", {})]
    assert not [line for line in proxy.lines if "protocol error" in line]


def test_a_broken_first_chunk_is_still_its_batch_s_first_chunk(corral_factory, tmp_path):
    # Skipped as a chunk, its batch had no time to first chunk (or, without `cancel`, the whole
    # stream's, taken at its `end`): a sample missing from the histogram and admission's model.
    cancels = tmp_path / "cancels"
    proxy = corral_factory(worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)})
    answer = proxy.post({"chunks": 3, "bad_chunk_after": 0}, headers=SSE)
    assert (answer.status_code, answer.json()["error"]) == (500, "bad_output")
    proxy.wait_until(lambda: ids(cancels), what="the cancel of the broken job")
    # The worker ended that job before it streams this one: its end has been read by then.
    assert stream_all(proxy, {"chunks": 1})[1] == [("message", "c-0"), ("done", {})]
    assert proxy.metric("corral_time_to_first_chunk_seconds_count", stage="default") == 2


def test_an_end_that_carries_data_is_a_bad_output_not_data_dropped(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    _, received = stream_all(proxy, {"chunks": 1, "end_with_data": True})
    assert received[0] == ("message", "c-0")
    assert received[1][0] == "error" and received[1][1]["error"] == "bad_output"
    assert "an end carries none" in received[1][1]["message"]


def test_no_result_of_a_frame_that_breaks_a_rule_is_used_and_its_job_is_retried(
    corral_factory, tmp_path
):
    proxy = corral_factory(worker=STREAMER)
    once = tmp_path / "broken-once"
    # The first worker answers the job twice in one frame: the connection ends, the answer in
    # that frame is not used, and the job goes to the restarted worker.
    answer = proxy.post({"chunks": 2, "break_once": str(once)})
    assert answer.status_code == 200, answer.text
    assert answer.json() == ["c-0", "c-1"]
    assert [line for line in proxy.lines if "answers a job answered before in the frame" in line]
    assert proxy.metric("corral_jobs_retried_total", stage="default") == 1


def test_an_offer_made_as_the_last_job_ends_lapses(corral_factory):
    # A join loop offers room right after its last result: whether the proxy sees it while the
    # worker still holds jobs is a race, so neither way may break the connection.
    proxy = corral_factory(worker=STREAMER, env={"STREAMER_JOIN": "4"})
    for _ in range(3):
        item = {"chunks": 1, "pull_after_end": True}
        assert stream_all(proxy, item)[1] == [("message", "c-0"), ("done", {})]
    assert not [line for line in proxy.lines if "protocol error" in line]
    assert len(proxy.worker_pids()) == 1


def test_no_first_chunk_by_the_deadline_is_a_plain_408(corral_factory, tmp_path):
    proxy = corral_factory(worker=STREAMER)
    item = {"chunks": 1, "gate_first": str(tmp_path / "never")}
    response = proxy.post(item, headers={**SSE, "x-corral-timeout-ms": "300"})
    assert response.status_code == 408
    assert response.json()["error"] == "deadline_exceeded"


def test_a_stream_answered_408_while_queued_leaves_the_queue_at_once(corral_factory, tmp_path):
    # It stayed queued (in the depth, /readyz and the prediction, not yet counted as expired)
    # until the busy worker came back for more.
    proxy = corral_factory("--max-batch-size=1", worker=STREAMER)
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(stream_all, proxy, {"chunks": 1, "gate_first": str(gate)})
        proxy.wait_until(
            lambda: proxy.metric("corral_batch_size_count", stage="default") == 1,
            what="the worker busy",
        )
        queued = proxy.post({"chunks": 1}, headers={**SSE, "x-corral-timeout-ms": "300"})
        assert queued.status_code == 408
        proxy.wait_until(
            lambda: proxy.metric("corral_queue_depth", stage="default") == 0,
            timeout=10,
            what="the expired job out of the queue while the worker is still busy",
        )
        assert proxy.metric("corral_jobs_expired_total", where="queue") == 1
        gate.touch()
        response, received = busy.result()
    assert response.status_code == 200 and received[-1] == ("done", {})


@pytest.mark.parametrize("accept", [SSE, {}], ids=["stream", "one-shot"])
def test_a_stream_that_never_sent_a_chunk_is_no_time_to_first_chunk(
    corral_factory, tmp_path, accept
):
    # Its deadline passed before any chunk: the worker's end, acknowledging the cancel, had been
    # taken for the batch's first answer (a time to first chunk for a client that got a 408,
    # and a batch admission learned as faster than it was).
    cancels = tmp_path / "cancels"
    proxy = corral_factory(worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)})
    never = {"chunks": 1, "gate_first": str(tmp_path / "never")}
    late = proxy.post(never, headers={**accept, "x-corral-timeout-ms": "300"})
    assert late.status_code == 408
    proxy.wait_until(lambda: ids(cancels), what="the cancel in the worker")
    # The worker ended that job before it streams this one: its end has been read by then.
    _, received = stream_all(proxy, {"chunks": 2})
    assert received == [("message", "c-0"), ("message", "c-1"), ("done", {})]
    assert proxy.metric("corral_time_to_first_chunk_seconds_count", stage="default") == 1
    # Nor is that end a late result (it carries none, and acknowledges the cancel): each
    # first chunk's deadline missed had read as work done for nobody. An expiry in the worker.
    assert proxy.metric("corral_late_results_total") == 0
    assert proxy.metric("corral_jobs_expired_total", where="worker") == 1


@pytest.mark.parametrize("nan_after", [0, 1])
def test_a_stream_the_proxy_ends_for_a_chunk_json_cannot_write_is_no_cancellation(
    corral_factory, tmp_path, nan_after
):
    # The client got its error (a plain 500 before any chunk, an error event after one); the
    # worker, told to stop, ended the job, and that end had been counted as a client gone.
    cancels = tmp_path / "cancels"
    proxy = corral_factory(worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)})
    item = {"chunks": 3, "nan_after": nan_after, "gate": str(tmp_path / "never")}
    response, received = stream_all(proxy, item)
    if nan_after == 0:
        assert response.status_code == 500
    else:
        assert received[0] == ("message", "c-0") and received[-1][0] == "error", received
    proxy.wait_until(lambda: ids(cancels), what="the worker told to stop")
    # Its end is read before the next stream's first chunk (one worker, one socket).
    assert stream_all(proxy, {"chunks": 1})[1][-1] == ("done", {})
    assert proxy.metric("corral_jobs_cancelled_total", where="worker") == 0


def test_a_stream_past_its_timeout_ends_with_an_error_and_is_cancelled(corral_factory, tmp_path):
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--stream-timeout-ms=500", worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)}
    )
    item = {"chunks": 3, "gate": str(tmp_path / "never")}
    with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
        job = uuid.UUID(response.headers["x-request-id"]).hex
        received = list(events(response))
    assert received[0] == ("message", "c-0")
    assert received[1][0] == "error" and received[1][1]["error"] == "deadline_exceeded"
    # Which bound it was: not the job's deadline, which bounded only the first chunk.
    assert received[1][1]["message"] == "the stream ran past its stream timeout of 500 ms"
    proxy.wait_until(lambda: job in ids(cancels), what="the job cancelled in the worker")
    assert proxy.metric("corral_streams_cancelled_total", reason="deadline") == 1
    # Its client had a 200 and the error event: the job the worker then ended was cancelled,
    # not answered 408, and its end is no late result (both had been counted).
    proxy.wait_until(
        lambda: (
            proxy.metric("corral_jobs_cancelled_total", where="worker")
            + proxy.metric("corral_jobs_expired_total", where="worker")
            == 1
        ),
        what="the worker's end of the cancelled job counted",
    )
    assert proxy.metric("corral_jobs_expired_total", where="worker") == 0
    assert proxy.metric("corral_late_results_total") == 0


def raw_stream(proxy, item) -> socket.socket:
    """A stream requested on a socket with a small receive buffer, which the test reads at its
    own pace (httpx's reads go through buffers of their own)."""
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps(item).encode()
    head = (
        "POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_stream_timeout_ends_a_stream_whose_client_is_always_behind(corral_factory, tmp_path):
    # The worker writes faster than the client reads, so chunks are always waiting in the
    # buffer: the timeout had waited for an empty buffer, and the stream (and its worker) ran
    # on for as long as the worker wrote.
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--stream-timeout-ms=1000",
        "--stream-buffer-bytes=67108864",
        worker=STREAMER,
        env={"STREAMER_CANCELS": str(cancels)},
    )
    started = time.monotonic()
    # Chunks a hundred a frame: the buffer never empties, however loaded the machine.
    with raw_stream(proxy, {"chunks": 100_000_000, "size": 100, "burst": 100}) as sock:
        tail = b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            piece = sock.recv(1024)
            assert piece, "the connection closed before the stream ended"
            tail = (tail + piece)[-1024:]
            time.sleep(0.002)  # a client slower than the worker: not waiting for anything
            # A guard against the old behaviour's endless stream, not a measure of speed.
            assert time.monotonic() - started < 60, "the stream outlived its timeout by far"
    assert b"event: error" in tail and b"deadline_exceeded" in tail, tail
    proxy.wait_until(lambda: len(ids(cancels)) == 1, what="the job cancelled in the worker")


def test_a_stream_whose_client_stalls_is_cancelled_in_the_worker_at_its_timeout(
    corral_factory, tmp_path
):
    # The answer notices its timeout only when its client takes the next event: one that never
    # reads (a full window) left the worker streaming on, uncancelled, past the timeout.
    cancels = tmp_path / "cancels"
    proxy = corral_factory(
        "--stream-timeout-ms=6000",
        "--stream-buffer-bytes=67108864",
        worker=STREAMER,
        env={"STREAMER_CANCELS": str(cancels)},
    )
    # About 1 MB/s: the socket's buffers fill within the timeout, and the answer stops taking
    # events; 64 MiB of buffer would hold the rest for a minute (then `slow_client`).
    item = {"chunks": 100_000_000, "size": 1000, "burst": 10, "step_ms": 10}
    with raw_stream(proxy, item):  # never read
        proxy.wait_until(lambda: len(ids(cancels)) == 1, what="the worker told")
        # Its job counts as cancelled once the worker ends it, the client still connected.
        proxy.wait_until(
            lambda: proxy.metric("corral_jobs_cancelled_total", where="worker") == 1,
            what="the job counted as cancelled",
        )
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0


def test_a_slow_client_that_then_leaves_is_counted_once(corral_factory, tmp_path):
    cancels = tmp_path / "cancels"
    proxy = corral_factory(worker=STREAMER, env={"STREAMER_CANCELS": str(cancels)})
    with raw_stream(proxy, {"chunks": 100_000, "size": 100, "burst": 1000}):
        proxy.wait_until(lambda: len(ids(cancels)) == 1, what="the slow client cancelled")
    # It left without reading its error event: not also a client that left.
    proxy.wait_until(lambda: proxy.metric("corral_streams_open") == 0, what="the stream closed")
    assert proxy.metric("corral_streams_cancelled_total", reason="slow_client") == 1
    assert proxy.metric("corral_streams_cancelled_total", reason="client_left") == 0


def test_a_first_answer_with_no_json_form_is_a_plain_500_not_a_stream(corral_factory):
    # A plain worker's one answer holds NaN: nothing has gone to the client, so the error is
    # still a plain one (it had been a 200 whose one event was the error).
    proxy = corral_factory()
    body = msgpack.packb({"echo": float("nan")})
    headers = {**SSE, "content-type": "application/msgpack"}
    response = proxy.client.post("/infer", content=body, headers=headers)
    assert response.status_code == 500
    assert response.json()["error"] == "unrepresentable_output"


def test_accept_on_several_lines_is_read_as_one_list(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    for lines in (
        [("accept", "application/json"), ("accept", "text/event-stream;q=1")],
        [("accept", "text/event-stream"), ("accept", "application/json;q=0.5")],
    ):
        response = proxy.client.post("/infer", json={"chunks": 2}, headers=lines)
        assert response.headers["content-type"].startswith("text/event-stream"), lines


def test_a_longer_deadline_does_not_lift_the_stream_timeout(corral_factory, tmp_path):
    """--stream-timeout-ms bounds a whole stream, as the README says, also where the job's
    deadline is later (it ran to the deadline before: here 10 minutes)."""
    proxy = corral_factory("--stream-timeout-ms=500", "--timeout-ms=600000", worker=STREAMER)
    item = {"chunks": 3, "gate": str(tmp_path / "never")}
    headers = {**SSE, "x-corral-timeout-ms": "600000"}
    with proxy.client.stream("POST", "/infer", json=item, headers=headers) as response:
        received = list(events(response))
    assert received[0] == ("message", "c-0")
    assert received[1][0] == "error" and received[1][1]["error"] == "deadline_exceeded"
    # Before its first chunk too: a job held that long is a 408, not a 10-minute wait.
    item = {"chunks": 1, "gate_first": str(tmp_path / "never")}
    response = proxy.post(item, headers=headers)
    assert response.status_code == 408 and response.json()["error"] == "deadline_exceeded"


def test_a_streamed_job_s_timeout_ms_is_no_more_than_its_stream_timeout(corral_factory):
    """PROTOCOL.md: a deadline later than the stream timeout does not lift it, and `timeout_ms`
    is then what is left of the stream timeout (a worker skipping work by it must not count on
    the ten minutes its client asked for)."""
    proxy = corral_factory("--stream-timeout-ms=2000", "--timeout-ms=600000", worker=STREAMER)
    item = {"chunks": 2, "say_timeout": True}
    response, received = stream_all(proxy, item, headers={**SSE, "x-corral-timeout-ms": "600000"})
    assert response.status_code == 200
    (name, timeout_ms), rest = received[0], received[1:]
    assert name == "message" and 0 < timeout_ms <= 2000
    assert rest == [("message", "c-1"), ("done", {})]
    # A deadline shorter than the stream timeout is the one the worker is given.
    response, received = stream_all(proxy, item, headers={**SSE, "x-corral-timeout-ms": "1500"})
    assert response.status_code == 200 and 0 < received[0][1] <= 1500


def test_a_new_job_joins_a_running_batch(corral_factory, tmp_path):
    joined, gate = tmp_path / "joined", tmp_path / "gate"
    proxy = corral_factory(
        worker=STREAMER, env={"STREAMER_JOIN": "4", "STREAMER_JOINED": str(joined)}
    )
    long_item = {"chunks": 3, "gate": str(gate), "tag": "long"}
    with proxy.client.stream("POST", "/infer", json=long_item, headers=SSE) as long_stream:
        long_events = events(long_stream)
        assert next(long_events) == ("message", "long-0")
        # The long job holds the worker (it waits on the gate); a new job joins it and runs to
        # its end meanwhile. Without joining it would wait for the long one (and time out).
        with httpx.Client(base_url=proxy.url, timeout=30) as other:
            with other.stream(
                "POST", "/infer", json={"chunks": 2, "tag": "new"}, headers=SSE
            ) as new:
                new_id = uuid.UUID(new.headers["x-request-id"]).hex
                assert list(events(new)) == [
                    ("message", "new-0"),
                    ("message", "new-1"),
                    ("done", {}),
                ]
        assert ids(joined) == [new_id]
        gate.touch()
        assert list(long_events) == [("message", "long-1"), ("message", "long-2"), ("done", {})]


def pipeline_config(tmp_path, streaming_stage_first: bool, stream_timeout_ms: int = 300_000):
    python, scripted = sys.executable, str(ROOT / "tests" / "workers" / "scripted.py")
    streamer = f'command = ["{python}", "{STREAMER}"]\nstream_timeout_ms = {stream_timeout_ms}'
    plain = f'command = ["{python}", "{scripted}"]'
    first, last = (streamer, plain) if streaming_stage_first else (plain, streamer)
    path = tmp_path / "corral.toml"
    path.write_text(
        f"[stages.first]\n{first}\n\n[stages.last]\n{last}\n\n"
        '[pipelines.two]\nstages = ["first", "last"]\n\n'
        '[routes.infer]\npath = "/infer"\npipeline = "two"\n'
    )
    return str(path)


def test_only_the_last_stage_of_a_pipeline_may_stream(corral_factory, tmp_path):
    proxy = corral_factory("--config", pipeline_config(tmp_path, True), worker=None)
    proxy.wait_for_log(r"only the last stage of a pipeline may stream")
    assert proxy.metric("corral_worker_failures_total", stage="first", reason="refused") >= 1


def test_a_pipeline_streams_from_its_last_stage_within_its_stream_timeout(corral_factory, tmp_path):
    config = pipeline_config(tmp_path, False, stream_timeout_ms=2000)
    proxy = corral_factory("--config", config, worker=None)
    proxy.wait_for_log(r"worker connected", count=2)
    # The first stage (the scripted worker) echoes the item to the streaming last stage.
    _, received = stream_all(proxy, {"chunks": 2})
    assert received == [("message", "c-0"), ("message", "c-1"), ("done", {})]
    # A stream held past the last stage's stream_timeout_ms ends with an error event.
    _, received = stream_all(proxy, {"chunks": 2, "gate": str(tmp_path / "never")})
    assert received[0] == ("message", "c-0")
    assert received[1][0] == "error" and received[1][1]["error"] == "deadline_exceeded"


def test_shutdown_ends_open_streams_with_an_error_after_the_grace_period(corral_factory, tmp_path):
    proxy = corral_factory("--grace-period-ms=300", worker=STREAMER)
    item = {"chunks": 3, "gate": str(tmp_path / "never")}
    with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
        received = events(response)
        assert next(received) == ("message", "c-0")
        proxy.proc.send_signal(signal.SIGTERM)
        rest = list(received)
    assert len(rest) == 1 and rest[0][0] == "error"
    assert rest[0][1]["error"] == "shutting_down"
    assert proxy.proc.wait(timeout=30) == 0


def test_a_worker_sending_signs_of_life_without_pause_while_idle_gets_work_and_is_stopped(
    corral_factory,
):
    # The idle worker's wait read its inbox first, and frames that lapse (signs of life) coming
    # without end kept it from ever looking at the next batch or the proxy's stop: the request
    # ended 408 beside a connected worker, and the worker was never told `shutdown` (a spawned
    # one was killed as one that ignored it; an external one kept the proxy from exiting).
    proxy = corral_factory("--timeout-ms=15000", worker=STREAMER, env={"STREAMER_IDLE_FLOOD": "1"})
    response, received = stream_all(proxy, {"chunks": 2})
    assert response.status_code == 200
    assert received == [("message", "c-0"), ("message", "c-1"), ("done", {})]
    assert proxy.stop() == 0
    assert not [line for line in proxy.lines if "did not exit" in line], proxy.lines[-20:]


def test_a_worker_that_streams_steadily_is_never_hung(corral_factory):
    # The hung clock counts from the worker's last frame: a stream of 15 steps of 100 ms outlasts
    # --batch-timeout-ms 1000 without ever leaving the worker silent that long.
    proxy = corral_factory("--batch-timeout-ms=1000", worker=STREAMER)
    _, received = stream_all(proxy, {"chunks": 15, "step_ms": 100})
    assert received == [("message", f"c-{i}") for i in range(15)] + [("done", {})]
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0


def test_a_client_s_short_deadline_bounds_the_first_chunk_not_a_pause_mid_stream(
    corral_factory,
):
    """The deadline bounds a stream's first chunk only; the worker may pause mid-stream as long
    as the route's own timeout allows. The client's 300 ms once bounded the worker's silence
    too: a 1.5 s pause after the first chunk got the worker killed as hung (worker_died). (Here
    1 s and a 3 s pause: time for a first chunk on a loaded machine; the old bound was 2 s.)"""
    proxy = corral_factory("--timeout-ms=10000", worker=STREAMER)
    headers = {**SSE, "x-corral-timeout-ms": "1000"}
    _, received = stream_all(proxy, {"chunks": 2, "step_ms": 3000}, headers=headers)
    assert received == [("message", "c-0"), ("message", "c-1"), ("done", {})]
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0


def test_a_plain_worker_that_declared_cancel_hears_of_a_one_shot_client_leaving(
    corral_factory, tmp_path
):
    cancels = tmp_path / "cancels"
    patient = str(ROOT / "tests" / "workers" / "patient.py")
    proxy = corral_factory(worker=patient, env={"PATIENT_CANCELS": str(cancels)})
    # The worker answers only once told: the deadline passing (408) is what tells it.
    # 1 s: time for the job to reach the worker on a loaded machine before its deadline.
    response = proxy.post({"x": 1}, headers={"x-corral-timeout-ms": "1000"})
    assert response.status_code == 408
    job = uuid.UUID(response.headers["x-request-id"]).hex
    proxy.wait_until(lambda: job in ids(cancels), what="the cancel in the worker")
    # It answered the cancelled job; the late result is dropped and counted.
    proxy.wait_until(lambda: proxy.metric("corral_late_results_total"), what="the late result")


def test_a_worker_silent_after_its_stream_was_cut_off_is_not_hung(corral_factory, tmp_path):
    # A slow client is cut off (its job answered early) and the worker takes 1.5 s to end that
    # job, sending nothing meanwhile. Its silence is within the job's allowance (the route's 5 s):
    # the worker is not hung (it once was, a second after the cut, and was killed).
    cancels, ended = tmp_path / "cancels", tmp_path / "ended"
    proxy = corral_factory(
        "--stream-buffer-bytes=65536",
        worker=STREAMER,
        env={"STREAMER_CANCELS": str(cancels), "STREAMER_ENDED": str(ended)},
    )
    slow_item = {"chunks": 400, "size": 65536, "linger_ms": 1500}
    with ExitStack() as stack:
        (slow,) = open_streams(proxy, [slow_item], [stack])
        job = uuid.UUID(slow.headers["x-request-id"]).hex
        proxy.wait_until(lambda: job in ids(cancels), what="the slow client cut off")
        proxy.wait_until(lambda: job in ids(ended), timeout=30, what="the job ended")
    assert stream_all(proxy, {"chunks": 1})[1] == [("message", "c-0"), ("done", {})]
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0
    assert proxy.metric("corral_worker_restarts_total") == 0


def test_a_request_of_several_items_cannot_be_streamed(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    response = proxy.post([{"chunks": 1}], headers={**SSE, "x-corral-items": "many"})
    assert response.status_code == 400
    assert "cannot be streamed" in response.json()["message"]


def unread(proxy_port: int, client_port: int) -> int | None:
    """Bytes the proxy has not read yet from the connection of `client_port` (its receive queue
    in /proc/net/tcp); None while the kernel lists no such socket."""
    local, remote = f"0100007F:{proxy_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[1], 16)
    return None


def read_answer(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """An HTTP/1.1 answer the proxy ends by closing the connection: status line, headers, body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return status, headers, body


def test_a_stream_open_when_the_drain_begins_finishes_and_new_requests_are_refused(
    corral_factory, tmp_path
):
    """README: at SIGTERM Corral stops accepting connections, answers new requests 503
    `shutting_down` (with `Connection: close`), and lets what is in flight finish within the grace
    period; an open stream is in flight: it gets its remaining chunks and `done`, then the proxy
    exits 0. The grace period here is far longer than the test, so only a drain that cut the
    stream short could end it early. A keep-alive connection idle at the signal is closed at
    once (the idle timeout here is far longer too), not left open for the drain's length."""
    proxy = corral_factory("--grace-period-ms=100000", "--idle-timeout-ms=600000", worker=STREAMER)
    host, port = proxy.url.removeprefix("http://").split(":")
    port = int(port)
    gate = tmp_path / "gate"
    # A client whose request is on its way at the signal: its connection is open and its head
    # half sent (more than the 24 bytes hyper reads to tell HTTP/1.1 from h2), and read by the
    # proxy. The rest comes during the drain.
    late = socket.create_connection((host, port), timeout=30)
    late.sendall(b"POST /infer HTTP/1.1\r\nhost: corral\r\ncontent-type: application/json\r\n")
    client_port = late.getsockname()[1]
    proxy.wait_until(lambda: unread(port, client_port) == 0, what="the half head read")
    # A keep-alive connection that had its answer and sits idle.
    idle = socket.create_connection((host, port), timeout=30)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nhost: corral\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += idle.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += idle.recv(65536)
    try:
        item = {"chunks": 3, "gate": str(gate)}
        with proxy.client.stream("POST", "/infer", json=item, headers=SSE) as response:
            assert response.status_code == 200
            received = events(response)
            assert next(received) == ("message", "c-0")  # the worker now holds the rest
            proxy.proc.send_signal(signal.SIGTERM)
            proxy.wait_for_log(r"no longer accepting HTTP connections")

            # During the drain: the idle keep-alive connection is closed at once...
            assert idle.recv(65536) == b""
            # ...a new connection is refused...
            with pytest.raises(httpx.ConnectError):
                httpx.post(proxy.url + "/infer", json={"chunks": 1}, timeout=30)
            # ...and the request whose head ends now is answered 503, its connection closed.
            late.sendall(b"content-length: 13\r\n\r\n" + b'{"chunks": 1}')
            status, headers, body = read_answer(late)
            assert status == "HTTP/1.1 503 Service Unavailable"
            assert headers["connection"] == "close"
            assert headers["retry-after"] == "1"
            assert json.loads(body)["error"] == "shutting_down"

            # The stream still runs: released, it ends as if nothing had happened.
            assert proxy.proc.poll() is None
            gate.touch()
            assert list(received) == [("message", "c-1"), ("message", "c-2"), ("done", {})]
    finally:
        late.close()
        idle.close()
    assert proxy.proc.wait(timeout=30) == 0
    assert not proxy.socket.exists()
    proxy.stop()  # reads the log to its end
    assert not any("grace period ran out" in line for line in proxy.lines)


def test_a_streaming_client_gets_no_plain_worker_of_an_earlier_stage_killed(
    corral_factory, tmp_path
):
    """The stream timeout (0.8 s) had become the hung limit of the stages before the last: a
    plain worker of the first stage, holding a streaming client's batch past 1.8 s (its route
    allows 20 s), was killed as hung. A client's `Accept` had got a healthy worker killed. Its
    client is answered 408 at the stream timeout; the worker keeps its connection and answers."""
    from corral import _protocol as protocol

    config = tmp_path / "corral.toml"
    config.write_text(
        "timeout_ms = 20000\n[stages.a]\n[stages.s]\nstream_timeout_ms = 800\n"
        '[pipelines.as]\nstages = ["a", "s"]\n[routes.as]\npipeline = "as"\n'
    )
    proxy = corral_factory("--config", str(config), worker=None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
        plain.connect(str(proxy.socket))
        plain.sendall(protocol.encode_frame(protocol.hello("a", 1, "plain")))
        proxy.wait_for_log(r"worker connected")
        stream = plain.makefile("rb")
        headers = {"accept": "application/x-ndjson"}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(proxy.client.post, "/as", json=1, headers=headers)
            batch = protocol.read_frame(stream)
            assert answer.result(timeout=30).status_code == 408
            # Held past the stream timeout + 1 s (counted from the batch): a hung worker's
            # connection had been closed there. Nothing comes from the proxy before the limit
            # of its route (20 s + 1 s), so a read that times out is the worker kept.
            plain.settimeout(2.5)
            with pytest.raises(TimeoutError):
                stream.read(1)
    assert not [line for line in proxy.lines if "hung" in line], proxy.lines[-5:]
    del batch
