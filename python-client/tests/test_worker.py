"""The Worker base class against a fake proxy: per-item hooks, failures kept to their items, and
the protocol rules a worker must follow."""

import asyncio
import datetime
import decimal
import enum
import functools
import logging
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import msgpack
import msgspec
import pytest

import corral
from corral import _output, _worker, testing
from corral import _protocol as protocol
from corral.testing import FakeProxy, Result


class Echo(corral.Worker):
    def forward(self, batch):
        return batch


class Picky(corral.Worker):
    """Rejects negative numbers in preprocess, fails the batch on 13, doubles the rest."""

    def preprocess(self, item):
        if not isinstance(item, int) or item < 0:
            raise corral.ValidationError(f"want a natural number, got {item!r}")
        return item

    def forward(self, batch):
        if 13 in batch:
            raise ValueError("unlucky batch")
        return [x * 2 for x in batch]

    def postprocess(self, output):
        return {"doubled": output}


def test_says_hello_with_version_stage_and_pid():
    with FakeProxy(Echo()) as proxy:
        assert proxy.hello["version"] == corral.PROTOCOL_VERSION
        assert proxy.hello["stage"] == "default"
        assert proxy.hello["name"] == "Echo"
        assert isinstance(proxy.hello["pid"], int)


def test_echo_answers_each_item_in_order():
    items = [1, "two", [3.5, None], {"four": True}]
    with FakeProxy(Echo()) as proxy:
        assert proxy.infer(items) == [Result("ok", value=v) for v in items]
        assert proxy.infer([42]) == [Result("ok", value=42)]


def test_validation_error_rejects_only_that_item():
    with FakeProxy(Picky()) as proxy:
        got = proxy.infer([1, -1, 2, "x"])
    assert got[0] == Result("ok", value={"doubled": 2})
    assert got[1].status == "invalid" and "-1" in got[1].message
    assert got[2] == Result("ok", value={"doubled": 4})
    assert got[3].status == "invalid"


def test_forward_exception_fails_the_batch_and_the_worker_lives_on():
    with FakeProxy(Picky()) as proxy:
        got = proxy.infer([13, 1, -5])
        assert [r.status for r in got] == ["error", "error", "invalid"]
        assert "unlucky batch" in got[0].message
        assert proxy.infer([3]) == [Result("ok", value={"doubled": 6})]


def test_wrong_output_count_is_an_error_for_the_batch():
    class Short(corral.Worker):
        def forward(self, batch):
            return batch[:-1]

    with FakeProxy(Short()) as proxy:
        got = proxy.infer([1, 2])
    assert [r.status for r in got] == ["error", "error"]
    assert "1 output for 2 inputs" in got[0].message


def test_a_forward_that_consumes_or_pads_its_list_is_counted_by_what_it_was_given():
    class Popping(corral.Worker):
        def forward(self, batch):
            out = []
            while batch:
                out.append(batch.pop(0) * 2)
            return out

    class Padding(corral.Worker):
        def forward(self, batch):
            real = len(batch)
            batch.extend([0] * (4 - real))  # a model that takes batches of 4
            return [x + 1 for x in batch][:real]

    for worker, expected in ((Popping(), [2, 4, 6]), (Padding(), [2, 3, 4])):
        with FakeProxy(worker) as proxy:
            assert [r.value for r in proxy.infer([1, 2, 3])] == expected
    # Warm-up counts the same way.
    Popping.examples = (1, 2)
    Popping().warm_up()


def test_an_emptied_list_with_no_outputs_is_an_error_for_every_item():
    class Clearing(corral.Worker):
        def forward(self, batch):
            batch.clear()
            return []

    with FakeProxy(Clearing()) as proxy:
        got = proxy.infer([1, 2])
    assert [r.status for r in got] == ["error", "error"]
    assert "0 outputs for 2 inputs" in got[0].message


def test_an_async_forward_is_refused_where_the_class_is_defined():
    with pytest.raises(TypeError, match="forward is async"):

        class Waiting(corral.Worker):
            async def forward(self, batch):
                return batch

    # A sync wrapper that runs it, as the message advises, is a plain forward.
    def run_it(forward):
        @functools.wraps(forward)
        def wrapper(self, batch):
            return asyncio.run(forward(self, batch))

        return wrapper

    class Running(corral.Worker):
        @run_it
        async def forward(self, batch):
            return batch

    with FakeProxy(Running()) as proxy:
        assert [r.value for r in proxy.infer([1, 2])] == [1, 2]

    # One that hands the coroutine back is refused with the fix, per batch.
    class Handing(corral.Worker):
        def forward(self, batch):
            return Waiting_forward(batch)

    async def Waiting_forward(batch):
        return batch

    with FakeProxy(Handing()) as proxy:
        got = proxy.infer([1])
    assert got[0].status == "error" and "forward returned a coroutine" in got[0].message


def test_async_hooks_are_refused_where_the_class_is_defined():
    """They were accepted: each item reached forward as an un-awaited coroutine, and every
    request failed 500 ("cannot encode coroutine")."""
    for hook in ("preprocess", "postprocess"):

        async def waiting(self, item):
            return item

        with pytest.raises(TypeError, match=rf"Hooked\.{hook} is async"):
            type("Hooked", (corral.Worker,), {hook: waiting, "forward": lambda self, b: b})


class ModelOutput(dict):
    """What a transformers model returns: a dict of batched arrays."""


class Frame:
    """Enough of a pandas DataFrame: iterating it gives its column names."""

    columns = ("score", "label")

    def __iter__(self):
        return iter(self.columns)


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (ModelOutput(logits=[[0.1], [0.2]]), "forward returned a ModelOutput (keys 'logits')"),
        ("ab", "forward returned a str: return a list with one output per input"),
        (b"ab", "forward returned a bytes"),
        # Read byte by byte, it was answered 97 and 98, with 200.
        (memoryview(b"ab"), "forward returned a memoryview: return a list"),
        ({"a", "b"}, "forward returned a set, which has no order"),
        (frozenset("ab"), "forward returned a frozenset, which has no order"),
        (Frame(), "forward returned a Frame: iterating it gives its column names"),
        (None, "forward returned NoneType, not its outputs"),
        (7, "forward returned int, not its outputs"),
    ],
)
def test_forward_returning_what_is_not_its_outputs_fails_every_item_saying_so(returned, said):
    """A dict of as many keys as inputs was answered key by key (200 "logits" at a batch of
    one), a string character by character, a data frame of two columns its column names (200
    "score" and "label"); None said only "'NoneType' object is not iterable"."""

    class Returning(corral.Worker):
        def forward(self, batch):
            return returned

    with FakeProxy(Returning()) as proxy:
        got = proxy.infer(["x"] if isinstance(returned, ModelOutput) else ["x", "y"])
    assert {r.status for r in got} == {"error"}
    assert said in got[0].message


