"""`server-timing` and `x-corral-batch-size` end to end: on one-shot answers, on several items,
on a protocol's envelope, on a pipeline and on a stream, against the real binary. The scripted
worker reports the size of the batch it saw, which the header must match."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from test_failures import received
from test_pipelines import ARITH_TOML, write

STREAMER = str(ROOT / "tests" / "workers" / "streamer.py")
# A batch of 4 leaves the moment it is full; the long wait keeps a smaller one from leaving early.
BATCH = ("--max-batch-size", "4", "--max-wait-ms", "2000")


def timing(response) -> dict[str, float]:
    """The `server-timing` parts by name, in milliseconds."""
    parts = {}
    for part in response.headers["server-timing"].split(","):
        match = re.fullmatch(r"\s*(\w+);dur=([\d.]+)\s*", part)
        assert match, response.headers["server-timing"]
        parts[match.group(1)] = float(match.group(2))
    return parts


def check_parts(response) -> dict[str, float]:
    parts = timing(response)
    assert set(parts) == {"queue", "batch", "total"}, parts
    # Cut to whole microseconds each: the parts may exceed the total by that much at most.
    assert parts["queue"] + parts["batch"] <= parts["total"] + 0.002, parts
    return parts


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    corral = Corral(tmp_path_factory.mktemp("timing"), *BATCH)
    yield corral
    corral.stop()


def test_a_single_request_has_its_batch_of_one_and_parts_within_the_total(proxy):
    answer = proxy.client.post("/infer", json={"sleep_ms": 30})
    assert answer.status_code == 200, answer.text
    assert answer.json()["batch_size"] == 1
    assert answer.headers["x-corral-batch-size"] == "1"
    parts = check_parts(answer)
    assert parts["batch"] >= 30, parts


def test_every_answer_of_a_burst_names_the_batch_it_rode_in(proxy):
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: proxy.client.post("/infer", json={"n": i}), range(4)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        # However the burst was cut into batches, each answer names the batch it rode in.
        assert answer.headers["x-corral-batch-size"] == str(answer.json()["batch_size"])
        check_parts(answer)


def test_several_items_name_their_largest_batch(proxy):
    items = [{"n": i} for i in range(4)]
    answer = proxy.client.post("/infer", json=items, headers={"x-corral-items": "many"})
    assert answer.status_code == 200, answer.text
    assert [item["batch_size"] for item in answer.json()] == [4] * 4
    assert answer.headers["x-corral-batch-size"] == "4"
    check_parts(answer)


def test_a_protocols_envelope_carries_them_too(proxy):
    body = {"instances": [{"n": i} for i in range(4)]}
    answer = proxy.client.post("/v1/models/default:predict", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-corral-batch-size"] == "4"
    check_parts(answer)


def test_an_answer_without_a_batch_has_its_total_only(corral_factory, tmp_path):
    # A proxy of its own: the batch cost it learns is this test's 500 ms batch alone (the module's
    # earlier, faster batches in the fit once let the 100 ms job in, to its 408 in a CI run).
    proxy = corral_factory(*BATCH, workers=1)
    answer = proxy.client.get("/healthz")
    assert set(timing(answer)) == {"total"}
    assert "x-corral-batch-size" not in answer.headers
    # A deadline no batch can meet: shed at admission, no batch ran. The only worker is held
    # meanwhile: on an idle stage the job could go in as a probe of the prediction instead.
    assert proxy.post({"sleep_ms": 500}).status_code == 200  # a batch costs 500 ms here
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(proxy.post, {"hold": str(gate)})
        proxy.wait_until(
            lambda: proxy.metric("corral_workers_busy", stage="default") == 1, what="held"
        )
        # 100 ms: time for the body to arrive after the head (a 1 ms deadline can make that a
        # 408 `body_timeout` on a loaded machine), far short of a batch.
        shed = proxy.client.post("/infer", json={"n": 1}, headers={"x-corral-timeout-ms": "100"})
        gate.touch()
        assert held.result().status_code == 200
    assert shed.status_code == 503, shed.text
    assert set(timing(shed)) == {"total"}
    assert "x-corral-batch-size" not in shed.headers


def test_a_pipeline_sums_its_stages(corral_factory, tmp_path):
    proxy = corral_factory("--config", write(tmp_path, ARITH_TOML), worker=None)
    proxy.wait_for_log(r"worker connected", count=3)
    answer = proxy.post(3)
    assert answer.status_code == 200, answer.text
    # The last stage (shift) takes one job a batch.
    assert answer.headers["x-corral-batch-size"] == "1"
    check_parts(answer)


def test_a_stream_sends_them_as_headers_at_its_first_chunk(corral_factory):
    proxy = corral_factory(worker=STREAMER)
    item = {"chunks": 2}
    with proxy.client.stream(
        "POST", "/infer", json=item, headers={"accept": "text/event-stream"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-corral-batch-size"] == "1"
        check_parts(response)
        response.read()


def test_a_408_after_the_job_reached_its_worker_says_where_its_time_went(corral_factory, tmp_path):
    """A batch ran for a job whose deadline passed while its worker held it, and a 408 is when a
    user most wants to know whether the time went to the queue or to the worker: it once had
    `total` only. A job that expired behind it in the queue, never sent, still has `total` only."""
    log = tmp_path / "received.jsonl"
    # No batch sent ahead to the busy worker: the second job must stay in the queue.
    proxy = corral_factory(
        "--max-batch-size=1",
        "--max-wait-ms=0",
        "--worker-prefetch=false",
        env={"SCRIPTED_LOG": str(log)},
    )
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            proxy.post, {"tag": "A", "hold": str(gate)}, headers={"x-corral-timeout-ms": "1000"}
        )
        proxy.wait_until(lambda: any(i.get("tag") == "A" for i in received(log)), what="A")
        # The only worker holds A until both are answered: B expires in the queue.
        queued = proxy.post({"tag": "B"}, headers={"x-corral-timeout-ms": "50"})
        in_worker = held.result()
    gate.touch()
    assert (in_worker.status_code, queued.status_code) == (408, 408)
    assert in_worker.json()["error"] == queued.json()["error"] == "deadline_exceeded"
    check_parts(in_worker)
    assert in_worker.headers["x-corral-batch-size"] == "1"
    assert set(timing(queued)) == {"total"}
    assert "x-corral-batch-size" not in queued.headers


def test_a_stream_that_times_out_before_its_first_chunk_says_where_its_time_went(
    corral_factory, tmp_path
):
    """A stream's 408 before any chunk came, its batch in the worker: `queue` and `batch` too."""
    proxy = corral_factory(worker=STREAMER)
    gate = tmp_path / "gate"
    item = {"chunks": 1, "gate_first": str(gate)}
    # 1 s: time for the job to reach the worker on a loaded machine before its deadline.
    headers = {"accept": "text/event-stream", "x-corral-timeout-ms": "1000"}
    response = proxy.client.post("/infer", json=item, headers=headers)
    gate.touch()
    assert response.status_code == 408, response.text
    check_parts(response)
    assert response.headers["x-corral-batch-size"] == "1"


