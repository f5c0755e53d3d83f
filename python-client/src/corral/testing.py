"""Test a worker without the Corral binary: :class:`FakeProxy` speaks the proxy's side of the
protocol over a socket pair and runs the worker's serve loop in a thread.

    from corral.testing import FakeProxy

    def test_echo():
        with FakeProxy(Echo()) as proxy:
            assert [r.value for r in proxy.infer([1, "two"])] == [1, "two"]
"""

from __future__ import annotations

import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack

from corral import _protocol as protocol
from corral._worker import Worker

__all__ = ["FakeProxy", "Result"]


@dataclass(frozen=True)
class Result:
    """One item's answer: ``status`` is ``"ok"`` (``value`` holds the output), ``"invalid"``
    (the proxy would answer 422) or ``"error"`` (500); ``message`` explains the latter two."""

    status: str
    value: Any = None
    message: str | None = None


class FakeProxy:
    """The proxy's end of one worker connection."""

    def __init__(self, worker: Worker) -> None:
        self._sock, worker_sock = socket.socketpair()
        self._stream = self._sock.makefile("rb")
        self._worker_sock = worker_sock
        self._thread = threading.Thread(target=self._serve, args=(worker,), daemon=True)
        self.hello: dict[str, Any] | None = None
        self.worker_error: BaseException | None = None

    def _serve(self, worker: Worker) -> None:
        try:
            worker.serve(self._worker_sock)
        except BaseException as e:  # surfaced to the test through worker_error
            self.worker_error = e
        finally:
            self._worker_sock.close()

    def __enter__(self) -> FakeProxy:
        self._thread.start()
        self.hello = self.receive()
        if self.hello is None or self.hello.get("type") != "hello":
            raise AssertionError(f"the worker's first frame is not a hello: {self.hello!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        self._stream.close()
        self._sock.close()

    def infer(self, items: list[Any], timeout_ms: int = 5000) -> list[Result]:
        """Send the items as one batch; return their results in the same order."""
        ids = [uuid.uuid4().bytes for _ in items]
        jobs = [
            {"id": job_id, "timeout_ms": timeout_ms, "payload": msgpack.packb(item)}
            for job_id, item in zip(ids, items)
        ]
        self.send({"type": "batch", "jobs": jobs})
        answer = self.receive()
        if answer is None or answer.get("type") != "results":
            raise AssertionError(f"expected results, got {answer!r}")
        by_id = {r["id"]: r for r in answer["results"]}
        if sorted(by_id) != sorted(ids) or len(answer["results"]) != len(ids):
            raise AssertionError("the worker did not answer each job exactly once")
        return [_result(by_id[job_id]) for job_id in ids]

    def send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(protocol.encode_frame(message))

    def send_raw(self, data: bytes) -> None:
        self._sock.sendall(data)

    def half_close(self) -> None:
        """Close the proxy's sending side, as a proxy that closes the connection after its last
        frame does; the worker's answers can still be received."""
        self._sock.shutdown(socket.SHUT_WR)

    def receive(self) -> dict[str, Any] | None:
        """The worker's next message, or None once it closed the connection."""
        return protocol.read_frame(self._stream)


def _result(raw: dict[str, Any]) -> Result:
    if raw["status"] == "ok":
        return Result("ok", value=msgpack.unpackb(raw["data"], raw=False, strict_map_key=False))
    return Result(raw["status"], message=raw.get("message"))