def test_an_endless_iterator_from_forward_is_read_one_past_the_count_and_refused():
    # `list()` read `itertools.count()` whole: 600 MB a second, the GIL held, until the
    # worker ran out of memory (the host's, unbounded).
    import itertools

    closed = []

    def outputs():
        try:
            yield from itertools.count()
        finally:
            closed.append(True)

    class Endless(corral.Worker):
        def forward(self, batch):
            return itertools.count() if batch[0] == "count" else outputs()

    with FakeProxy(Endless()) as proxy:
        counted = proxy.infer(["count", "y"])
        generated = proxy.infer(["gen"])
    said = "RuntimeError: forward returned more than 2 outputs for 2 inputs"
    assert [r.message for r in counted] == [said] * 2
    assert generated[0].message == "RuntimeError: forward returned more than 1 output for 1 input"
    assert closed == [True], "the generator is closed once read"


def test_an_exception_with_no_message_is_told_by_its_type_alone():
    # "MemoryError: ", with nothing after its colon, had gone to every client of the batch.
    class OutOfMemory(corral.Worker):
        def forward(self, batch):
            raise MemoryError()

    with FakeProxy(OutOfMemory()) as proxy:
        got = proxy.infer(["x", "y"])
    assert [(r.status, r.message) for r in got] == [("error", "MemoryError")] * 2


def test_a_generator_forward_hidden_by_a_decorator_is_refused_not_mixed_across_items():
    """Without functools.wraps the worker was not a streaming one, and each yielded step became
    one item's whole answer: one client got the other's tokens, 200."""

    def timed(forward):
        def wrapper(self, batch):  # no functools.wraps
            return forward(self, batch)

        return wrapper

    class Hidden(corral.Worker):
        @timed
        def forward(self, batch):
            for step in range(2):
                yield [f"{item}-tok{step}" for item in batch]

    with FakeProxy(Hidden()) as proxy:
        got = proxy.infer(["a", "b"])
    assert {r.status for r in got} == {"error"}
    assert "forward returned a generator, but the worker does not stream" in got[0].message
    assert "functools.wraps" in got[0].message


@pytest.mark.parametrize("examples", ["hello", {"text": "hi"}, 3])
def test_examples_that_are_not_a_sequence_of_requests_are_refused(examples):
    """("hello") without its comma warmed up on five one-character requests."""
    with pytest.raises(TypeError, match=r"Warm\.examples must be a tuple or list of requests"):
        type("Warm", (corral.Worker,), {"examples": examples, "forward": lambda self, b: b})


def test_a_plain_forward_may_return_a_generator_expression_or_a_helper_generator():
    """Only the hidden forward's own generator is refused: these were served, and are."""

    def doubled(batch):
        for x in batch:
            yield x * 2

    class Lazy(corral.Worker):
        examples = (1,)

        def forward(self, batch):
            return (x + 1 for x in batch)

    class Helped(corral.Worker):
        def forward(self, batch):
            return doubled(batch)

    class Indexed:  # a sequence by __getitem__ alone, which list() takes
        def __init__(self, items):
            self.items = items

        def __getitem__(self, i):
            return self.items[i]

    class Old(corral.Worker):
        def forward(self, batch):
            return Indexed(batch)

    Lazy().warm_up()
    for worker, expected in ((Lazy(), [2, 3]), (Helped(), [2, 4]), (Old(), [1, 2])):
        with FakeProxy(worker) as proxy:
            assert [r.value for r in proxy.infer([1, 2])] == expected


def test_examples_may_be_none_or_a_property():
    """None (no examples) and a property (loaded when the worker is made) were refused."""

    class Nothing(corral.Worker):
        examples = None

        def forward(self, batch):
            return batch

    class Loaded(corral.Worker):
        @property
        def examples(self):
            return (3,)

        def forward(self, batch):
            self.seen = list(batch)
            return batch

    Nothing().warm_up()
    loaded = Loaded()
    loaded.warm_up()
    assert loaded.seen == [3]


def test_remaining_in_forward_is_the_time_to_the_batch_last_deadline():
    """It was infinite in forward (the docs say a worker may skip work that can no longer
    make it), so a worker checking it never skipped."""
    seen = []

    class Checking(corral.Worker):
        def forward(self, batch):
            seen.append((self.remaining(), self.deadline, list(self.deadlines)))
            return batch

    with FakeProxy(Checking()) as proxy:
        proxy.infer([1, 2], timeout_ms=30_000)
    remaining, deadline, deadlines = seen[0]
    assert deadline == max(deadlines) and len(deadlines) == 2
    assert 0 < remaining <= 30


def test_the_batch_lists_read_in_preprocess_before_any_batch_are_empty_not_missing():
    """`deadlines` and `content_types` were only annotated: a `preprocess` reading them before
    the first batch raised AttributeError, a 500 for every request."""
    seen = []

    class Reading(corral.Worker):
        def preprocess(self, item):
            seen.append((list(self.deadlines), list(self.content_types)))
            return item

        def forward(self, batch):
            return batch

    with FakeProxy(Reading(), warm_up=False) as proxy:
        assert [r.status for r in proxy.infer([1])] == ["ok"]
    assert seen == [([], [])]
    assert corral.Worker.deadlines == [] and corral.Worker.content_types == []  # never added to


def test_run_has_its_own_help_on_the_class_and_on_an_instance():
    """`help(corral.Worker.run)` showed functools.partial's help: the package's entry point
    had no documentation where a user looks first."""
    import inspect

    for run in (corral.Worker.run, Echo().run):
        assert run.__doc__.startswith("Create the worker"), run.__doc__
        assert list(inspect.signature(run).parameters) == ["socket_path", "stage"]


