"""A worker's side of one proxy connection, and the connect loop around it.

:func:`serve` runs one connection: the hello, then one results frame per batch. A reader thread
reads and decodes the proxy's frames the whole time, so the worker never stops reading while it
computes or writes: the proxy may send a batch ahead while the worker writes a results frame,
and with both frames larger than a socket buffer two sides that each write before they read
would wait on each other forever.

:func:`run_forever` connects, serves, and then reconnects (an external worker) or returns (a
worker spawned by the proxy); while it waits for the proxy to listen it gives up once the proxy
process named by ``CORRAL_PROXY_PID`` is gone, so that a spawned worker never outlives it.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Union

from corral import _protocol as protocol
from corral._errors import ProtocolError

log = logging.getLogger("corral")

# Frames read ahead of the serve loop. The proxy sends one batch ahead at most, and nothing
# else until it has a batch's results, so two (that batch, and a shutdown behind it) is all a
# well-behaved proxy can make wait here. A proxy sending more is held back by the socket rather
# than buffered: each waiting frame may be up to 64 MiB.
_READ_AHEAD = 2

# The parent as this process started: a parent that changes later has exited (see _ProxyWatch).
_FIRST_PARENT = os.getppid()

# What the reader hands the serve loop: a message, None for a clean close, or the error that
# ended the reading (raised by the serve loop when it gets there, after the frames before it).
_Read = Union[dict[str, Any], None, BaseException]


class _Reader:
    """Reads and decodes frames in a thread of its own, into a small queue, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._stream = sock.makefile("rb")
        self._queue: queue.Queue[_Read] = queue.Queue(maxsize=_READ_AHEAD)
        self._ended = False  # the serve loop has taken the last item (None or an error)
        self._thread = threading.Thread(target=self._read, name="corral-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                message = protocol.read_frame(self._stream)
                self._queue.put(message)
                if message is None:
                    return
        except BaseException as e:  # any end of reading is the serve loop's to report
            self._queue.put(e)
        finally:
            self._stream.close()

    def next(self) -> dict[str, Any] | None:
        """The next message, None once the proxy closed the connection; raises what ended the
        reading (:class:`ProtocolError`, ``OSError``) when the messages before it are done."""
        item = self._queue.get()
        if item is None or isinstance(item, BaseException):
            self._ended = True
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """End the reader, whatever the proxy does: shutting our reading side down makes its
        blocked read return the end of the stream (closing the socket would not wake it, and
        the blocked read would keep the connection open), and taking what it still queues lets
        it finish."""
        try:
            self._sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass  # already disconnected: the reader has seen that too
        while not self._ended:
            try:
                self.next()
            except BaseException:
                pass  # what ended the reading, after the serve loop itself ended
        self._thread.join()


def serve(
    sock: socket.socket,
    hello: dict[str, Any],
    process: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    """Say ``hello`` on a connected socket, then answer each batch with the results ``process``
    returns for its jobs, until the proxy closes the connection. Raises :class:`ProtocolError` on
    a frame the protocol does not allow, ``OSError`` when the connection breaks, and
    ``SystemExit`` on ``reject`` or ``shutdown``. Reading ends with it (the socket's reading side
    is shut down); closing the socket is the caller's."""
    sock.sendall(protocol.encode_frame(hello))
    reader = _Reader(sock)
    try:
        while True:
            message = reader.next()
            if message is None:
                return
            kind = message["type"]
            if kind == "batch":
                jobs = message.get("jobs")
                if not isinstance(jobs, list):
                    raise ProtocolError("a batch must carry a list of jobs")
                sock.sendall(protocol.encode_results(process(jobs)))
            elif kind == "reject":
                raise SystemExit(f"corral refused this worker: {message.get('message')}")
            elif kind == "shutdown":
                log.info("corral is shutting down: %s", message.get("message"))
                raise SystemExit(0)
            else:
                raise ProtocolError(f"unexpected message type {kind!r}")
    finally:
        reader.stop()


def run_forever(path: str, serve_one: Callable[[socket.socket], None]) -> None:
    """Connect to the proxy at ``path`` and ``serve_one`` the connection; an external worker
    reconnects whenever the connection drops, a worker spawned by ``corral -- CMD``
    (``CORRAL_WORKER_INDEX`` set) returns instead, as it does while waiting for a proxy that is
    gone (``CORRAL_PROXY_PID``)."""
    spawned = "CORRAL_WORKER_INDEX" in os.environ
    proxy = _ProxyWatch.from_environment()
    delay = 0.05
    waiting_logged = False
    while True:
        if proxy is not None and proxy.gone():
            log.info("the proxy (pid %d) is gone; exiting", proxy.pid)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as e:
            sock.close()
            if not waiting_logged:
                log.info("waiting for the proxy at %s (%s)", path, e)
                waiting_logged = True
            time.sleep(delay)  # nothing to await: the proxy is not there yet
            delay = min(delay * 2, 1.0)
            continue
        delay, waiting_logged = 0.05, False
        log.info("connected to corral at %s", path)
        try:
            serve_one(sock)
            log.info("proxy closed the connection")
        except ProtocolError as e:
            log.error("protocol error: %s", e)
        except OSError as e:
            log.warning("connection to the proxy lost: %s", e)
        finally:
            sock.close()
        if spawned:
            # The proxy that spawned us restarts us if it still wants a worker; reconnecting
            # on our own could outlive it.
            return


class _ProxyWatch:
    """Whether the proxy process that spawned this worker still exists."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        # The proxy is usually our parent: once it exits we are handed to another process at
        # once, while its pid may go on existing as a zombie until its own parent reaps it.
        self._parent = pid if pid == _FIRST_PARENT else None

    @classmethod
    def from_environment(cls) -> _ProxyWatch | None:
        value = os.environ.get("CORRAL_PROXY_PID")
        if not value:
            return None
        try:
            pid = int(value)
        except ValueError:
            pid = 0
        if pid <= 0:  # os.kill(0 or less) would signal process groups, not check a process
            log.warning("ignoring CORRAL_PROXY_PID=%r: not a process id", value)
            return None
        return cls(pid)

    def gone(self) -> bool:
        if self._parent is not None and os.getppid() != self._parent:
            return True
        try:
            os.kill(self.pid, 0)  # signal 0: only checks that the process exists
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # it exists, under another user
        return False