def test_a_408_in_a_pipelines_second_stage_sums_both_stages(corral_factory, tmp_path):
    """-1 is doubled by `scale`, then `shift` holds -2 past the deadline: the 408 rode a batch
    in each stage, so it has `queue` and `batch` (summed over both) and shift's batch size."""
    gate = tmp_path / "gate"
    proxy = corral_factory(
        "--config", write(tmp_path, ARITH_TOML), worker=None, env={"ARITH_GATE": str(gate)}
    )
    proxy.wait_for_log(r"worker connected", count=3)
    try:
        # 1 s: time to get through `scale` to `shift` on a loaded machine.
        answer = proxy.post(-1, headers={"x-corral-timeout-ms": "1000"})
    finally:
        gate.touch()
    assert answer.status_code == 408, answer.text
    parts = check_parts(answer)
    assert answer.headers["x-corral-batch-size"] == "1"  # shift takes one job a batch
    # `batch` runs to the deadline in shift: most of the second the job had.
    assert parts["batch"] > 0 and parts["queue"] >= 0, parts


def test_the_drains_503s_say_whether_a_batch_ran(corral_factory, tmp_path):
    """At the end of the grace period a job its worker holds and one still queued are both
    answered 503 `shutting_down`. The held one rode a batch: `queue` and `batch` (to the
    503) and its batch size; the queued one has `total` only, as every answer no batch ran
    for."""
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-batch-size=1",
        "--max-wait-ms=0",
        "--worker-prefetch=false",
        "--grace-period-ms=300",
        env={"SCRIPTED_LOG": str(log)},
    )
    gate = tmp_path / "gate"
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(proxy.post, {"tag": "A", "hold": str(gate)})
            proxy.wait_until(lambda: any(i.get("tag") == "A" for i in received(log)), what="A")
            queued = pool.submit(proxy.post, {"tag": "B"})
            proxy.wait_until(lambda: proxy.metric("corral_queue_depth", stage="default") == 1)
            proxy.proc.send_signal(signal.SIGTERM)
            in_worker, in_queue = held.result(), queued.result()
    finally:
        gate.touch()
    for answer in (in_worker, in_queue):
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "shutting_down"
    check_parts(in_worker)
    assert in_worker.headers["x-corral-batch-size"] == "1"
    assert set(timing(in_queue)) == {"total"}
    assert "x-corral-batch-size" not in in_queue.headers


