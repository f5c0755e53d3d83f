"""Test a worker without the Corral binary: :class:`FakeProxy` speaks the proxy's side of the
protocol over a socket pair and runs the worker's serve loop in a thread, after its warm-up
(``examples``) as ``Worker.run`` does (``FakeProxy(worker, warm_up=False)`` skips it).

    from corral.testing import FakeProxy

    def test_echo():
        with FakeProxy(Echo()) as proxy:
            assert [r.value for r in proxy.infer([1, "two"])] == [1, "two"]

    def test_generate():
        with FakeProxy(Generate()) as proxy:
            a, b, d = proxy.stream(["ab", "c"], cancel_after={1: 2}, join=["d"])
            assert a.status == "end" and a.chunks == [...]

``infer`` gives what a client that does not stream gets (a streaming worker's chunks as one
list); ``stream`` gives each item's chunks as they came and how its stream ended. Both send raw
bytes, as the proxy does for a request of another media type, with ``content_type``::

    def test_thumbnail():
        with FakeProxy(Thumbnail()) as proxy:
            (result,) = proxy.infer([png_bytes], content_type="image/png")
            assert result.content_type == "image/png" and result.value.startswith(b"\x89PNG")

A worker that declares tensors gets each row as the proxy sends it: put :func:`tensor` values in
the payload map. Tensor values in results come back decoded, as numpy arrays (or nested lists
without numpy), as ``forward`` would get them::

    def test_add_one():
        with FakeProxy(AddOne()) as proxy:
            (result,) = proxy.infer([{"INPUT0": tensor([1.0, 2.0, 3.0], "FP32")}])
        assert result.value["OUTPUT0"].tolist() == [2.0, 3.0, 4.0]
"""

from __future__ import annotations

import numbers
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import msgpack

from corral import _failures, _tensors
from corral import _protocol as protocol
from corral._errors import named as _named
from corral._output import NOT_READABLE
from corral._output import unpack as _unpack
from corral._worker import Worker

__all__ = ["FakeProxy", "Result", "Stream", "tensor"]


def tensor(value: Any, datatype: str) -> msgpack.ExtType:
    """One row as the proxy sends it for an Open Inference Protocol v2 request: a tensor value
    (msgpack ext type 1) of ``datatype`` (``"FP32"``, ``"BYTES"``, …) holding ``value``, a numpy
    array, nested lists or a scalar, converted to the datatype. Put it in a payload map, e.g.
    ``proxy.infer([{"INPUT0": tensor(row, "FP32")}])``."""
    if datatype not in _tensors.DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r} (one of {', '.join(_tensors.DATATYPES)})")
    return msgpack.ExtType(_tensors.EXT_TENSOR, _tensors.encode(value, datatype))


ContentTypes = Union[str, Sequence[Optional[str]], None]
"""One media type for every item, one per item (None: that item is msgpack), or None."""


@dataclass(frozen=True)
class Result:
    """One item's answer: ``status`` is ``"ok"`` (``value`` holds the output), ``"invalid"``
    (the proxy would answer 422), ``"error"`` (500) or ``"expired"`` (408: the item's deadline
    had passed); ``message`` explains the ``invalid`` and ``error`` ones.
    ``content_type`` is the media type the worker named for an output that is bytes
    (``output_content_type``), else None."""

    status: str
    value: Any = None
    message: str | None = None
    content_type: str | None = None


@dataclass(frozen=True)
class Stream:
    """One item's stream: its ``chunks`` (postprocessed values, decoded) in the order they came,
    and ``status``, how it ended: ``"end"`` (closed normally: the client's ``done``; also a one-
    piece answer, which is then the one chunk), ``"invalid"``, ``"error"`` or ``"expired"``
    (``message`` says why; chunks before it were sent). An item :meth:`FakeProxy.stream`
    cancelled (``cancel_after``) has the status its worker ended it with, usually ``"end"``,
    its acknowledgement of the cancel: its client had left, and got no ``done``; ``events``
    says it was cancelled."""

    chunks: list[Any]
    status: str
    message: str | None = None