def test_run_on_an_instance_serves_that_instance():
    """``Worker.run`` built a second worker from the class: a configured instance's settings
    were dropped (its threshold served as the class default), or its constructor's arguments
    missing raised inside the package."""
    served = []

    class Configured(corral.Worker):
        def __init__(self, threshold):
            super().__init__()
            self.threshold = threshold

        def forward(self, batch):
            return batch

        def _run_forever(self, path):
            served.append((self, path, self.stage))

    worker = Configured(0.9)
    worker.run("some.sock", stage="s")
    assert served == [(worker, "some.sock", "s")]
    assert worker.threshold == 0.9
    # From the class it is built, as before: a failure to, logged, ends the process.
    with pytest.raises(SystemExit, match=r"the worker failed to start: TypeError: .*threshold"):
        Configured.run("some.sock")


def test_a_bad_max_running_set_in_init_is_refused_before_it_serves():
    # Read first at serving: the worker failed past its warm-up, its traceback a line per frame.
    class Engine(corral.Worker):
        def __init__(self):
            super().__init__()
            self.max_running = "x"

        def forward(self, batch):
            yield [corral.END for _ in batch]

        def _run_forever(self, path):
            raise AssertionError("never served")

    with pytest.raises(SystemExit, match="max_running must be None or a non-negative integer"):
        Engine.run("some.sock")


def test_a_worker_without_forward_is_refused_before_it_serves():
    # It had answered every batch 500 for as long as it ran. A base class of one's own may
    # leave forward to its subclasses: refused when run (or served), not where it is defined.
    class Base(corral.Worker):
        def _run_forever(self, path):
            raise AssertionError("never served")

    class Set(Base):
        def __init__(self):
            super().__init__()
            self.forward = lambda batch: batch

    with pytest.raises(SystemExit, match="Base has no forward"):
        Base.run("some.sock")
    served = []
    Set._run_forever = lambda self, path: served.append(path)
    Set.run("some.sock")  # a forward set on the instance is one
    assert served == ["some.sock"]


def test_a_type_without_a_json_schema_serves_without_one():
    class Anything(corral.Worker):
        input_type = object

        def forward(self, batch):
            return batch

    assert Anything().schemas() == {}
    with FakeProxy(Anything()) as proxy:
        assert [r.value for r in proxy.infer([{"a": 1}])] == [{"a": 1}]


def test_a_worker_failing_before_its_hello_shows_why_in_the_fake_proxy():
    class Broken(corral.Worker):
        def __init__(self):
            self.max_running = -1  # set on the instance: refused when the hello is built

        def forward(self, batch):
            yield batch

    with pytest.raises(AssertionError, match="failed before its hello: TypeError: max_running"):
        with FakeProxy(Broken()):
            pass


@pytest.mark.parametrize("bad", [-1, True, "4", 2.0])
def test_a_bad_max_running_fails_where_the_class_is_defined(bad):
    # It had failed at the hello, so a spawned worker died before it on every restart.
    with pytest.raises(TypeError, match=r"Bad\.max_running must be None or a non-negative"):
        type("Bad", (corral.Worker,), {"max_running": bad, "forward": lambda self, b: (yield b)})


@pytest.mark.timeout(10)
def test_a_fake_proxy_used_outside_with_says_so_rather_than_waiting_forever():
    proxy = FakeProxy(Echo())  # its worker runs only inside `with`
    with pytest.raises(RuntimeError, match="inside a with block"):
        proxy.infer([1])
    with pytest.raises(RuntimeError, match="inside a with block"):
        proxy.stream([1])
    for step in (proxy.receive, proxy.half_close):
        with pytest.raises(RuntimeError, match="inside a with block"):
            step()
    proxy.close()  # nothing to close
    with FakeProxy(Echo()) as used:
        assert used.infer([1])[0].value == 1
    with pytest.raises(RuntimeError, match="inside a with block"):
        used.infer([1])  # after the block as before it
    used.close()


def test_an_empty_corral_socket_means_the_default(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setenv("CORRAL_SOCKET", "")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corral.Worker, "_run_forever", lambda self, path: seen.append(path))
    Echo.run()
    assert seen == ["corral.sock"]


def test_unencodable_output_fails_only_that_item():
    class Odd(corral.Worker):
        def forward(self, batch):
            # Encoding fails part-way through: nothing it wrote may reach the next output.
            return [["partial", object()] if x == "bad" else x for x in batch]

    with FakeProxy(Odd()) as proxy:
        got = proxy.infer(["bad", "good"])
    assert got[0].status == "error" and "object" in got[0].message
    assert got[1] == Result("ok", value="good")


def test_objects_with_tolist_are_encoded():
    class Vector:
        def tolist(self):
            return [1.0, 2.0]

    class Arrays(corral.Worker):
        def forward(self, batch):
            return [Vector() for _ in batch]

    with FakeProxy(Arrays()) as proxy:
        assert proxy.infer([0]) == [Result("ok", value=[1.0, 2.0])]


def test_undecodable_payload_is_invalid_for_that_item_only():
    with FakeProxy(Echo()) as proxy:
        proxy.send(
            protocol_batch([(b"a" * 16, b"\xc1"), (b"b" * 16, b"\x01"), (b"c" * 16, b"\x92\x01")])
        )
        answer = proxy.receive()
    statuses = {r["id"][:1]: r["status"] for r in answer["results"]}
    assert statuses == {b"a": "invalid", b"b": "ok", b"c": "invalid"}


def test_reject_stops_the_worker():
    with FakeProxy(Echo()) as proxy:
        proxy.send({"type": "reject", "message": "version 9 is not supported"})
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, SystemExit)
    assert "version 9" in str(proxy.worker_error)


def test_a_frame_over_the_limit_is_a_protocol_error():
    with FakeProxy(Echo()) as proxy:
        proxy.send_raw(struct.pack(">I", corral.MAX_FRAME_BYTES + 1))
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, corral.ProtocolError)


def test_an_unknown_message_is_a_protocol_error():
    with FakeProxy(Echo()) as proxy:
        proxy.send({"type": "dance"})
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, corral.ProtocolError)


def test_run_connects_to_the_socket_and_reconnects(tmp_path, monkeypatch, caplog):
    """Worker.run against a real listening Unix socket: hello, a batch, then a second connection
    after the first one is closed by the 'proxy', and no third once the proxy's process is gone:
    the loop returns."""
    # The process the worker is told is its proxy: the test ends it before the last close.
    stand_in = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with subprocess.Popen(stand_in, stdin=subprocess.PIPE) as proxy:
        try:
            monkeypatch.setenv("CORRAL_PROXY_PID", str(proxy.pid))
            monkeypatch.delenv("CORRAL_WORKER_INDEX", raising=False)  # external: it reconnects
            caplog.set_level(logging.INFO, logger="corral")
            serve_twice_then_end_the_proxy(str(tmp_path / "w.sock"), proxy)
            assert f"the proxy (pid {proxy.pid}) is gone; exiting" in caplog.messages
        finally:
            proxy.kill()


