"""Workers that come and go: graceful shutdown, hung workers, crash loops, warm-up and readiness,
the socket file's permissions, and worker output in Corral's log."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h2.events
import httpx
import pytest

from conftest import ROOT
from test_failures import received
from test_http_edge import H2, connect, read_all, read_answer

WARM = str(ROOT / "tests" / "workers" / "warm.py")


# SIGHUP (a terminal gone) and SIGQUIT (some images' stop signal) stop Corral as SIGTERM does:
# each once exited on the spot (SIGQUIT with a core dump and a worker's children left running).
@pytest.mark.parametrize(
    "stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT], ids=["SIGTERM", "SIGHUP", "SIGQUIT"]
)
def test_sigterm_lets_jobs_in_flight_finish(corral_factory, tmp_path, stop):
    log = tmp_path / "received.jsonl"
    proxy = corral_factory("--max-wait-ms=0", workers=2, env={"SCRIPTED_LOG": str(log)})
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(proxy.post, {"n": n, "hold": str(gate)}) for n in range(4)]
        # All four are in (two held by the workers, two queued) before the signal: none is
        # refused at the door.
        proxy.wait_until(
            lambda: len(received(log)) + proxy.client.get("/readyz").json()["queued"] == 4,
            what="all jobs in the proxy",
        )
        proxy.proc.send_signal(stop)
        # The workers go on only once the proxy is draining: every job is in flight at the signal.
        proxy.wait_for_log(r"shutting down: draining")
        gate.touch()
        answers = [p.result() for p in pending]
    assert [a.status_code for a in answers] == [200] * 4
    assert proxy.proc.wait(timeout=30) == 0
    assert not proxy.socket.exists()
    proxy.wait_for_log(r"corral is shutting down")  # the workers were told
    proxy.stop()  # reads the log to its end
    # ...and left by themselves (a reader thread waiting on a watch once had them killed).
    assert not any("did not exit" in line for line in proxy.lines)


@pytest.mark.parametrize("connections", ["new", "kept_alive"])
def test_requests_waiting_unread_at_the_signal_are_answered_not_reset(corral_factory, connections):
    """Requests sent but not yet read when the drain begins: on connections still in the
    kernel's accept queue (closing the listener reset them) and on idle keep-alive ones (hyper,
    asked to shut an idle connection down, closes it unread). The proxy is paused while they are
    sent, so that they wait there when it takes the signal."""
    proxy = corral_factory()
    body = b'{"n": 1}'
    request = (
        b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    kept = []
    if connections == "kept_alive":
        kept = [connect(proxy) for _ in range(20)]
        for conn in kept:
            conn.sendall(request)
            head, _, rest = read_answer(conn)
            assert head.startswith(b"HTTP/1.1 200") and not rest
    proxy.proc.send_signal(signal.SIGSTOP)
    try:
        waiting = kept or [connect(proxy) for _ in range(100)]
        for conn in waiting:
            conn.sendall(request)
        proxy.proc.send_signal(signal.SIGTERM)  # taken when it goes on
    finally:
        proxy.proc.send_signal(signal.SIGCONT)
    answers = []
    for conn in waiting:
        with conn:
            answers.append(read_all(conn))
    # Each is answered: served if taken before the drain began, else refused as shutting down;
    # and those given in the drain say the connection closes, as it does (a first request read
    # and answered at once had said keep-alive).
    assert {answer[9:12] for answer in answers} <= {b"200", b"503"}, answers  # b"" unanswered
    refused = [answer for answer in answers if answer.startswith(b"HTTP/1.1 503")]
    assert all(b"\r\nconnection: close\r\n" in answer.lower() for answer in refused), refused
    assert proxy.proc.wait(timeout=30) == 0


def test_a_corral_started_ignoring_sighup_goes_on_ignoring_it(
    corral_factory, tmp_path, monkeypatch
):
    """Under `nohup` (SIGHUP ignored, inherited across exec) a hangup must not stop Corral: a
    SIGHUP then a SIGTERM is one stop signal, a clean drain (exit 0), not a second signal's
    exit at once (1), as it was when Corral's own listener replaced the ignored disposition."""
    import conftest

    wrapper = tmp_path / "nohup-like"
    wrapper.write_text(f"#!/bin/sh\ntrap '' HUP\nexec {conftest.BINARY} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(conftest, "BINARY", str(wrapper))
    proxy = corral_factory()
    assert proxy.post("before").status_code == 200
    proxy.proc.send_signal(signal.SIGHUP)
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.proc.wait(timeout=30) == 0
    proxy.stop()  # reads the log to its end
    assert not any("second signal" in line for line in proxy.lines)


def test_an_idle_http2_connection_whose_client_reads_nothing_does_not_hold_the_drain(
    corral_factory,
):
    """hyper drains an HTTP/2 connection by asking its client to acknowledge a GOAWAY; a client
    that reads only while it has a request out (httpx's HTTP/2 pool) never does, and one such
    idle connection held the drain, and the workers, for the whole grace period, which then
    "answered what is left 503" with nothing left."""
    proxy = corral_factory("--grace-period-ms=600000")
    with H2(proxy) as client:
        stream = client.request("GET", "/healthz")
        ended = False
        while not ended:
            events = client.events()
            assert events is not None, "the proxy closed the connection before answering"
            ended = any(
                isinstance(e, h2.events.StreamEnded) and e.stream_id == stream for e in events
            )
        # Answered; from here the client reads nothing, as an idle pooled connection.
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(timeout=60) == 0, "drained well before its 10 minutes"
    assert not any("grace period ran out" in line for line in proxy.lines)


def test_jobs_left_when_the_grace_period_ends_are_answered_503(corral_factory, tmp_path):
    proxy = corral_factory("--max-wait-ms=0", "--grace-period-ms=300")
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        # The worker holds the job until the grace period has ended it.
        pending = pool.submit(proxy.post, {"hold": str(gate)})
        # Let the job reach the worker, then stop.
        proxy.wait_until(lambda: proxy.metric("corral_workers_busy", stage="default"), what="busy")
        proxy.proc.send_signal(signal.SIGTERM)
        answer = pending.result()
        gate.touch()
    assert answer.status_code == 503
    assert answer.json()["error"] == "shutting_down"
    assert answer.headers["retry-after"] == "1"
    assert proxy.proc.wait(timeout=30) == 0


def test_a_body_still_arriving_when_the_grace_period_ends_is_answered_503(corral_factory):
    # A slow upload during a rollout had its connection dropped unanswered at the grace
    # period's end, not told to retry.
    proxy = corral_factory("--grace-period-ms=300")
    with connect(proxy) as conn:
        conn.sendall(
            b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\nexpect: 100-continue\r\n\r\n"
        )
        # hyper says 100 Continue as the handler first reads the body: it is reading now.
        assert conn.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        conn.sendall(b'{"x": "part')
        proxy.proc.send_signal(signal.SIGTERM)
        answer = read_all(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert json.loads(body)["error"] == "shutting_down"
    assert proxy.proc.wait(timeout=30) == 0


def test_a_hung_worker_is_killed_and_restarted(corral_factory):
    proxy = corral_factory("--max-wait-ms=0", "--batch-timeout-ms=300")
    response = proxy.post({"sleep_ms": 60_000})
    # Hung once (killed, job retried on the restarted worker), hung again: out of retries.
    assert response.status_code == 500
    assert response.json()["error"] == "worker_died"
    proxy.wait_for_log(r"killed a hung worker", count=2)
    # The limit that passed is said: it differs from batch to batch without the flag.
    said = "past its limit of 300 ms (the stage's batch timeout, --batch-timeout-ms or"
    assert said in response.json()["message"]
    proxy.wait_for_log(r"worker connected", count=3)
    assert proxy.post("after").json()["echo"] == "after"
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 2


def test_a_spawned_worker_living_on_without_its_connection_is_killed_and_restarted(
    corral_factory,
):
    # Its connection ended while it held a batch, and the process went on (a forward that
    # never returns): it was left alone, its stage a worker short until the proxy stopped.
    proxy = corral_factory("--max-wait-ms=0")
    first = proxy.post("warm").json()["pid"]
    gone = proxy.post({"disconnect": True}, headers={"x-corral-timeout-ms": "1000"})
    assert gone.status_code == 408, gone.text  # its retry waited for a worker, past 1 s
    proxy.wait_for_log(r"killed a worker that lived on without its connection")
    proxy.wait_for_log(r"worker connected", count=2)
    assert proxy.post("after").json()["pid"] != first
    assert proxy.metric("corral_worker_restarts_total") == 1
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="died") == 1
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_without_a_batch_timeout_a_worker_silent_past_its_route_s_timeout_is_killed(
    corral_factory,
):
    """The default hung clock (no --batch-timeout-ms) does fire: the route's timeout plus a
    second from when the worker got the batch. The tests beside this one show only when it must
    not."""
    proxy = corral_factory("--max-wait-ms=0", "--timeout-ms=1000")
    first = proxy.post("warm").json()["pid"]
    assert proxy.post({"sleep_ms": 60_000}).status_code == 408
    killed = proxy.wait_for_log(r"killed a hung worker")
    assert "name" in killed and "Scripted" in killed, killed  # as its neighbouring lines
    line = proxy.wait_for_log(r"worker disconnected")
    assert "past its limit of 2000 ms (its jobs' time and 1 s)" in line, line
    proxy.wait_for_log(r"worker connected", count=2)
    assert proxy.post("after").json()["pid"] != first
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 1


def test_a_client_s_short_deadline_does_not_get_a_slow_worker_killed(corral_factory):
    """Without --batch-timeout-ms a worker is hung one second past the longest timeout among its
    jobs' routes, from when it got the batch. A client's shorter deadline once counted instead:
    a 100 ms header on a batch of 1.5 s got the worker killed as hung every time (a model
    reload each), though it was only slow. The client has its 408; the worker finishes (its
    late result dropped, counted) and the same process answers the next request, after that
    batch. (Here 1 s on a batch of 3 s: the job has time to reach the worker on a loaded
    machine, and the old clock would have killed it at 2 s.)"""
    proxy = corral_factory("--max-wait-ms=0", "--timeout-ms=10000")
    first = proxy.post("warm").json()["pid"]
    short = proxy.post({"sleep_ms": 3000}, headers={"x-corral-timeout-ms": "1000"})
    assert short.status_code == 408, short.text
    # Queued behind the slow batch: answered once it is done, by the same worker.
    assert proxy.post("after").json()["pid"] == first
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0
    assert proxy.metric("corral_late_results_total") == 1


# With batches of one, B is sent ahead to the busy worker (PROTOCOL.md: its clock counts from
# when the worker answered the batch before), rather than waiting in the queue.
@pytest.mark.parametrize("batch", [[], ["--max-batch-size=1"]], ids=["queued", "sent-ahead"])
def test_a_job_queued_behind_a_long_batch_does_not_get_its_worker_killed(
    corral_factory, tmp_path, batch
):
    """The hung clock runs from when the worker got the batch, for as long as the route allows
    (here 3 s, + 1 s). B queues 1.5 s behind A, then takes 3 s itself: 4.5 s from its arrival.
    Counted from B's arrival, as it was, the worker was killed at 4 s, though it was answering
    every batch within the route's timeout. B's client has its 408 at 3 s all the same. (Each
    bound is met or missed by at least a second, for a loaded machine.)"""
    log = tmp_path / "received.jsonl"
    proxy = corral_factory(
        "--max-wait-ms=0", "--timeout-ms=3000", *batch, env={"SCRIPTED_LOG": str(log)}
    )
    pid = proxy.post("warm").json()["pid"]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(proxy.post, {"tag": "A", "sleep_ms": 1500})
        tags = lambda: [i.get("tag") for i in received(log) if isinstance(i, dict)]  # noqa: E731
        proxy.wait_until(lambda: "A" in tags(), what="A")
        queued = proxy.post({"tag": "B", "sleep_ms": 3000})
        assert first.result().status_code == 200
    assert queued.status_code == 408, queued.text
    # Behind B's batch: answered by the same process once B's batch is done.
    assert proxy.post("after").json()["pid"] == pid
    assert "B" in tags(), "B reached the worker (else this tested nothing)"
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0
    if batch:
        assert proxy.metric("corral_batches_sent_ahead_total", stage="default") >= 1


def test_a_crash_looping_worker_never_takes_the_proxy_down(corral_factory):
    looping = corral_factory("--workers=1", "--", sys.executable, "-c", "raise SystemExit(3)",
                             worker=None)  # fmt: skip
    looping.wait_for_log(r"worker exited; restarting", count=3)
    assert looping.client.get("/healthz").status_code == 200
    ready = looping.client.get("/readyz")
    assert ready.status_code == 503
    # Why, beyond "no connected worker" (a crash loop, not a slow start): it said only that.
    message = ready.json()["message"]
    said = re.search(
        r"its workers exited (\d+) time\(s\) since Corral started, the last with exit status: 3",
        message,
    )
    assert said and int(said[1]) >= 3, message


def test_a_worker_command_that_cannot_start_is_said_and_counted(corral_factory, tmp_path):
    # Retried for ever (the program may appear), it had looked like a slow start: /readyz said
    # only "no connected worker", and no restart nor failure was counted for an alert.
    missing = str(tmp_path / "no-such-model-server")
    proxy = corral_factory("--workers=1", "--", missing, worker=None)
    proxy.wait_for_log(r"could not start worker", count=2)
    # The log counts the failed starts as the metric does (it had said restarts=0 throughout).
    tries = [line for line in proxy.lines if "could not start worker" in line]
    assert "restarts=0" in tries[0] and "restarts=1" in tries[1], tries
    message = proxy.client.get("/readyz").json()["message"]
    assert "the last with a failed start (No such file or directory" in message, message
    # No process ran: none exited (it had said "its workers exited 4 time(s)").
    assert re.search(r"its workers failed to start \d+ time\(s\)", message), message
    proxy.wait_until(
        lambda: proxy.metric("corral_worker_restarts_total") >= 1, what="the retry counted"
    )


# Says hello as a worker does, then exits: a model that dies as its first batch arrives.
HELLO_THEN_EXIT = """
import os, socket
from corral import _protocol as protocol
sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["CORRAL_SOCKET"])
sock.sendall(protocol.encode_frame(protocol.hello("default", os.getpid(), "brief")))
"""


def restart_delays(proxy) -> list[int]:
    return [int(m) for m in re.findall(r"restart_in_ms=(\d+)", "\n".join(proxy.lines))]


def test_a_worker_that_connects_and_dies_still_backs_off(corral_factory):
    """Connecting reset the backoff: a worker that died right after its hello was restarted
    six times a second for ever."""
    looping = corral_factory("--workers=1", "--", sys.executable, "-c", HELLO_THEN_EXIT,
                             worker=None)  # fmt: skip
    looping.wait_for_log(r"worker exited; restarting", count=4)
    assert [line for line in looping.lines if "worker connected" in line], "it never connected"
    assert restart_delays(looping)[:4] == [100, 200, 400, 800]


def test_a_worker_that_answered_work_restarts_without_delay(corral_factory):
    """Answering a batch shows the worker is not crash-looping: each restart after one is at
    the first delay, however often it dies."""
    proxy = corral_factory("--retries=0", workers=1)
    for round in range(3):
        assert proxy.post({"n": round}).status_code == 200
        died = proxy.post({"exit": True})
        assert died.status_code == 500, died.text
        proxy.wait_for_log(r"worker exited; restarting", count=round + 1)
        proxy.wait_for_log(r"worker connected", count=round + 2)
    assert restart_delays(proxy) == [100, 100, 100]


def test_readyz_waits_for_warm_up(corral_factory, tmp_path):
    gate = tmp_path / "warmed"
    warm = corral_factory(
        "--workers=1", "--", sys.executable, WARM, worker=None, env={"WARM_GATE": str(gate)}
    )
    warm.wait_for_log(r"worker started")
    not_yet = warm.client.get("/readyz")
    assert not_yet.status_code == 503
    assert "no connected worker" in not_yet.json()["message"]
    gate.touch()  # the worker's warm-up ends only now
    warm.wait_for_log(r"warmed up on 1 examples")
    warm.wait_for_log(r"worker connected")
    assert warm.client.get("/readyz").status_code == 200


def test_a_failing_warm_up_keeps_the_worker_out(corral_factory):
    warm = corral_factory(
        "--workers=1", "--", sys.executable, WARM, worker=None,
        env={"WARM_FAIL": "1"},
    )  # fmt: skip
    warm.wait_for_log(r"warm-up failed")
    warm.wait_for_log(r"worker exited; restarting")
    assert not [line for line in warm.lines if "worker connected" in line]
    assert warm.client.get("/readyz").status_code == 503


def test_the_socket_is_owner_only_unless_widened(corral_factory):
    default = corral_factory(worker=None)
    assert stat.S_IMODE(Path(default.socket).stat().st_mode) == 0o600
    group = corral_factory("--socket-mode=660", worker=None)
    assert stat.S_IMODE(Path(group.socket).stat().st_mode) == 0o660


def test_worker_output_is_prefixed_with_its_index(corral_factory):
    proxy = corral_factory(workers=2)
    proxy.wait_for_log(r"^\[worker 0\] .*connected to corral")
    proxy.wait_for_log(r"^\[worker 1\] .*connected to corral")


def test_a_stale_socket_from_a_dead_proxy_is_replaced(corral_factory, tmp_path):
    import socket as sockets

    from conftest import Corral

    stale = tmp_path / "corral.sock"
    leftover = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    leftover.bind(str(stale))  # a socket file nobody listens on any more
    leftover.close()
    assert stale.exists()
    proxy = Corral(tmp_path, workers=1)  # its socket path is tmp_path / "corral.sock"
    try:
        assert proxy.post("fresh").json()["echo"] == "fresh"
    finally:
        assert proxy.stop() == 0


def test_a_live_socket_that_cannot_take_a_connection_now_is_never_deleted(tmp_path):
    import socket as sockets
    import subprocess

    from conftest import BINARY

    path = tmp_path / "corral.sock"
    busy = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    busy.bind(str(path))
    busy.listen(0)  # a live proxy that is slow to accept: its backlog fills up
    queued = []
    for _ in range(64):
        client = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        client.setblocking(False)
        queued.append(client)
        try:
            client.connect(str(path))
        except BlockingIOError:
            break  # EAGAIN: what the next proxy's connect sees too
    else:
        raise AssertionError("the backlog never filled")
    try:
        started = subprocess.run(
            [BINARY, "--listen", "127.0.0.1:0", "--socket", str(path)],
            capture_output=True, text=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
        assert started.returncode != 0
        assert "refusing to replace it" in started.stderr
        assert path.exists()  # the live socket is still there for its workers
    finally:
        for client in queued:
            client.close()
        busy.close()


def test_a_proxy_whose_log_nobody_reads_serves_and_stops_cleanly(tmp_path):
    """`corral … 2>&1 | head -1`: once the log's reader is gone, a log line cannot be written.
    The proxy drops it; it used to panic at its next line and leave its socket file behind."""
    import subprocess

    from conftest import BINARY

    path = tmp_path / "corral.sock"
    proxy = subprocess.Popen(
        [BINARY, "--listen", "127.0.0.1:0", "--socket", str(path)],
        stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    try:
        address = None
        for line in proxy.stderr:  # read until it listens, then stop reading for good
            if found := re.search(rb"listening for HTTP addr=(\S+)", line):
                address = found.group(1).decode()
            if b"listening for workers" in line:
                break
        proxy.stderr.close()
        assert httpx.get(f"http://{address}/healthz", timeout=30).status_code == 200
        proxy.send_signal(signal.SIGTERM)  # logs "shutting down", "stopped"
        assert proxy.wait(timeout=30) == 0
        assert not path.exists()
    finally:
        proxy.kill()
        proxy.wait()


def test_errors_setting_up_name_what_could_not_be_set_up(tmp_path):
    import socket as sockets
    import subprocess

    from conftest import BINARY

    taken = sockets.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        busy = subprocess.run(
            [BINARY, "--listen", f"127.0.0.1:{port}", "--socket", str(tmp_path / "a.sock")],
            capture_output=True, text=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
    finally:
        taken.close()
    assert busy.returncode != 0
    assert f"cannot listen for HTTP on 127.0.0.1:{port} (--listen)" in busy.stderr
    nowhere = tmp_path / "no" / "such" / "dir" / "c.sock"
    # Linux's Unix socket addresses hold 107 bytes: Corral once started on a longer path (it
    # binds a short one and links it), and every worker then waited for it forever.
    long = tmp_path / ("s" * (108 - len(str(tmp_path)) - 1 + 10))
    # Both known before binding: config errors naming the flag, exit 2, nothing bound.
    for path, why in [(nowhere, "does not exist"), (long, "holds at most 107")]:
        refused = subprocess.run(
            [BINARY, "--listen", "127.0.0.1:0", "--socket", str(path)],
            capture_output=True, text=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert f"--socket: {path}: " in refused.stderr
        assert why in refused.stderr
        assert "listening" not in refused.stderr
        assert not path.exists()


def test_a_deleted_socket_is_published_again_and_another_s_is_never_removed(corral_factory):
    """A tmp cleaner or an operator's `rm` deleted the socket: the next worker to start could not
    reach the proxy, and nothing said so. It is published again within seconds; a worker that
    connects then is served. At exit, a socket at the path that is not Corral's stays."""
    import socket as sockets

    proxy = corral_factory(workers=1)
    first = proxy.post("before").json()["pid"]
    proxy.socket.unlink()
    proxy.wait_for_log(r"the worker socket was deleted: published it again")
    os.kill(first, signal.SIGKILL)  # its replacement must connect through the new socket
    proxy.wait_for_log(r"worker connected", count=2)
    assert proxy.post("after").json()["pid"] != first
    # Another process's socket at the path: left alone at exit.
    proxy.socket.unlink()
    other = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    other.bind(str(proxy.socket))
    try:
        proxy.wait_for_log(r"replaced by another file")
        assert proxy.stop() == 0
        assert proxy.socket.exists()
    finally:
        other.close()
