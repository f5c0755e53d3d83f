"""The serve loop cannot be stopped by what it carries: it keeps reading while it writes (no
deadlock with a batch sent ahead), nothing a hook raises ends it, and a spawned worker whose proxy
is gone stops waiting for it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import msgpack
import pytest

import corral
from corral import _batch, _process_end, _serve
from corral import _protocol as protocol
from corral.testing import FakeProxy, Result

MIB = 1024 * 1024


class Sized(corral.Worker):
    """Each item is ``{"out": n, ...}``; the output is ``n`` bytes (the rest of the item is
    padding that makes the batch large)."""

    def forward(self, batch):
        return [b"r" * item["out"] for item in batch]


def batch_of(*payloads: object) -> dict:
    jobs = [
        {"id": bytes([n]) * 16, "timeout_ms": 60_000, "payload": msgpack.packb(p)}
        for n, p in enumerate(payloads, start=1)
    ]
    return {"type": "batch", "jobs": jobs}


# -- reading while writing ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_large_results_frame_while_a_large_batch_arrives_does_not_deadlock():
    """A results frame and a batch sent ahead, each many times a socket buffer, cross on one
    socket pair, and the fake proxy reads nothing until its own write is done (as the proxy's
    batch-ahead write did). A worker that stops reading while it writes blocks forever here."""
    with FakeProxy(Sized()) as proxy:
        proxy.send(batch_of({"out": 8 * MIB}))
        # The worker is now writing 8 MiB of results that nobody reads yet.
        proxy.send(batch_of({"out": 1, "pad": b"p" * 8 * MIB}))
        first, second = proxy.receive(), proxy.receive()
    assert [r["status"] for r in first["results"]] == ["ok"]
    assert len(msgpack.unpackb(first["results"][0]["data"])) == 8 * MIB
    assert msgpack.unpackb(second["results"][0]["data"]) == b"r"


@pytest.mark.parametrize("size", [0, _serve._WRITE_APART - 1, _serve._WRITE_APART, 3 * MIB])
def test_a_frame_written_apart_from_its_length_reads_back_whole(size):
    """From 64 KiB a results body goes out after its length prefix in a write of its own
    (copying 48 MiB behind 4 bytes took 33 ms): the proxy must read the same frame."""
    items = [protocol.ok(b"i" * 16, msgpack.packb(b"r" * size))]
    body = protocol.results_body(items)
    assert protocol.framed(body) == protocol.encode_frame(protocol.results(items))
    ours, theirs = socket.socketpair()
    with ours, theirs:
        writer = threading.Thread(target=_serve.send_body, args=(ours, body))
        writer.start()
        with theirs.makefile("rb") as stream:
            assert protocol.read_frame(stream) == protocol.results(items)
        writer.join()


def test_a_close_after_a_batch_is_seen_after_that_batch_is_answered():
    with FakeProxy(Sized()) as proxy:
        proxy.send(batch_of({"out": 3}))
        proxy.send(batch_of({"out": 4}))
        proxy.half_close()
        answers = [proxy.receive(), proxy.receive(), proxy.receive()]
    assert [len(msgpack.unpackb(a["results"][0]["data"])) for a in answers[:2]] == [3, 4]
    assert answers[2] is None
    assert proxy.worker_error is None


def test_a_broken_frame_after_a_batch_is_seen_after_that_batch_is_answered():
    with FakeProxy(Sized()) as proxy:
        proxy.send_raw(
            protocol.encode_frame(batch_of({"out": 2})) + protocol.encode_frame({"type": "dance"})
        )
        answer = proxy.receive()
        assert proxy.receive() is None
    assert msgpack.unpackb(answer["results"][0]["data"]) == b"rr"
    assert isinstance(proxy.worker_error, corral.ProtocolError)


def test_a_protocol_error_seen_by_the_serve_loop_ends_serve_while_the_proxy_stays():
    """The proxy keeps the connection open after a batch the worker must refuse: ``serve`` still
    returns (its reader does not keep it, or the socket, waiting)."""
    with FakeProxy(Sized()) as proxy:
        job = {"id": "not bytes", "timeout_ms": 1, "payload": b""}
        proxy.send({"type": "batch", "jobs": [job]})
        assert proxy.receive() is None
        assert isinstance(proxy.worker_error, corral.ProtocolError)
        assert not [t for t in threading.enumerate() if t.name.startswith("corral-reader")]


def test_shutdown_behind_a_batch_answers_the_batch_then_stops():
    with FakeProxy(Sized()) as proxy:
        proxy.send(batch_of({"out": 1}))
        proxy.send({"type": "shutdown", "message": "bye"})
        assert proxy.receive()["type"] == "results"
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, SystemExit) and proxy.worker_error.code == 0


# -- nothing a hook raises ends the loop ----------------------------------------------------


class Hostile(corral.Worker):
    """Raises what the item names, at the step it names: ``["pre" | "forward" | "post", what]``;
    any other item is echoed."""

    def preprocess(self, item):
        self._raise(item, "pre")
        return item

    def forward(self, batch):
        for item in batch:
            self._raise(item, "forward")
        return batch

    def postprocess(self, output):
        self._raise(output, "post")
        return output

    @staticmethod
    def _raise(item, step):
        if isinstance(item, list) and len(item) == 2 and item[0] == step:
            raise RAISABLE[item[1]]()


class Custom(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


class UnprintableBase(Exception):
    """Its message cannot be read, and reading it raises what is not an ``Exception``."""

    def __str__(self):
        raise GeneratorExit


RAISABLE = {
    "surrogate": lambda: ValueError(os.fsdecode(b"bad name \xff.jpg")),
    "lone": lambda: ValueError("half a pair \ud800"),
    "invalid": lambda: corral.ValidationError("file \udcfe is not an image"),
    "generator": GeneratorExit,
    "custom": lambda: Custom("custom base exception"),
    "unprintable": Unprintable,
    "unprintable-base": UnprintableBase,
    "interrupt": KeyboardInterrupt,
    "exit": lambda: SystemExit(3),
}


@pytest.mark.parametrize("step", ["pre", "forward", "post"])
def test_a_message_with_lone_surrogates_is_sent_readable_and_the_worker_lives_on(step):
    with FakeProxy(Hostile()) as proxy:
        (bad,) = proxy.infer([[step, "surrogate"]])
        (lone,) = proxy.infer([[step, "lone"]])
        assert proxy.infer([1]) == [Result("ok", value=1)]
    # The undecodable byte of an os.fsdecode'd name comes back as itself, escaped.
    assert bad == Result("error", message="ValueError: bad name \\xff.jpg")
    assert lone == Result("error", message="ValueError: half a pair \\ud800")


def test_a_validation_error_with_a_surrogate_is_still_a_422():
    with FakeProxy(Hostile()) as proxy:
        (bad,) = proxy.infer([["pre", "invalid"]])
    assert bad == Result("invalid", message="file \\xfe is not an image")


def test_validation_errors_quoting_megabytes_are_cut_and_stay_422s():
    """A ValidationError's message went whole: 16 of 6 MB each passed the frame's size, and 5
    of the clients whose input was refused got 500 "too large for one frame" instead."""

    class Quoting(corral.Worker):
        def preprocess(self, item):
            raise corral.ValidationError("not a number: " + "x" * 6_000_000)

        def forward(self, batch):
            return batch

    with FakeProxy(Quoting()) as proxy:
        got = proxy.infer(list(range(16)))
    assert {r.status for r in got} == {"invalid"}
    assert all(len(r.message) < 2100 for r in got)
    assert got[0].message.startswith("not a number: xxx")
    assert got[0].message.endswith("(cut: 6,000,014 characters in all)")


def test_a_forked_child_does_not_hold_the_connection_to_the_proxy(tmp_path, monkeypatch):
    """A worker that forks (a multiprocessing pool of the fork kind, made in forward) had its
    children hold the connection: the worker died, yet the proxy saw no end, and its batch waited
    out --batch-timeout-ms instead of going to another worker. Forked while the connect loop
    serves, the child finds the connection's descriptor let go of; the parent's still works."""
    monkeypatch.setenv("CORRAL_WORKER_INDEX", "0")  # spawned: one connection, then return
    monkeypatch.delenv("CORRAL_PROXY_PID", raising=False)
    path = tmp_path / "corral.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    held = []

    def serve_one(sock):
        child = os.fork()
        if child == 0:  # the child: is the connection's descriptor still a socket?
            os._exit(1 if stat.S_ISSOCK(os.fstat(sock.fileno()).st_mode) else 0)
        held.append(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
        sock.sendall(b"ok")

    serving = threading.Thread(target=_serve.run_forever, args=(str(path), serve_one))
    serving.start()
    proxy_end, _ = listener.accept()
    with proxy_end, listener:
        assert proxy_end.recv(2) == b"ok", "the parent's connection is untouched"
        serving.join(timeout=10)
    assert held == [0], "the child held the connection"
    assert _serve._connection is None


@pytest.mark.parametrize("step", ["pre", "forward", "post"])
@pytest.mark.parametrize("what", ["generator", "custom", "unprintable", "unprintable-base"])
def test_base_exceptions_and_unprintable_errors_fail_their_items_only(step, what):
    with FakeProxy(Hostile()) as proxy:
        bad, good = proxy.infer([[step, what], "fine"])
        assert proxy.infer(["again"]) == [Result("ok", value="again")]
    assert bad.status == "error"
    assert bad.message.startswith(type(RAISABLE[what]()).__name__)
    if step == "forward":  # forward saw the whole batch
        assert good == Result("error", message=bad.message)
    else:
        assert good == Result("ok", value="fine")


@pytest.mark.parametrize("step", ["pre", "forward", "post"])
@pytest.mark.parametrize("what", ["interrupt", "exit"])
def test_keyboard_interrupt_and_system_exit_still_stop_the_worker(what, step, caplog):
    caplog.set_level(logging.INFO, logger="corral")
    with FakeProxy(Hostile()) as proxy:
        proxy.send(batch_of([step, what]))
        assert proxy.receive() is None
    assert type(proxy.worker_error) is type(RAISABLE[what]())
    # Said whichever hook raised it: preprocess and postprocess had stopped the worker silently.
    hook = {"pre": "preprocess", "post": "postprocess"}.get(step, step)
    said = f"{hook} raised {type(RAISABLE[what]()).__name__}"
    assert any(said in record.getMessage() for record in caplog.records), caplog.text


def test_an_unencodable_result_becomes_an_error_result_alone():
    items = [
        protocol.ok(b"a" * 16, b"\x01"),
        {"id": b"b" * 16, "status": "ok", "data": object()},
        protocol.error(b"c" * 16, "fine \udcff"),
    ]
    frame = protocol.encode_results(items)
    decoded = protocol.decode_body(frame[4:])
    assert decoded["results"][0] == items[0]
    assert decoded["results"][1]["status"] == "error"
    assert "could not be encoded" in decoded["results"][1]["message"]
    assert decoded["results"][2] == protocol.error(b"c" * 16, "fine \\xff")


def test_results_over_the_frame_limit_fail_alone_and_the_frame_stays_under_it():
    items = [protocol.ok(bytes([n]) * 16, b"\xc4\xff" + b"x" * 255) for n in range(10)]
    frame = protocol.encode_results(items, limit=1500)
    decoded = protocol.decode_body(frame[4:])
    assert len(frame) - 4 <= 1500
    statuses = [r["status"] for r in decoded["results"]]
    assert statuses[:3] == ["ok"] * 3 and set(statuses[3:]) == {"error"}
    assert [r["id"] for r in decoded["results"]] == [r["id"] for r in items]
    assert "too large" in decoded["results"][-1]["message"]


def test_short_results_keep_their_place_beside_one_too_large():
    # Results shorter than the "too large" error: the frame fits with them as they are, the
    # long one failing alone (counting every result as that error first wrongly failed all).
    short = [protocol.ok(bytes([n]) * 16, b"\x01") for n in range(4)]
    items = [*short, protocol.ok(b"z" * 16, b"\xc4\xff" + b"x" * 255)]
    limit = len(protocol.encode_results(short)) - 4 + 100
    frame = protocol.encode_results(items, limit=limit)
    decoded = protocol.decode_body(frame[4:])
    assert len(frame) - 4 <= limit
    assert decoded["results"][:4] == short
    assert decoded["results"][4]["status"] == "error"


# -- a spawned worker exits when its proxy is gone ------------------------------------------

WORKER = """
import corral