def stand_in_proxy(path: str) -> tuple[socket.socket, threading.Thread]:
    """A socket listening at ``path`` as the proxy's would, and an external Echo worker's
    connect loop for it, not started yet."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.settimeout(30)  # a worker that never reconnects fails the test, not pytest's timeout
    server.bind(path)
    server.listen()
    return server, threading.Thread(target=Echo()._run_forever, args=(path,), daemon=True)


def serve_twice_then_end_the_proxy(path: str, proxy: subprocess.Popen) -> None:
    server, thread = stand_in_proxy(path)
    with server:
        thread.start()
        for n in range(2):
            conn, _ = server.accept()
            with conn, conn.makefile("rb") as stream:
                assert protocol.read_frame(stream)["type"] == "hello"
                conn.sendall(protocol.encode_frame(protocol_batch([(b"i" * 16, b"\x07")])))
                results = protocol.read_frame(stream)["results"]
                assert results == [protocol.ok(b"i" * 16, b"\x07")]
                if n == 1:
                    # Gone (and reaped) before the worker sees this connection close.
                    proxy.kill()
                    proxy.wait()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the worker went on reconnecting after its proxy exited"


def test_sessions_that_end_as_they_start_are_retried_with_a_backoff(tmp_path, monkeypatch):
    """A proxy that drops every connection at once (another version refusing the hello, say)
    had an external worker reconnect with no pause: some 250 connections a second."""
    slept = []

    class Clock(_Clock):  # stands still, so every session is short; sleeping is recorded
        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    monkeypatch.setattr("corral._serve.time", Clock())
    stand_in = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with subprocess.Popen(stand_in, stdin=subprocess.PIPE) as proxy:
        try:
            monkeypatch.setenv("CORRAL_PROXY_PID", str(proxy.pid))
            monkeypatch.delenv("CORRAL_WORKER_INDEX", raising=False)
            server, thread = stand_in_proxy(str(tmp_path / "w.sock"))
            with server:
                thread.start()
                for n in range(4):
                    conn, _ = server.accept()
                    with conn, conn.makefile("rb") as stream:
                        assert protocol.read_frame(stream)["type"] == "hello"
                        if n == 3:
                            proxy.kill()  # gone before the worker sees this close
                            proxy.wait()
            thread.join(timeout=30)
        finally:
            proxy.kill()
    assert not thread.is_alive()
    assert slept[:3] == [0.05, 0.1, 0.2]  # before the second, third and fourth connection


def protocol_batch(jobs):
    return {
        "type": "batch",
        "jobs": [{"id": i, "timeout_ms": 1000, "payload": p} for i, p in jobs],
    }


class _Clock:
    """A monotonic clock the test moves on; the rest of the time module is the real one."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def stopped_clock(monkeypatch):
    """The package's clock stands still (at 1000 s): a deadline is exactly what the job said."""
    clock = _Clock()
    for module in ("corral._serve", "corral._batch", "corral._worker"):
        monkeypatch.setattr(f"{module}.time", clock)
    return clock


def test_deadlines_are_exposed_to_every_hook(stopped_clock):
    seen = []

    class Clock(corral.Worker):
        def preprocess(self, item):
            seen.append(("pre", item, self.remaining()))
            return item

        def forward(self, batch):
            seen.append(("forward", batch, [d - stopped_clock.now for d in self.deadlines]))
            return batch

        def postprocess(self, output):
            seen.append(("post", output, self.remaining()))
            return output

    with FakeProxy(Clock()) as proxy:
        got = proxy.infer([1, 2], timeout_ms=3000)
    assert got == [Result("ok", value=1), Result("ok", value=2)]
    assert seen == [
        ("pre", 1, 3.0),
        ("pre", 2, 3.0),
        ("forward", [1, 2], [3.0, 3.0]),
        ("post", 1, 3.0),
        ("post", 2, 3.0),
    ]


def test_hooks_set_on_the_instance_run_and_see_each_items_deadline(stopped_clock):
    # Without hooks of its class the worker skips them; ones set on the instance still run.
    seen = []

    def preprocess(item):
        seen.append(("pre", item, round(worker.remaining())))
        return item + 1

    def postprocess(output):
        seen.append(("post", output, round(worker.remaining())))
        return output * 10

    worker = Echo()
    worker.preprocess = preprocess
    worker.postprocess = postprocess
    with FakeProxy(worker) as proxy:
        got = proxy.infer([1, 2], timeout_ms=60_000)
    assert got == [Result("ok", value=20), Result("ok", value=30)]
    assert sorted(seen) == [("post", 2, 60), ("post", 3, 60), ("pre", 1, 60), ("pre", 2, 60)]


def test_a_job_that_expires_while_an_earlier_one_decodes_is_not_processed(monkeypatch):
    # No preprocess of its own, but decoding is the worker's code too (a typed input's
    # __post_init__, a large payload): a later job's deadline is checked when it is reached.
    clock = _Clock()
    monkeypatch.setattr("corral._batch.time", clock)

    class Slow(msgspec.Struct):
        x: int

        def __post_init__(self):
            clock.now += 1.0  # one second to decode

    class Typed(corral.Worker):
        input_type = Slow

        def forward(self, batch):
            return [item.x for item in batch]

    jobs = [
        {"id": bytes([i]) * 16, "payload": msgpack.packb({"x": i}), "timeout_ms": 1500}
        for i in range(3)
    ]
    answers = Typed()._corral_process(jobs)
    assert [a["status"] for a in answers] == ["ok", "ok", "expired"]


def test_a_patched_base_hook_is_called(monkeypatch):
    # A spy on Worker.preprocess (instrumentation, a test's mock) replaces the pass-through.
    calls = []

    def spy(self, item):
        calls.append(item)
        return item

    monkeypatch.setattr(corral.Worker, "preprocess", spy)
    with FakeProxy(Echo()) as proxy:
        assert proxy.infer([5]) == [Result("ok", value=5)]
    assert calls == [5]


def test_a_job_already_past_its_deadline_is_not_processed():
    calls = []

    class Counting(corral.Worker):
        def forward(self, batch):
            calls.append(batch)
            return batch

    with FakeProxy(Counting()) as proxy:
        got = proxy.infer([1], timeout_ms=0)
    assert got[0].status == "expired" and "deadline" in got[0].message
    assert calls == []


