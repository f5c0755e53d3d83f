"""Overload without collapse: deadline-aware admission, deadlines wherever a job is,
cancellation of jobs whose client left, late results dropped and counted."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from test_failures import received, shed_behind_a_held_job


def test_503_deadline_unreachable_when_the_predicted_finish_is_too_late(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory("--max-batch-size=1", "--max-wait-ms=0", env={"SCRIPTED_LOG": str(log)})
    # Teach the proxy what a batch costs here: about 2 s.
    assert proxy.post({"tag": "learn", "sleep_ms": 2000}).status_code == 200
    # On the idle stage the first such job goes in all the same, as a probe of a prediction that
    # may be stale; this one finds the model as slow as learned (held until the next is shed).
    # Its 1 s is time enough to reach the worker on a loaded machine, and half the cost.
    short = {"x-corral-timeout-ms": "1000"}
    gate = tmp_path / "gate"
    probe = {"tag": "probe", "sleep_ms": 300, "hold": str(gate)}
    assert proxy.post(probe, headers=short).status_code == 408
    # The worker is still busy with it: this one is shed.
    shed = proxy.post({"tag": "hopeless"}, headers=short)
    gate.touch()
    assert shed.status_code == 503
    assert shed.json()["error"] == "deadline_unreachable"
    assert int(shed.headers["retry-after"]) >= 1
    # One batch outlasts its whole deadline, whatever the load: no retry meets it, and the
    # message says so (it had said to retry later).
    assert "longer deadline" in shed.json()["message"], shed.text
    # A job whose deadline allows the predicted finish is admitted.
    assert proxy.post({"tag": "fine"}, headers={"x-corral-timeout-ms": "5000"}).status_code == 200
    assert [i["tag"] for i in received(log)] == ["learn", "probe", "fine"]
    assert proxy.metric("corral_jobs_shed_total", reason="deadline_unreachable") == 1


def test_a_request_too_heavy_for_its_deadline_even_alone_is_told_so(corral_factory):
    """Its own weight, at the learned cost, outlasts its deadline on an idle stage: the message
    says so (a longer deadline or fewer items), beside the Retry-After every shed carries (the
    learned cost may be stale: the model may have become faster)."""
    proxy = corral_factory("--max-batch-size=1", "--max-wait-ms=0")
    # Teach the proxy a cost by weight: about 10 ms a unit (batches of 1 and of 100).
    for weight, sleep_ms in [(1, 20), (100, 1000)]:
        taught = proxy.post({"sleep_ms": sleep_ms}, headers={"x-corral-weight": str(weight)})
        assert taught.status_code == 200
    short = {"x-corral-timeout-ms": "2000"}
    for _ in range(2):
        heavy = proxy.post({"heavy": True}, headers={**short, "x-corral-weight": "1000"})
        assert heavy.status_code == 503, heavy.text
        assert heavy.json()["error"] == "deadline_unreachable"
        assert int(heavy.headers["retry-after"]) >= 1
        assert "longer deadline or fewer items" in heavy.json()["message"]
    # A light one on the same deadline is served: it is the weight, not the stage.
    assert proxy.post({"light": True}, headers={**short, "x-corral-weight": "1"}).status_code == 200


def test_one_slow_batch_does_not_shut_short_deadlines_out(corral_factory):
    """One batch took 2 s (a cold start, a pause); the model is fast again. Every request with
    1.5 s to live was once refused for good: predicted to miss, none ran to teach otherwise."""
    proxy = corral_factory("--max-wait-ms=0")
    assert proxy.post({"sleep_ms": 2000}).status_code == 200
    short = {"x-corral-timeout-ms": "1500"}
    answers = [proxy.post({"n": n}, headers=short).status_code for n in range(20)]
    assert answers == [200] * 20, answers


def test_the_worker_is_told_the_remaining_time(corral_factory):
    proxy = corral_factory("--max-wait-ms=0")
    body = proxy.post({"x": 1}, headers={"x-corral-timeout-ms": "3000"}).json()
    # Less the little time it spent before its batch left, not a bound the proxy made up.
    assert 2000 < body["timeout_ms"] <= 3000


def test_a_late_result_is_dropped_and_counted(corral_factory, tmp_path):
    proxy = corral_factory("--max-wait-ms=0")
    gate = tmp_path / "gate"
    # The worker answers only once the client has had its 408 (1 s: time to reach the worker
    # first, even on a loaded machine).
    late = proxy.post({"hold": str(gate)}, headers={"x-corral-timeout-ms": "1000"})
    gate.touch()
    assert late.status_code == 408
    assert late.json()["error"] == "deadline_exceeded"
    # The next request is served once the worker has delivered (and the proxy dropped) the
    # late result: one worker, so it queues behind it.
    assert proxy.post("next").status_code == 200
    assert proxy.metric("corral_late_results_total") == 1
    assert proxy.metric("corral_jobs_expired_total", where="worker") == 1


def test_a_disconnected_client_s_job_never_reaches_the_worker(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    env = {"SCRIPTED_LOG": str(log), "RUST_LOG": "info,corral::http=debug"}
    proxy = corral_factory("--max-batch-size=1", "--max-wait-ms=0", env=env)
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(proxy.post, {"tag": "busy", "hold": str(gate)})
        proxy.wait_until(lambda: received(log), what="the worker to be busy")
        # A client queues a job, then hangs up before its answer.
        url = urlparse(proxy.url)
        body = json.dumps({"tag": "gone"}).encode()
        with socket.create_connection((url.hostname, url.port)) as client:
            client.sendall(
                b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            proxy.wait_until(
                lambda: proxy.client.get("/readyz").json()["queued"] == 1, what="queued job"
            )
        # The worker holds "busy" until the proxy has taken the abandoned job out of the queue.
        proxy.wait_until(
            lambda: proxy.metric("corral_jobs_cancelled_total", where="queue") == 1,
            what="the abandoned job cancelled",
        )
        gate.touch()
        assert busy.result().status_code == 200
    assert proxy.post({"tag": "after"}).status_code == 200
    assert [i["tag"] for i in received(log)] == ["busy", "after"]
    assert proxy.metric("corral_jobs_cancelled_total", where="queue") == 1
    # The request is counted too, as nginx's 499 (it had been in no request metric at all).
    assert proxy.metric("corral_requests_total", route="/infer", code="499") == 1
    assert proxy.metric("corral_requests_total", route="/infer", code="200") == 2
    # Its log line carries its request id, as every line of a request does (it had none).
    proxy.wait_for_log(r"the client left before its answer.*request_id=[0-9a-f-]{36}")


def test_shed_requests_are_not_logged_one_by_one(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-batch-size=1",
        "--max-wait-ms=0",
        "--queue-capacity=1",
        env={"SCRIPTED_LOG": str(log)},
    )
    shed_behind_a_held_job(proxy, log, tmp_path / "gate", over=6)
    assert not [line for line in proxy.lines if "queue_full" in line or "shed" in line]
    assert proxy.metric("corral_jobs_shed_total", reason="queue_full") == 6
