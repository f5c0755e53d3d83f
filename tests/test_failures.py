"""Answers that need a proxy of their own: 422 among valid batch-mates, 408 in the queue and in
the worker, 503 when the queue is full, and a worker that dies holding a batch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx


def received(log_path, with_pid: bool = False) -> list:
    """Items the scripted workers have received so far (with the receiving pid if asked)."""
    if not log_path.exists():
        return []
    entries = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    return [(e["pid"], e["item"]) if with_pid else e["item"] for e in entries]


def shed_behind_a_held_job(proxy, log, gate, queued: int = 1, over: int = 1) -> list:
    """On a proxy that runs one job a batch, sends none ahead and queues `queued` jobs at most
    (its scripted worker logging to `log`): the worker holds one job until `gate` exists and
    `queued` more wait in the queue, so each of `over` requests posted then must be shed 503
    `queue_full`. Opens the gate, checks that the held and queued jobs are answered 200, and
    returns the shed answers."""
    with ThreadPoolExecutor(1 + queued) as pool:
        item = {"tag": "held", "hold": str(gate)}
        held = pool.submit(proxy.post, item)
        proxy.wait_until(lambda: item in received(log), what="the worker to hold a job")
        waiting = [pool.submit(proxy.post, {"tag": f"queued{n}"}) for n in range(queued)]
        proxy.wait_until(
            lambda: proxy.client.get("/readyz").json()["queued"] == queued, what="queued jobs"
        )
        shed = [proxy.post({"tag": f"over{n}"}) for n in range(over)]
        # Shedding is not unreadiness (docs/DEPLOY.md): the probes pass while the queue is full.
        probes = [proxy.client.get(probe).status_code for probe in ("/readyz", "/healthz")]
        assert probes == [200, 200]
        gate.touch()
        assert [job.result().status_code for job in [held, *waiting]] == [200] * (1 + queued)
    assert [(a.status_code, a.json()["error"]) for a in shed] == [(503, "queue_full")] * over
    return shed


def test_422_only_for_the_invalid_item_of_a_batch(corral_factory):
    # A batch is released only when full (the wait is long), so the four jobs share one batch.
    proxy = corral_factory("--batch-policy=fixed", "--max-batch-size=4", "--max-wait-ms=60000")
    items = [{"v": 1}, {"invalid": "not a number"}, {"v": 2}, {"v": 3}]
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(proxy.post, items))
    assert [r.status_code for r in responses] == [200, 422, 200, 200]
    assert responses[1].json() == {"error": "invalid_input", "message": "not a number"}
    for item, response in zip(items, responses):
        if response.status_code == 200:
            # Three valid jobs went to forward together; the invalid one was set aside.
            assert response.json() == {**response.json(), "echo": item, "batch_size": 3}


def test_408_while_queued_and_never_dispatched(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-batch-size", "1", "--max-wait-ms", "0", env={"SCRIPTED_LOG": str(log)}
    )
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(proxy.post, {"tag": "A", "hold": str(gate)})
        proxy.wait_until(lambda: any(i.get("tag") == "A" for i in received(log)), what="A")
        # The only worker holds A until B is answered: B waits in the queue past its deadline.
        late = proxy.post({"tag": "B"}, headers={"x-corral-timeout-ms": "50"})
        gate.touch()
        assert late.status_code == 408
        assert slow.result().status_code == 200
    # C queued after B: once C is answered the worker has pulled past B's place in the queue.
    assert proxy.post({"tag": "C"}).status_code == 200
    assert [i["tag"] for i in received(log)] == ["A", "C"]


def test_503_with_retry_after_when_the_queue_is_full(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-batch-size=1",
        "--max-wait-ms=0",
        "--queue-capacity=2",
        env={"SCRIPTED_LOG": str(log)},
    )
    [shed] = shed_behind_a_held_job(proxy, log, tmp_path / "gate", queued=2)
    assert int(shed.headers["retry-after"]) >= 1


def test_a_killed_worker_s_jobs_succeed_on_another_worker(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory("--max-wait-ms=0", workers=2, env={"SCRIPTED_LOG": str(log)})
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        # Held until its first worker is dead: only the retry can answer it.
        pending = pool.submit(proxy.post, {"tag": "t", "hold": str(gate)})
        holder = proxy.wait_until(lambda: received(log, with_pid=True), what="the job")[0][0]
        os.kill(holder, signal.SIGKILL)
        # With its pid, as the line of its lost connection: which failed is told apart.
        restarting = proxy.wait_for_log(r"worker exited; restarting")
        assert re.search(rf"pid\W+{holder}\b", restarting), restarting
        gate.touch()
        response = pending.result()
    assert response.status_code == 200, response.text
    assert response.json()["pid"] != holder
    assert proxy.metric("corral_jobs_retried_total", stage="default") == 1
    # Server-Timing says where its time went across both tries: `queue` to the retry's send
    # (the first try's time in its dead worker included), `batch` from there, within the total.
    from test_server_timing import check_parts  # it imports this module: not at the top

    check_parts(response)
    assert response.headers["x-corral-batch-size"] == "1"


def test_a_job_that_kills_every_worker_is_answered_500_once_out_of_retries(corral_factory):
    proxy = corral_factory("--max-wait-ms=0", workers=2)
    response = proxy.post({"exit": True})
    assert response.status_code == 500
    assert response.json()["error"] == "worker_died"
    # Both workers died with it (one try, one retry); both are restarted and serve again.
    proxy.wait_for_log(r"worker connected", count=4)
    assert proxy.post("still here").json()["echo"] == "still here"
    # Every batch sent counts as one, those whose worker died too (they once counted nothing).
    assert proxy.metric("corral_batch_size_count", stage="default") == 3


def full_batches_only(corral_factory, size: int, log, workers: int = 1):
    """A proxy whose batches of `size` leave only when full (a minute's wait, a minute's
    deadline: nothing leaves or expires early), its scripted workers logging to `log`."""
    return corral_factory(
        "--batch-policy=fixed",
        f"--max-batch-size={size}",
        "--max-wait-ms=60000",
        "--timeout-ms=60000",
        workers=workers,
        env={"SCRIPTED_LOG": str(log)},
    )


def test_a_poison_input_takes_none_of_its_batch_mates_down(corral_factory, tmp_path):
    # One batch of four (released only when full), one of which kills its worker. Nobody can
    # tell which: each is retried in a batch of its own, so the three others are answered and
    # the poison input alone is a 500, once it has killed a second worker.
    log = tmp_path / "received.jsonl"
    proxy = full_batches_only(corral_factory, 4, log, workers=2)
    items = [{"v": 1}, {"exit": True}, {"v": 2}, {"v": 3}]
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(proxy.post, items))
    assert [r.status_code for r in responses] == [200, 500, 200, 200]
    assert responses[1].json()["error"] == "worker_died"
    assert [r.json()["batch_size"] for r in responses if r.status_code == 200] == [1, 1, 1]
    # Every item reached a worker twice: in the first batch, then alone.
    assert sorted(json.dumps(i, sort_keys=True) for i in received(log)) == sorted(
        json.dumps(i, sort_keys=True) for i in items * 2
    )
    assert proxy.metric("corral_jobs_retried_total", stage="default") == 4


def test_a_poison_input_among_64_clients_of_64_kib_items_fails_alone(corral_factory):
    # At the sizes users send: batches of 32 items of 64 KiB (2 MiB frames, answers as large,
    # far past a socket's buffer) from 64 clients at once, over two workers, one item of which
    # kills whichever worker runs it. Only that one is answered 500.
    proxy = corral_factory(
        "--max-batch-size=32", "--timeout-ms=60000", "--max-body-bytes=1048576", workers=2
    )
    pad = "x" * 65536
    items = [{"v": n, "pad": pad} for n in range(64)]
    items[37] = {"exit": True, "pad": pad}
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(proxy.post, items))
    codes = [answer.status_code for answer in answers]
    assert codes == [500 if n == 37 else 200 for n in range(64)], codes
    assert answers[37].json()["error"] == "worker_died"
    for n, answer in enumerate(answers):
        if n != 37:
            assert answer.json()["echo"] == items[n]


def test_nothing_is_sent_ahead_behind_a_job_retried_alone(corral_factory, tmp_path):
    # With prefetch (the default) a batch-mate had been written behind the poison input, on
    # the worker it then killed: its retry spent, it was answered 500 without running again.
    log = tmp_path / "received.jsonl"
    proxy = full_batches_only(corral_factory, 2, log)
    with ThreadPoolExecutor(4) as pool:
        # A batch's cost learned: from now on a full batch queued behind a busy worker goes ahead.
        assert [r.status_code for r in pool.map(proxy.post, [{"v": 0}, {"v": 1}])] == [200] * 2
        first = [pool.submit(proxy.post, item) for item in ({"exit": True}, {"v": "a"})]
        proxy.wait_until(lambda: len(received(log)) == 4, what="the poisoned batch sent")
        later = [pool.submit(proxy.post, {"v": v}) for v in "bc"]
        answers = [job.result() for job in first + later]
    assert [a.status_code for a in answers] == [500, 200, 200, 200]
    assert answers[1].json()["batch_size"] == 1


def test_with_retries_off_a_dead_worker_s_job_is_not_run_again(corral_factory, tmp_path):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-wait-ms=0", "--retries=0", workers=2, env={"SCRIPTED_LOG": str(log)}
    )
    assert proxy.post({"exit": True}).status_code == 500
    assert len(received(log)) == 1


def test_sigterm_stops_workers_and_removes_the_socket(corral_factory):
    proxy = corral_factory(workers=2)
    assert proxy.post(1).status_code == 200
    assert proxy.stop() == 0
    assert not proxy.socket.exists()
    proxy.wait_for_log(r"stopped")
    try:
        httpx.get(proxy.url + "/healthz", timeout=2)
        raise AssertionError("the proxy still answers after stopping")
    except httpx.TransportError:
        pass


def test_a_path_that_is_not_a_socket_is_never_replaced(tmp_path):
    from conftest import BINARY

    precious = tmp_path / "corral.sock"
    precious.write_text("not a socket")
    result = subprocess.run(
        [BINARY, "--listen", "127.0.0.1:0", "--socket", str(precious)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr  # a configuration error, found before binding
    assert f"--socket: {precious}: something that is not a socket is there" in result.stderr
    assert precious.read_text() == "not a socket"
    # Set by a config file, the file's key is named (found at bind, it was `--socket`, exit 1).
    config = tmp_path / "corral.toml"
    config.write_text(f'socket = "{precious}"\n[stages.a]\n')
    result = subprocess.run(
        [BINARY, "--listen", "127.0.0.1:0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert f"socket: {precious}: something that is not a socket is there" in result.stderr
    assert "--socket" not in result.stderr and precious.read_text() == "not a socket"


def test_a_socket_in_use_by_a_live_proxy_is_an_error(corral_factory):
    from conftest import BINARY

    live = corral_factory(worker=None)
    result = subprocess.run(
        [BINARY, "--listen", "127.0.0.1:0", "--socket", str(live.socket)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "in use" in result.stderr
    assert live.client.get("/healthz").status_code == 200