def test_shutdown_stops_the_worker_cleanly():
    with FakeProxy(Echo()) as proxy:
        proxy.send({"type": "shutdown", "message": "proxy shutting down"})
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, SystemExit)
    assert proxy.worker_error.code == 0


def test_warm_up_runs_the_examples_through_every_hook():
    seen = []

    class Warm(corral.Worker):
        examples = (1, 2)

        def preprocess(self, item):
            seen.append(("pre", item))
            return item

        def forward(self, batch):
            seen.append(("forward", list(batch)))
            return batch

    Warm().warm_up()
    assert seen == [("pre", 1), ("pre", 2), ("forward", [1, 2])]


def test_warm_up_holds_outputs_to_what_the_proxy_reads():
    # Nested past the proxy's 128 levels, an output passed warm-up and FakeProxy's start: the
    # worker said ready and every request was a 500 bad_output. Streamed chunks alike.
    def nested(levels):
        value = 1
        for _ in range(levels):
            value = [value]
        return value

    class Deep(corral.Worker):
        examples = (1,)
        levels = 129

        def forward(self, batch):
            return [nested(self.levels) for _ in batch]

    class DeepChunks(corral.Worker):
        examples = (1,)

        def forward(self, batch):
            yield [nested(130) for _ in batch]

    for worker in (Deep(), DeepChunks()):
        with pytest.raises(ValueError, match="nested deeper than 128 levels"):
            worker.warm_up()
    shallow = Deep()
    shallow.levels = 127
    shallow.warm_up()

    # The example is named, among streamed ones run max_running at a time too.
    class OneAtATime(corral.Worker):
        examples = ("ok", "deep")
        max_running = 1

        def forward(self, batch):
            yield [nested(130 if item == "deep" else 1) for item in batch]

    with pytest.raises(ValueError, match="a chunk of example 1 is not one the proxy reads"):
        OneAtATime().warm_up()

    # A map key that is a map (a frozen Struct as a dict's key, as msgspec writes it): served
    # by the proxy, so not refused here.
    import msgspec

    class Key(msgspec.Struct, frozen=True):
        k: int

    class Keyed(corral.Worker):
        examples = (1,)
        output_type = dict[Key, int]

        def forward(self, batch):
            return [{Key(1): item} for item in batch]

    Keyed().warm_up()

    class InArrays(Keyed):
        output_type = dict[tuple[Key, ...], int]

        def forward(self, batch):
            return [{(Key(1),): item} for item in batch]

    InArrays().warm_up()
    # A map as a key is one level, as the proxy counts it: 128 in all passes, 129 does not.
    at_limit = b"\x81\x81\xa1a" + b"\x91" * 126 + b"\xc0\x01"
    _output.check(at_limit, "the output")
    with pytest.raises(ValueError, match="nested deeper than 128"):
        _output.check(b"\x81\x81\xa1a" + b"\x91" * 127 + b"\xc0\x01", "the output")


def test_a_failing_warm_up_keeps_the_worker_from_serving(tmp_path, monkeypatch):
    class Broken(corral.Worker):
        examples = ("boom",)

        def forward(self, batch):
            raise RuntimeError("model weights missing")

    connected = []
    monkeypatch.setattr(Broken, "_run_forever", lambda self, path: connected.append(path))
    try:
        Broken.run(str(tmp_path / "never.sock"))
        raise AssertionError("run() returned")
    except SystemExit as e:
        assert "model weights missing" in str(e)
    assert connected == []


def test_a_weight_rule_goes_in_the_hello_and_a_bad_one_fails_at_definition():
    class Weighed(corral.Worker):
        weight = "/text"

        def forward(self, batch):
            return batch

    with FakeProxy(Weighed()) as proxy:
        assert proxy.hello["weight"] == "/text"
    with FakeProxy(Echo()) as proxy:
        assert "weight" not in proxy.hello
    for bad in ["text", "/a~2", "/a~", 5]:
        # "/a~2" passed here and in FakeProxy, and the proxy refused it at every connection.
        with pytest.raises(TypeError, match="JSON Pointer"):
            type("Bad", (corral.Worker,), {"weight": bad})
    for good in ["", "/", "/a~0b/~1c"]:
        type("Good", (corral.Worker,), {"weight": good})


@pytest.mark.parametrize("bad", ["text", 5])
def test_a_bad_weight_set_after_the_class_statement_fails_before_the_hello(bad):
    # Read from configuration after the class was made: FakeProxy served it, and the proxy
    # refused the worker at every start (for 5, naming no `weight`).
    class Late(corral.Worker):
        def forward(self, batch):
            return batch

    Late.weight = bad
    with pytest.raises(AssertionError, match=r"before its hello: TypeError: Late\.weight must"):
        with FakeProxy(Late()):
            pass


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("input_type", int),
        ("output_type", list[float]),
        ("inputs", (corral.Tensor("X", "FP32", [3]),)),
        ("outputs", [corral.Tensor("Y", "FP32", [3])]),
        ("output_content_type", "image/png"),
        ("weight", "/text"),
    ],
)
def test_a_declaration_set_on_the_instance_is_refused_before_the_hello(attribute, value):
    # Read from the class wherever the worker runs: an instance's input_type was advertised in
    # /openapi.json and enforced nowhere.
    class Late(corral.Worker):
        def __init__(self) -> None:
            setattr(self, attribute, value)

        def forward(self, batch):
            return batch

    with pytest.raises(AssertionError, match=f"Late.{attribute} is set on the instance"):
        with FakeProxy(Late()):
            pass


def test_the_same_names_for_a_model_s_own_data_are_left_alone():
    # Common names in model code: a parameter tensor, a buffer, none a declaration.
    class Model(corral.Worker):
        def __init__(self) -> None:
            self.weight = 2.0
            self.inputs = []
            self.outputs = {"buffer": 1}
            self.input_type = None

        def forward(self, batch):
            return [x * self.weight for x in batch]

    with FakeProxy(Model()) as proxy:
        assert proxy.infer([1]) == [Result("ok", 2.0)]


def test_the_published_schema_is_the_class_s():
    class Typed(corral.Worker):
        input_type = int

        def forward(self, batch):
            return batch

    assert "integer" in Typed().schemas()["input_schema"]