class FakeProxy:
    """The proxy's end of one worker connection. ``hello`` is the worker's hello; ``pulls``
    every ``max`` the worker has offered; ``events`` what the last :meth:`stream` saw, in order:
    ``("batch", [indices])``, ``("chunk", index, value)``, ``("cancel", index)``,
    ``("pull", max)``, ``("end", index, status)``."""

    def __init__(self, worker: Worker, *, warm_up: bool = True) -> None:
        """``warm_up``: run the worker's :attr:`~corral.Worker.examples` on entering, as
        ``Worker.run`` does before it connects (a worker whose warm-up fails never serves under
        Corral: it exits and restarts)."""
        if isinstance(worker, type):
            # Its serve() would fail later, missing its `sock`, naming neither the class nor this.
            raise TypeError(
                f"FakeProxy takes a worker instance: FakeProxy({worker.__name__}()), not the class"
            )
        self._worker = worker
        self._warm_up = warm_up
        self._connected = False
        self.hello: dict[str, Any] | None = None
        self.worker_error: BaseException | None = None
        self.pulls: list[int] = []
        self.events: list[tuple[Any, ...]] = []

    def _serve(self, worker: Worker) -> None:
        try:
            worker.serve(self._worker_sock)
        except BaseException as e:  # surfaced to the test through worker_error
            self.worker_error = e
        finally:
            self._worker_sock.close()

    def __enter__(self) -> FakeProxy:
        if self._warm_up:
            # Served without it, a worker whose examples fail passed its tests here and then
            # restarted forever under Corral.
            try:
                self._worker.warm_up()
            except Exception as error:
                raise AssertionError(
                    f"the worker's warm-up failed: {_named(error)} (under Corral "
                    "it would exit and never serve)"
                ) from error
        # The connection exists from here to close(): nothing is left open by a FakeProxy that
        # was made and never entered.
        self._sock, self._worker_sock = socket.socketpair()
        self._connected = True
        # Each test's worker logs its first failure of each kind in full, whatever an earlier
        # test's worker in this process logged.
        _failures.forget()
        self._stream = self._sock.makefile("rb")
        self._thread = threading.Thread(target=self._serve, args=(self._worker,), daemon=True)
        self._thread.start()
        self.hello = self.receive()
        if self.hello is None or self.hello.get("type") != "hello":
            self.close()  # no __exit__ follows a failed __enter__
            error = self.worker_error  # set before the worker's end of the socket closed
            if self.hello is None and error is not None:
                raise AssertionError(
                    f"the worker failed before its hello: {_named(error)}"
                ) from error
            raise AssertionError(f"the worker's first frame is not a hello: {self.hello!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._connected:
            return
        self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        self._stream.close()
        self._sock.close()
        self._connected = False

    @property
    def streaming(self) -> bool:
        """Whether the worker declared ``stream`` in its hello."""
        return "stream" in (self.hello or {}).get("features", ())

    def infer(
        self,
        items: list[Any],
        timeout_ms: int = 5000,
        content_type: ContentTypes = None,
    ) -> list[Result]:
        """Send the items as one batch; return their results in the same order. A streaming
        worker's item is ``ok`` with the list of its chunks as the value, as a client that does
        not stream gets it (a failure after chunks is that failure); unlike the proxy, which
        answers such a client 408 once its whole stream outlasts ``timeout_ms``, this waits for
        the end: FakeProxy keeps no time.

        ``content_type`` sends items as raw bytes, as the proxy does for a request of that media
        type (the item must be ``bytes``): one type for every item, or a list with one per item
        (``None`` for an item sent as msgpack)."""
        if not items:
            raise ValueError("no items: the proxy sends a batch of one job or more")
        if self.streaming:
            streams = self.stream(items, timeout_ms=timeout_ms, content_type=content_type)
            return [
                Result("ok", value=s.chunks)
                if s.status == "end"
                else Result(s.status, None, s.message)
                for s in streams
            ]
        jobs = _jobs(items, timeout_ms, content_type)
        ids = [job["id"] for job in jobs]
        self.send(protocol.batch(jobs))
        answer = self.receive()
        if answer is None or answer.get("type") != "results":
            raise self._unexpected("results", answer) from self.worker_error
        by_id = {r["id"]: r for r in answer["results"]}
        if sorted(by_id) != sorted(ids) or len(answer["results"]) != len(ids):
            raise AssertionError("the worker did not answer each job exactly once")
        return [_result(by_id[job_id]) for job_id in ids]

    def stream(
        self,
        items: list[Any],
        *,
        timeout_ms: int = 5000,
        content_type: ContentTypes = None,
        cancel_after: dict[int, int] | None = None,
        join: Sequence[Any] = (),
        on_chunk: Callable[[int, Any], None] | None = None,
    ) -> list[Stream]:
        """Send ``items`` as one batch and follow every job until it has its result; return one
        :class:`Stream` per item, then one per ``join`` item.

        ``cancel_after={i: n}`` sends a ``cancel`` for item ``i`` once its ``n``-th chunk has
        come (``0``: right after the batch); chunks of it that come later are left out of its
        :class:`Stream`, as the proxy drops them (``events`` still lists them). ``join`` items
        wait, as queued jobs do in the proxy: each ``pull`` the worker sends is answered with a
        batch of up to ``max`` of them, and those left when the worker holds no job go to it as
        a batch, as to an idle worker. Which of the two a ``join`` item meets is timing, as
        with the proxy: a generator whose steps take no time mostly ends before the batch
        answering its ``pull`` is taken in (``events`` says which: a batch of its own runs only
        once the first items have all ended, so a chunk of the item before the last of their
        ends means it joined; the batch is listed either way. To test the join path, have the
        generator step with ``None`` until an item has joined).
        ``on_chunk(index, value)`` runs as each chunk is read (before the next frame is). As
        the proxy, it sends no batch larger than the worker's ``max_running`` (its hello's
        ``max_batch``): the items past it wait, as ``join`` items do.
        ``content_type`` sends ``items`` as raw bytes, as :meth:`infer` does."""
        if not items and not join:
            raise ValueError("no items: the proxy sends a batch of one job or more")
        first, waiting = _jobs(items, timeout_ms, content_type), _jobs(list(join), timeout_ms)
        jobs = first + waiting
        cancels = _cancels(cancel_after or {}, len(jobs))
        index = {job["id"]: i for i, job in enumerate(jobs)}
        chunks: list[list[Any]] = [[] for _ in jobs]
        ends: list[dict[str, Any] | None] = [None] * len(jobs)
        cancelled: set[int] = set()
        # Items whose chunk could not be read, and why: the proxy fails that job alone (500
        # bad_output) and cancels it in the worker.
        broken: dict[int, str] = {}
        held: set[bytes] = set()
        self.events = []

        def send_batch(batch: list[dict[str, Any]]) -> None:
            self.send(protocol.batch(batch))
            held.update(job["id"] for job in batch)
            self.events.append(("batch", [index[job["id"]] for job in batch]))
            for job in batch:
                if cancels.get(index[job["id"]]) == 0:
                    cancel(index[job["id"]])

        def cancel(i: int) -> None:
            self.send(protocol.cancel([jobs[i]["id"]]))
            cancelled.add(i)
            self.events.append(("cancel", i))

        # As the proxy does: no batch larger than the worker's hello `max_batch` (a joining
        # worker's `max_running`); the items past it wait, as queued jobs do.
        bound = (self.hello or {}).get("max_batch") or len(jobs) or 1
        waiting = first[bound:] + waiting
        if first:  # with only `join` items, they go as a batch to an idle worker, below
            send_batch(first[:bound])
        while held or waiting:
            if not held:
                send_batch(waiting[:bound])
                waiting = waiting[bound:]
                continue
            message = self.receive()
            kind = None if message is None else message.get("type")
            if kind == "chunks":
                for entry in message["chunks"]:
                    i = self._held(index, held, entry["id"], "a chunk")
                    try:
                        value = _unpack(entry["data"])
                    except Exception as error:  # as `_result`: that job's 500
                        if i not in cancelled:
                            broken[i] = f"{NOT_READABLE}: {error}"
                            cancel(i)
                        continue
                    if i not in cancelled:  # one the worker made before it saw the cancel
                        chunks[i].append(value)
                    self.events.append(("chunk", i, value))
                    if on_chunk is not None:
                        on_chunk(i, value)
                    if i not in cancelled and cancels.get(i) == len(chunks[i]):
                        cancel(i)
            elif kind == "pull":
                self.pulls.append(message["max"])
                self.events.append(("pull", message["max"]))
                if message["max"] > 0 and waiting:
                    room = min(message["max"], bound)
                    send_batch(waiting[:room])
                    waiting = waiting[room:]
            elif kind == "results":
                for result in message["results"]:
                    i = self._held(index, held, result["id"], "a result")
                    held.discard(result["id"])
                    ends[i] = result
                    self.events.append(("end", i, result["status"]))
            else:
                raise self._unexpected("chunks, pull or results", message) from self.worker_error
        streams = [_stream(c, e) for c, e in zip(chunks, ends) if e is not None]  # all ended
        for i, why in broken.items():
            streams[i] = Stream(chunks[i], "error", why)
        return streams

    def _unexpected(self, expected: str, got: Any) -> AssertionError:
        """The error for a frame the test did not expect; for none at all, why the worker
        stopped (a ``sys.exit`` in ``forward``, say), which the test had not been told."""
        error = self.worker_error if got is None else None
        if error is not None:
            return AssertionError(f"expected {expected}, but the worker stopped: {_named(error)}")
        return AssertionError(f"expected {expected}, got {got!r}")

    @staticmethod
    def _held(index: dict[bytes, int], held: set[bytes], job_id: Any, what: str) -> int:
        if job_id not in held:
            known = "an unknown job" if job_id not in index else "a job that has ended"
            raise AssertionError(f"the worker sent {what} for {known}")
        return index[job_id]

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(protocol.encode_frame(message))

    def send_raw(self, data: bytes) -> None:
        self._entered()
        self._sock.sendall(data)

    def _entered(self) -> None:
        """The worker runs only inside ``with``: without it an answer would be waited for
        forever, and there is no connection to use."""
        if not self._connected:
            raise RuntimeError(
                "FakeProxy talks to its worker inside a with block: "
                "`with FakeProxy(worker) as proxy: proxy.infer([...])`"
            )

    def half_close(self) -> None:
        """Close the proxy's sending side, as a proxy that closes the connection after its last
        frame does; the worker's answers can still be received."""
        self._entered()
        self._sock.shutdown(socket.SHUT_WR)

    def receive(self) -> dict[str, Any] | None:
        """The worker's next message, or None once it closed the connection."""
        self._entered()
        return protocol.read_frame(self._stream)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _cancels(cancel_after: dict[int, int], count: int) -> dict[int, int]:
    """``cancel_after`` checked: an item that is not one of the ``count`` sent, or a chunk
    count that is no whole number of 0 or more, is ``ValueError``. Silently never sent, a test
    of a cancel would pass without one."""
    for i, n in cancel_after.items():
        if not _whole(i) or not 0 <= i < count:
            raise ValueError(f"cancel_after names item {i!r}; there are {count} (0 to {count - 1})")
        if not _whole(n) or n < 0:
            raise ValueError(
                f"cancel_after[{i}] must be a whole number of chunks, 0 or more: {n!r}"
            )
    return {int(i): int(n) for i, n in cancel_after.items()}


def _jobs(
    items: list[Any], timeout_ms: int, content_type: ContentTypes = None
) -> list[dict[str, Any]]:
    # The proxy sends the time left, never below 0: a negative one had stopped the worker with
    # a ProtocolError, as a proxy that sent it would.
    if not _whole(timeout_ms) or not 0 <= timeout_ms < 2**64:
        raise ValueError(
            f"timeout_ms must be a whole number of milliseconds, 0 or more: {timeout_ms!r}"
        )
    timeout_ms = int(timeout_ms)  # a numpy integer, say, as msgpack writes it
    if content_type is None or isinstance(content_type, str):
        types: list[str | None] = [content_type] * len(items)
    else:
        types = list(content_type)
        if len(types) != len(items):
            raise ValueError(f"{len(types)} content types for {len(items)} items")
    for named in {named for named in types if named is not None}:
        _raw_type(named)
    return [
        protocol.job(uuid.uuid4().bytes, timeout_ms, _payload(item, named), named)
        for item, named in zip(items, types)
    ]


# What the proxy reads as values, not raw bytes: JSON (and `+json` types), msgpack.
_VALUE_TYPES = (
    "application/json",
    "application/msgpack",
    "application/x-msgpack",
    "application/vnd.msgpack",
)


def _raw_type(named: str) -> None:
    """Refuses a ``content_type`` under which the proxy would send no raw bytes: a body of JSON
    or msgpack becomes its value, a form or a string that is no media type is its client's 415.
    Sent as bytes, a test passed that real clients would fail."""
    essence = named.split(";")[0].strip().lower()
    # `+json` with a subtype before it (RFC 6839), as the proxy reads it: `application/+json`
    # is raw bytes.
    subtype = essence.removeprefix("application/")
    structured_json = (
        subtype != essence and len(subtype) > len("+json") and subtype.endswith("+json")
    )
    if essence in _VALUE_TYPES or structured_json:
        raise ValueError(
            f"content_type {named!r}: the proxy reads such a body as a value, not raw bytes; "
            "pass the value itself, without content_type"
        )
    if essence == "application/x-www-form-urlencoded" or not protocol.is_media_type(named):
        raise ValueError(f"content_type {named!r}: the proxy answers such a request 415")


def _payload(item: Any, content_type: str | None) -> bytes:
    if content_type is None:
        return msgpack.packb(item)
    if not isinstance(item, (bytes, bytearray)):
        raise TypeError(f"an item sent as raw bytes must be bytes, not {type(item).__name__}")
    # As the proxy sends raw bytes: one msgpack bin32, whatever the length.
    return b"\xc6" + struct.pack(">I", len(item)) + bytes(item)


def _result(raw: dict[str, Any]) -> Result:
    if raw["status"] == "ok":
        # As the proxy checks every output: one that cannot be read fails its job alone, a
        # 500 (bad_output), rather than the test.
        try:
            value = _unpack(raw["data"])
        except Exception as error:  # msgpack's, or a tensor's that is malformed
            return Result("error", message=f"{NOT_READABLE}: {error}")
        return Result("ok", value=value, content_type=raw.get("content_type"))
    return Result(raw["status"], message=_message(raw))


# What the proxy tells the client of an `invalid` or `error` result without a message.
NO_REASON = "the worker gave no reason"


def _message(raw: dict[str, Any]) -> str | None:
    """A failed result's message as its client gets it."""
    message = raw.get("message")
    if raw["status"] in ("invalid", "error") and not message:
        return NO_REASON
    return message


def _stream(chunks: list[Any], raw: dict[str, Any]) -> Stream:
    if raw["status"] == "ok":
        try:
            return Stream([*chunks, _unpack(raw["data"])], "end")
        except Exception as error:  # as `_result`
            return Stream(chunks, "error", f"{NOT_READABLE}: {error}")
    return Stream(chunks, raw["status"], _message(raw))