def test_a_slow_bodys_reading_is_not_queue_time(corral_factory):
    # The first stage's jobs enter its queue once the body is in: its reading had been counted
    # as queueing (`queue;dur` of 1,000 ms for a body sent over a second to an idle worker).
    import threading

    proxy = corral_factory("--max-wait-ms=0")
    halfway = threading.Event()

    def body():
        yield b'{"x": "'
        halfway.wait(timeout=30)
        yield b'slow"}'

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            proxy.client.post, "/infer", content=body(),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        # The stimulus: the body's second half comes 1 s after its first.
        threading.Timer(1.0, halfway.set).start()
        response = answer.result(timeout=30)
    assert response.status_code == 200, response.text
    parts = check_parts(response)
    assert parts["total"] >= 1000, parts
    assert parts["queue"] < parts["total"] / 2, parts
    assert proxy.metric("corral_queue_wait_seconds_sum", stage="default") < 0.5


def test_a_batch_sent_ahead_counts_its_wait_behind_the_one_before_as_queue(
    corral_factory, tmp_path
):
    # Sent ahead (prefetch) while its worker was busy, a batch's `batch` had counted from the
    # send: about one batch more than the worker spent on it, and almost no `queue`, blaming
    # the model for what was queueing. `corral_batch_duration_seconds` counted it right.
    proxy = corral_factory("--max-batch-size=1", "--max-wait-ms=0")
    gate = tmp_path / "gate"
    # A batch goes ahead only once the stage has learned what one costs.
    assert proxy.post({"n": 0}).status_code == 200
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(proxy.client.post, "/infer", json={"hold": str(gate)})
        proxy.wait_until(
            lambda: proxy.metric("corral_batch_size_count", stage="default") == 2,
            what="the worker holding the first batch",
        )
        ahead = pool.submit(proxy.client.post, "/infer", json={"n": 1})
        proxy.wait_until(
            lambda: proxy.metric("corral_batches_sent_ahead_total", stage="default") == 1,
            what="the second batch sent ahead",
        )
        # The second request entered before now and cannot start before the gate opens: at
        # least this long of it is queueing, whatever the machine's speed.
        hold_ms = 300
        time.sleep(hold_ms / 1000)
        gate.touch()
        assert held.result().status_code == 200
        answer = ahead.result()
    assert answer.status_code == 200, answer.text
    parts = check_parts(answer)
    assert parts["queue"] >= hold_ms, parts