@pytest.mark.parametrize("stage", [5, ""])
def test_a_stage_that_is_no_name_fails_where_it_is_given(stage):
    with pytest.raises(TypeError, match="stage must be a stage's name"):
        type("Staged", (corral.Worker,), {"stage": stage})
    # None on the class: given where it runs (run(stage=...), --stage, CORRAL_STAGE).
    type("Later", (corral.Worker,), {"stage": None})
    # Nor a property: run() sets it (Corral gives every spawned worker CORRAL_STAGE).
    with pytest.raises(TypeError, match="not a property"):
        type("Named", (corral.Worker,), {"stage": property(lambda self: "x")})

    class Later(corral.Worker):
        def forward(self, batch):
            return batch

    worker = Later()
    worker.stage = stage  # as __init__ might: checked before the hello
    with pytest.raises(AssertionError, match="stage must be a stage's name"):
        with FakeProxy(worker):
            pass


@pytest.mark.parametrize("streaming", [False, True])
def test_fake_proxy_says_why_the_worker_stopped_mid_batch(streaming):
    class Exits(corral.Worker):
        def forward(self, batch):
            if streaming:
                yield from ()
            raise SystemExit("model crashed: CUDA error")

    with FakeProxy(Exits(), warm_up=False) as proxy:
        with pytest.raises(AssertionError, match="the worker stopped: SystemExit: model crashed"):
            proxy.infer([1])


def test_a_socket_path_too_long_for_a_unix_socket_stops_the_worker_saying_so(tmp_path):
    """Every connect failed "AF_UNIX path too long", taken for a proxy not there yet: the worker
    waited for ever."""
    path = str(tmp_path / ("s" * 120))
    stopped: list[BaseException] = []

    def run() -> None:
        try:
            Echo()._run_forever(path)
        except BaseException as e:
            stopped.append(e)

    # In a thread: the old worker never returned, and this test must fail, not hang.
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert stopped, "the worker was still waiting"
    assert isinstance(stopped[0], SystemExit)
    assert "bytes over the 107 a Unix socket's path may have" in str(stopped[0])


def test_a_fake_proxy_given_the_class_says_to_give_an_instance():
    with pytest.raises(TypeError, match=r"FakeProxy\(Echo\(\)\), not the class"):
        FakeProxy(Echo)  # type: ignore[arg-type]


def test_an_error_message_for_the_batch_clients_is_cut_and_says_so():
    """A 2 MiB exception message was each batch-mate's 500 body."""

    class Quoting(corral.Worker):
        def forward(self, batch):
            raise ValueError("x" * 2_000_000)

    with FakeProxy(Quoting()) as proxy:
        got = proxy.infer([1, 2])
    assert {r.status for r in got} == {"error"}
    message = got[0].message
    assert message.startswith("ValueError: xxx")
    assert message.endswith("… (cut: 2,000,012 characters in all)")
    assert len(message) < 2100


@pytest.mark.parametrize("stop", [SystemExit(3), KeyboardInterrupt()])
def test_a_stop_raised_in_forward_is_logged_before_the_worker_stops(stop, caplog):
    """A library's sys.exit() in forward ended the worker with nothing in its log (Ctrl-C, a
    KeyboardInterrupt, is said at info, without a traceback)."""

    class Exiting(corral.Worker):
        def forward(self, batch):
            raise stop

    caplog.set_level(logging.INFO, logger="corral")
    with FakeProxy(Exiting()) as proxy:
        proxy.send(protocol.batch([protocol.job(b"j" * 16, 5000, msgpack.packb(1))]))
        assert proxy.receive() is None  # the worker closed its end, answering nothing
    assert isinstance(proxy.worker_error, type(stop))
    assert f"forward raised {type(stop).__name__}" in caplog.text
    assert "this worker stops" in caplog.text


def test_max_running_on_a_plain_worker_is_warned_about(caplog):
    """It was ignored without a word: items never join a plain forward."""

    class Plain(corral.Worker):
        max_running = 8

        def forward(self, batch):
            return batch

    caplog.set_level(logging.WARNING, logger="corral")
    with FakeProxy(Plain()) as proxy:
        assert [r.value for r in proxy.infer([1])] == [1]
    assert "max_running is set but forward is not a generator" in caplog.text