class Echo(corral.Worker):
    def forward(self, batch):
        return batch

Echo.run()
"""


def wait_until_waiting(stream) -> None:
    """Read the worker's log until it says it is waiting for the proxy (its retry loop)."""
    for line in stream:
        if "waiting for the proxy" in line:
            return
    raise AssertionError("the worker exited before waiting for the proxy")


def spawned_env(tmp_path, proxy_pid: int) -> dict[str, str]:
    return {
        **os.environ,
        "CORRAL_WORKER_INDEX": "0",
        "CORRAL_PROXY_PID": str(proxy_pid),
        "CORRAL_SOCKET": str(tmp_path / "nobody-listens.sock"),
    }


@pytest.mark.timeout(60)
def test_a_spawned_worker_waiting_to_connect_exits_once_its_proxy_is_gone(tmp_path):
    proxy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER],
        env=spawned_env(tmp_path, proxy.pid),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_waiting(worker.stderr)
        proxy.kill()
        proxy.wait()
        assert worker.wait(timeout=30) == 0
    finally:
        for process in (worker, proxy):
            if process.poll() is None:
                process.kill()
                process.wait()
        worker.stderr.close()


SPAWNER = """
import os, subprocess, sys
env = {**os.environ, "CORRAL_PROXY_PID": str(os.getpid())}
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdin=subprocess.DEVNULL)
print(worker.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(60)
def test_a_spawned_worker_exits_when_its_parent_proxy_dies_even_unreaped(tmp_path):
    """The proxy is the worker's parent and stays a zombie (nobody reaps it while the test
    waits), so only the change of parent tells the worker it is gone."""
    env = spawned_env(tmp_path, 0)
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, WORKER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker_pid = int(parent.stdout.readline())
    try:
        wait_until_waiting(parent.stdout)
        os.kill(parent.pid, signal.SIGKILL)
        # The log pipe ends when the worker, the last process holding it, exits; the parent is
        # reaped only after that.
        remaining, _ = parent.communicate(timeout=30)
    finally:
        for pid in (worker_pid, parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)  # only if the test failed: no orphan left behind
            except ProcessLookupError:
                pass
        parent.wait()
    assert "proxy" in remaining and "gone" in remaining


def test_a_stage_name_from_an_undecodable_argument_still_makes_a_hello():
    worker = Sized()
    worker.stage = os.fsdecode(b"stage-\xff")  # as sys.argv holds a non-UTF-8 --stage
    with FakeProxy(worker) as proxy:
        assert proxy.hello["stage"] == "stage-\\xff"


# -- the proxy's last word, and frames it must not send ---------------------------------------

WAIT = 10  # seconds an Event may take before the test fails (a hang guard, not a timing)


@pytest.mark.parametrize("streams", [False, True])
def test_a_shutdown_sent_before_the_proxy_closed_stops_a_worker_whose_write_then_fails(streams):
    """The proxy's grace period ran out during `forward`: it sent `shutdown` and closed the
    connection. The worker's next write failed, and it once took that for a lost connection (a
    worker started by hand reconnected) though its reader held the shutdown."""
    started, release = threading.Event(), threading.Event()

    class Plain(corral.Worker):
        def forward(self, batch):
            started.set()
            release.wait(WAIT)
            return batch

    class Streaming(corral.Worker):
        def forward(self, batch):
            started.set()
            release.wait(WAIT)
            yield batch

    proxy, worker = socket.socketpair()
    ended: list[BaseException] = []

    def serve() -> None:
        try:
            (Streaming() if streams else Plain()).serve(worker)
        except BaseException as e:
            ended.append(e)
        finally:
            worker.close()  # serve leaves closing to its caller

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with proxy.makefile("rb") as stream:
        assert protocol.read_frame(stream)["type"] == "hello"
    proxy.sendall(protocol.encode_frame(batch_of(1)))
    assert started.wait(WAIT)
    proxy.sendall(protocol.encode_frame(protocol.shutdown("the grace period ran out")))
    proxy.shutdown(socket.SHUT_RDWR)
    proxy.close()
    release.set()
    thread.join(WAIT)
    assert len(ended) == 1 and isinstance(ended[0], SystemExit), ended
    assert ended[0].code == 0


def test_a_job_that_is_not_a_map_is_a_protocol_error_not_a_crash():
    with FakeProxy(Sized()) as proxy:
        proxy.send({"type": "batch", "jobs": [7]})
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, corral.ProtocolError), proxy.worker_error


def test_a_job_read_long_ago_has_its_deadline_from_then():
    """A batch sent ahead waits out the batch before it in the reader's queue: its deadline
    counts from when it was read (the reader's stamp), not from when it is prepared."""

    class Echo(corral.Worker):
        def forward(self, batch):
            return batch

    job = {"id": b"\1" * 16, "timeout_ms": 5000, "payload": msgpack.packb(1)}
    job[protocol.RECEIVED] = time.monotonic() - 10  # read 10 s ago, with 5 s to live
    answers, inputs, _ = _batch.prepare(Echo(), [job])
    assert answers[0] is not None and answers[0]["status"] == "expired"
    assert inputs == []


def test_a_process_forked_from_a_spawned_launcher_does_not_take_its_proxy_for_gone():
    """A launcher Corral spawned imports the package, then forks its workers
    (`multiprocessing`): each child inherited the launcher's first parent, the proxy's pid,
    saw its own parent differ, took the proxy for gone, and never served."""
    proxy = os.getpid()  # this process plays the proxy
    launcher = os.fork()
    if launcher == 0:
        _process_end._first_parent = os.getppid()  # as when the launcher started under the proxy
        child = os.fork()
        if child == 0:
            os._exit(1 if _process_end.ProxyWatch(proxy).gone() else 0)
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status))
    _, status = os.waitpid(launcher, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked worker took its proxy for gone"