class Color(enum.Enum):
    RED = "red"


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (2**64, "an integer of 65 bits is past msgpack's range"),
        (datetime.date(2026, 1, 1), "return value.isoformat()"),
        (datetime.timedelta(seconds=5), "return value.total_seconds() (seconds, a float)"),
        (uuid.UUID(int=1), "return str(value)"),
        (Color.RED, "return value.value"),
        (object(), "return str, int, float, bool, None, bytes, or a list or dict of them"),
    ],
)
def test_an_output_msgpack_cannot_encode_says_what_to_return_instead(output, said):
    """It said only "cannot encode int as msgpack" (of an integer too large), or the type."""

    class Returning(corral.Worker):
        def forward(self, batch):
            return [output for _ in batch]

    with FakeProxy(Returning()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "error"
    assert "as msgpack: " in got.message and said in got.message, got.message


@pytest.mark.parametrize(
    ("kind", "value", "said"),
    [
        ("datetime64", "2026-01-01", "numpy's datetime64 as msgpack: return str(value) (ISO"),
        ("timedelta64", 5, "numpy's timedelta64 as msgpack: return value / numpy.timedelta64(1"),
        ("complex128", 1 + 2j, "numpy's complex128 as msgpack: return str"),
    ],
)
def test_a_numpy_scalar_msgpack_cannot_encode_says_what_to_return_instead(kind, value, said):
    """Converted to a Python date, timedelta or complex, msgpack (its fallback spent) said only
    "can not serialize 'datetime.date' object"; then a datetime64 was told to use the
    `isoformat()` numpy's has not, and a timedelta64 was told nothing."""
    numpy = pytest.importorskip("numpy")
    output = (
        getattr(numpy, kind)(value, "s") if kind == "timedelta64" else getattr(numpy, kind)(value)
    )

    class Returning(corral.Worker):
        def forward(self, batch):
            return [output for _ in batch]

    with FakeProxy(Returning()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "error" and said in got.message, got.message
    assert "isoformat" not in got.message


def test_another_class_s_tolist_that_gives_nothing_msgpack_writes_is_said_so():
    """msgpack calls the fallback once: a user's tensor class whose `tolist()` gave a Decimal
    had msgpack's own "can not serialize" words, and one that gave its own class numpy's
    advice for a longdouble."""

    class Vec:
        def __init__(self, value):
            self.value = value

        def tolist(self):
            return self.value

    class Returning(corral.Worker):
        def forward(self, batch):
            returned = [Vec(decimal.Decimal("1.5")), Vec(Vec([1])), Vec([1, 2]), Vec(2**70)]
            return returned[: len(batch)]

    with FakeProxy(Returning()) as proxy:
        dec, again, fine, wide = proxy.infer([1, 2, 3, 4])
    assert "its tolist() gave int: an integer of 71 bits is past msgpack's range" in wide.message
    assert dec.status == "error"
    assert "Vec as msgpack: its tolist() gave Decimal: return str(value)" in dec.message
    assert again.status == "error" and "numpy" not in again.message.partition("(")[0]
    assert "its tolist() gives a Vec again" in again.message
    assert fine == Result("ok", [1, 2])


def test_an_output_type_writes_numpy_s_dates_and_durations_as_the_advice_says():
    # "declare an output_type, which writes it so" had been false for numpy's datetime64: the
    # same error, with or without one.
    numpy = pytest.importorskip("numpy")

    class Out(msgspec.Struct):
        when: datetime.datetime
        took: Any

    class Typed(corral.Worker):
        output_type = Out

        def forward(self, batch):
            when, took = numpy.datetime64("2026-01-01T12:00:00"), numpy.timedelta64(5, "s")
            return [Out(when, took) for _ in batch]

    with FakeProxy(Typed()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "ok" and got.value == {"when": "2026-01-01T12:00:00", "took": "PT5S"}


def test_numpy_s_nanosecond_dates_are_written_as_dates_and_its_date_arrays_refused_alike():
    # At nanoseconds (pandas' unit) numpy gives a bare integer: an output_type wrote 1704164645
    # 123456789, and a plain worker sent it unrefused; an array of days was told `isoformat()`.
    numpy = pytest.importorskip("numpy")
    when = numpy.datetime64("2024-01-02T03:04:05.123456789", "ns")

    class Out(msgspec.Struct):
        when: Any
        days: Any

    class Typed(corral.Worker):
        output_type = Out

        def forward(self, batch):
            days = numpy.array(["2024-01-02"], dtype="datetime64[D]")
            return [Out(when, days) for _ in batch]

    with FakeProxy(Typed()) as proxy:
        (got,) = proxy.infer([1])
    assert got.value == {"when": "2024-01-02T03:04:05.123456789", "days": ["2024-01-02"]}

    class Plain(corral.Worker):
        def forward(self, batch):
            return [{"when": when, "days": numpy.array(["2024-01-02"], "datetime64[D]")}] * len(
                batch
            )

    with FakeProxy(Plain()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "error" and "numpy's datetime64 as msgpack" in got.message, got.message
    assert "isoformat" not in got.message


@pytest.mark.parametrize(
    ("value", "unit", "said"),
    [
        (10**9, "D", "longer than a Python timedelta holds"),  # cast, its sign had wrapped
        (1500, "ns", "finer than a microsecond"),  # cut to 1 µs without a word
        (3, "M", "months and years no fixed length"),  # numpy's average month, as exact
        # No unit: cast to microseconds it went out as "PT0.000005S", where a worker without an
        # output_type refuses it.
        (5, "generic", "it has no unit: give it one, e.g. numpy.timedelta64(5, 's')"),
        ("NaT", "generic", None),  # a missing value needs no length: null
    ],
)
def test_a_numpy_duration_an_output_type_cannot_write_exactly_is_refused(value, unit, said):
    numpy = pytest.importorskip("numpy")

    class Out(msgspec.Struct):
        took: Any

    class Typed(corral.Worker):
        output_type = Out

        def forward(self, batch):
            return [Out(numpy.timedelta64(value, unit)) for _ in batch]

    with FakeProxy(Typed()) as proxy:
        (got,) = proxy.infer([1])
    if said is None:
        assert got == Result("ok", {"took": None})
    else:
        assert got.status == "error" and said in got.message, got.message


def test_another_class_s_tolist_that_gives_a_numpy_value_is_converted_in_turn():
    # Refused, saying that numpy's arrays are converted.
    numpy = pytest.importorskip("numpy")

    class Wrapped:
        def tolist(self):
            return numpy.array([1.5, 2.5])

    class Returning(corral.Worker):
        def forward(self, batch):
            return [Wrapped() for _ in batch]

    with FakeProxy(Returning()) as proxy:
        assert proxy.infer([1]) == [Result("ok", [1.5, 2.5])]


def test_an_output_type_writes_numpy_s_years_past_0000_to_9999_in_iso_8601_s_expanded_form():
    # numpy's own text had gone out as is: the year -5 as "-005" (three digits) and 12000 with
    # no sign, neither of them ISO 8601.
    numpy = pytest.importorskip("numpy")

    class Out(msgspec.Struct):
        before: Any
        after: Any
        days: Any
        wire: Any
        hidden: Any

    class Typed(corral.Worker):
        output_type = Out

        def forward(self, batch):
            before, after = numpy.datetime64("-0005-01-01"), numpy.datetime64("12000-01-01T05")
            days = numpy.array([["0000-01-01", "NaT", "-10000-03-01"]], dtype="datetime64[D]")
            # Big-endian, as read from a file in network order: numpy's text had read its bytes
            # as this machine's ("2020-01-01" as the year 17021397593678114).
            wire = numpy.array(["2020-01-01", "12000-01-01"], dtype=">M8[D]")
            # A masked date is missing, as a masked float is (null): its hidden value had gone.
            hidden = numpy.ma.masked_array(wire.astype("M8[D]"), mask=[False, True])
            return [Out(before, after, days, wire, hidden) for _ in batch]

    with FakeProxy(Typed()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "ok", got.message
    assert got.value == {
        "before": "-0005-01-01",
        "after": "+12000-01-01T05",
        "days": [["0000-01-01", None, "-10000-03-01"]],
        "wire": ["2020-01-01", "+12000-01-01"],
        "hidden": ["2020-01-01", None],
    }


def test_a_type_not_yet_defined_beside_declared_tensors_is_left_to_the_checks_that_read_it():
    # msgspec cannot describe a forward reference before its class exists: the class
    # definition had raised NameError.
    class Later(msgspec.Struct):
        y: "Undefined"  # noqa: F821

    class Early(corral.Worker):
        outputs = (corral.Tensor("y", "FP32", [1]),)
        output_type = Later

        def forward(self, batch):
            return batch

    assert Early.output_type is Later


def test_run_checks_the_socket_path_before_the_model_is_made(tmp_path):
    """The path was checked only once warm-up was done: minutes of loading, then the exit."""
    made = []

    class Heavy(corral.Worker):
        def __init__(self):
            super().__init__()
            made.append(self)

        def forward(self, batch):
            return batch

    stopped: list[BaseException] = []

    def run() -> None:
        try:
            Heavy.run(str(tmp_path / ("s" * 120)))
        except BaseException as e:
            stopped.append(e)

    thread = threading.Thread(target=run, daemon=True)  # the old worker waited for ever
    thread.start()
    thread.join(timeout=30)
    assert stopped and "bytes over the 107" in str(stopped[0]), stopped
    assert made == []


def test_the_fake_proxy_checks_outputs_as_the_proxy_does():
    """An output nested past 128 levels, or a malformed tensor, is that item's 500 from the
    proxy; FakeProxy had passed the first and raised on the second. A tuple key (an array key,
    which the proxy passes to msgpack clients) had crashed it."""
    deep = 0
    for _ in range(129):
        deep = [deep]

    class Odd(corral.Worker):
        def forward(self, batch):
            return batch

        def postprocess(self, output):
            return {
                "deep": deep,
                "deepest": deep[0],
                "tensor": msgpack.ExtType(1, b"abc"),
                "tuple": {(1, 2): "a"},
            }.get(output, output)

    with FakeProxy(Odd()) as proxy:
        got = proxy.infer(["deep", "deepest", "tensor", "tuple", "fine"])
    assert [r.status for r in got] == ["error", "ok", "error", "ok", "ok"], got
    assert "nested deeper than 128" in got[0].message
    assert got[2].message.startswith("the worker's output for this job is not one well-formed")
    assert got[3].value == {(1, 2): "a"}


def test_the_fake_proxy_fails_a_stream_whose_chunk_it_cannot_read_and_cancels_it():
    class Chunks(corral.Worker):
        def forward(self, batch):
            while True:
                yield [msgpack.ExtType(1, b"abc") if item == "bad" else item for item in batch]

    with FakeProxy(Chunks()) as proxy:
        bad, good = proxy.stream(["bad", "good"], cancel_after={1: 2})
    assert (bad.status, bad.chunks) == ("error", []), bad
    assert bad.message.startswith("the worker's output for this job is not one well-formed")
    assert (good.chunks, good.status) == (["good", "good"], "end"), good  # cancelled


def test_the_fake_proxy_warms_the_worker_up_as_corral_s_worker_does():
    # It had served a worker whose examples fail, which under Corral exits and restarts forever.
    class BadExamples(corral.Worker):
        examples = ("ok", "boom")

        def forward(self, batch):
            if "boom" in batch:
                raise ValueError("boom in warm-up")
            return batch

    with pytest.raises(AssertionError, match="warm-up failed: ValueError: boom in warm-up"):
        with FakeProxy(BadExamples()):
            pass
    with FakeProxy(BadExamples(), warm_up=False) as proxy:
        assert [r.value for r in proxy.infer(["x"])] == ["x"]


def test_max_running_set_later_or_on_a_plain_worker_is_not_refused_at_definition():
    class Later(corral.Worker):
        @property
        def max_running(self):
            return 4

        def forward(self, batch):
            yield [corral.END] * len(batch)

    class Plain(corral.Worker):
        max_running = "4"  # a plain worker's is warned of when it serves

        def forward(self, batch):
            return batch

    with FakeProxy(Later()) as proxy:
        assert proxy.hello["max_batch"] == 4


def test_a_fake_proxy_refuses_what_the_proxy_would_not_send():
    """No items, a content type the proxy reads as values (JSON, msgpack) or answers 415 (a
    form, no media type): sent as given, a test passed that real clients would fail."""
    with FakeProxy(Echo()) as proxy:
        with pytest.raises(ValueError, match="no items"):
            proxy.infer([])
        for named in ("application/json", "application/vnd.api+json", "application/msgpack"):
            with pytest.raises(ValueError, match="reads such a body as a value"):
                proxy.infer([b"{}"], content_type=named)
        for named in ("application/x-www-form-urlencoded", "notamediatype"):
            with pytest.raises(ValueError, match="answers such a request 415"):
                proxy.infer([b"a=1"], content_type=named)
        assert proxy.infer([b"x"], content_type="text/plain; charset=utf-8")[0].value == b"x"


def test_a_fake_proxy_tells_a_failure_without_a_message_as_the_proxy_does():
    class Silent(corral.Worker):
        def preprocess(self, item):
            raise corral.ValidationError()

        def forward(self, batch):
            return batch

    with FakeProxy(Silent(), warm_up=False) as proxy:
        (invalid,) = proxy.infer(["bad"])
    assert invalid == Result("invalid", message="the worker gave no reason")
    # An `error` without a message, which this package never sends (its messages name the
    # exception's type), but a worker of another language may: read as the proxy tells it.
    assert testing._message({"status": "error"}) == "the worker gave no reason"
    assert testing._message({"status": "error", "message": ""}) == "the worker gave no reason"


def test_an_output_content_type_set_after_the_class_is_checked_when_it_serves():
    """Set from configuration after the class was defined, a bad name went to the proxy, which
    answered every bytes output 500 bad_output (FakeProxy had said ok)."""

    class Thumbnail(corral.Worker):
        def forward(self, batch):
            return [bytes(item) for item in batch]

    Thumbnail.output_content_type = "not a media type"
    with pytest.raises(Exception, match="output_content_type must be a media type"):
        with FakeProxy(Thumbnail()) as proxy:
            proxy.infer([b"x"], content_type="image/png")


def test_the_worker_s_own_arguments_are_not_taken_for_abbreviations(monkeypatch):
    # argparse's abbreviations read a worker's own `--sock x` as `--socket x`, and refused its
    # `--s 5` as ambiguous (exit 2) before the worker's code ran.
    monkeypatch.setattr(sys, "argv", ["worker.py", "--sock", "/elsewhere", "--s", "5"])
    options = _worker._options_from_argv()
    assert (options.socket, options.stage) == (None, None)
    monkeypatch.setattr(sys, "argv", ["worker.py", "--socket", "/s.sock", "--stage", "embed"])
    options = _worker._options_from_argv()
    assert (options.socket, options.stage) == ("/s.sock", "embed")
