"""A worker's side of one proxy connection, and the connect loop around it.

:func:`serve` runs one connection: the hello, then the answers to each batch. A reader thread
reads and decodes the proxy's frames the whole time, so the worker never stops reading while it
computes or writes: the proxy may send a batch ahead while the worker writes a results frame,
and with both frames larger than a socket buffer two sides that each write before they read
would wait on each other forever. The reader queues batches, ``shutdown`` and ``reject`` in
order, and folds ``cancel`` frames into a locked set of job ids instead, which a streaming batch
(``_streaming``) reads between steps through :class:`Link`, along with batches that join it.

:func:`run_forever` connects, serves, and then reconnects (an external worker) or returns (a
worker spawned by the proxy); while it waits for the proxy to listen it gives up once the proxy
process named by ``CORRAL_PROXY_PID`` is gone, so that a spawned worker never outlives it (while
it serves, ``_process_end`` watches for that).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Union

from corral import _process_end
from corral import _protocol as protocol
from corral import _shared_memory as shared_memory
from corral._errors import ConnectionEnded, ProtocolError

log = logging.getLogger("corral")

# Frames read ahead of the serve loop (cancel frames are not queued: they only add ids to a
# set). A plain worker: the proxy sends one batch ahead at most, and nothing else until it has a
# batch's results, so that batch and a shutdown behind it is all a well-behaved proxy can make
# wait here. A joining worker: the proxy sends no batch ahead, and a batch while the worker holds
# jobs only to answer its offer (pull); the worker offers again only once that batch is taken
# in, so at most one joined batch waits, plus, when the worker goes idle as it arrives, the
# batch sent to the idle worker and a shutdown: three. A proxy sending more is held back by the
# socket rather than buffered: each waiting frame may be up to 64 MiB.
_READ_AHEAD = 3

# How long a worker whose write failed waits for the proxy's last word (a ``shutdown``).
FAREWELL = 1.0

# What the reader hands the serve loop: a message, None for a clean close, or the error that
# ended the reading (raised by the serve loop when it gets there, after the frames before it).
_Read = Union[dict[str, Any], None, BaseException]


# The connection to the proxy while one is open: a child the worker forks (a multiprocessing
# pool of the fork kind, made in `forward`) must not hold it. Inherited, it kept the connection
# open after the worker died: the proxy saw no end, and the dead worker's batch waited for
# --batch-timeout-ms (its clients got 408) instead of going to another worker at once.
_connection: socket.socket | None = None


def _let_go_in_child() -> None:
    """In a forked child: the connection's descriptor becomes /dev/null. Not closed: the socket
    object may close that number later, when another of the child's files could have it."""
    sock = _connection
    if sock is None:
        return
    try:
        fd = sock.fileno()
        if fd < 0:
            return
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    except OSError:
        pass  # nothing to let go of


os.register_at_fork(after_in_child=_let_go_in_child)


class _Reader:
    """Reads and decodes frames in a thread of its own, into a small queue, in order; the ids of
    ``cancel`` frames go into a set instead (kept only with ``track_cancels``)."""

    def __init__(
        self,
        sock: socket.socket,
        track_cancels: bool = False,
        memory: shared_memory.Memory | None = None,
        first: dict[str, Any] | None = None,
    ) -> None:
        self._sock = sock
        self._memory = memory
        self._first = first  # a frame read before the reader started, to be taken first
        self._stream = sock.makefile("rb")
        self._queue: queue.Queue[_Read] = queue.Queue(maxsize=_READ_AHEAD)
        self._ended = False  # the serve loop has taken the last item (None or an error)
        self._track_cancels = track_cancels
        self._cancel_lock = threading.Lock()
        self._cancelled: set[bytes] = set()
        # The job ids of batches read and not yet taken by the serve loop (with track_cancels):
        # a cancel for one of them is kept for the run that takes it (see keep_cancelled).
        self._queued: set[bytes] = set()
        self._thread = threading.Thread(target=self._read, name="corral-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                if self._first is not None:
                    message, self._first = self._first, None
                else:
                    message = protocol.read_frame(self._stream)
                if message is not None:
                    shared_memory.resolve(message, self._memory)
                if message is not None and message["type"] == "cancel":
                    self._note_cancel(message)
                    continue
                if message is not None and message["type"] == "batch":
                    self._note_batch(message)
                self._queue.put(message)
                if message is None:
                    return
        except BaseException as e:  # any end of reading is the serve loop's to report
            self._queue.put(e)
        finally:
            self._stream.close()

    def _note_cancel(self, message: dict[str, Any]) -> None:
        ids = message.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, bytes) for i in ids):
            raise ProtocolError("a cancel must carry a list of job ids")
        if self._track_cancels:  # a worker that did not declare "cancel" is sent none
            with self._cancel_lock:
                self._cancelled.update(ids)

    def _note_batch(self, message: dict[str, Any]) -> None:
        """Stamps each job of a batch with when it was read (its deadline counts from then, not
        from when the serve loop gets to it: a batch sent ahead waits a whole batch), and notes
        its ids as queued. A malformed batch is left for ``_jobs`` to refuse."""
        jobs = message.get("jobs")
        if not isinstance(jobs, list):
            return
        received = time.monotonic()
        for job in jobs:
            if isinstance(job, dict):
                job[protocol.RECEIVED] = received
        if self._track_cancels:  # a plain worker is sent no cancel: nothing to note
            ids = (job.get("id") for job in jobs if isinstance(job, dict))
            with self._cancel_lock:
                self._queued.update(i for i in ids if isinstance(i, bytes))

    def take_cancelled(self) -> set[bytes]:
        """The ids of every ``cancel`` read since the last call (without blocking)."""
        with self._cancel_lock:
            taken, self._cancelled = self._cancelled, set()
        return taken

    def keep_cancelled(self, ids: Iterable[bytes]) -> None:
        """Puts back the cancelled ids of jobs whose batch is still queued, for the run that
        takes it; others (jobs already ended) are dropped."""
        with self._cancel_lock:
            self._cancelled.update(i for i in ids if i in self._queued)

    def _take(self, item: _Read) -> dict[str, Any] | None:
        if item is None or isinstance(item, BaseException):
            self._ended = True
        if isinstance(item, BaseException):
            raise item
        if item is not None and item["type"] == "batch" and self._track_cancels:
            jobs = item.get("jobs")
            with self._cancel_lock:
                for job in jobs if isinstance(jobs, list) else ():
                    if isinstance(job, dict):
                        self._queued.discard(job.get("id"))
        return item

    def farewell(self) -> dict[str, Any] | None:
        """After a write failed: the ``shutdown`` or ``reject`` the proxy sent before it closed
        the connection, if it did. The proxy closed it, so the reader reaches its end; it gets
        ``FAREWELL`` seconds to."""
        while not self._ended:
            try:
                message = self._take(self._queue.get(timeout=FAREWELL))
            except queue.Empty:
                return None
            except BaseException:
                return None  # what ended the reading: no word from the proxy before it
            if message is not None and message["type"] in ("shutdown", "reject"):
                return message
        return None

    def next(self) -> dict[str, Any] | None:
        """The next message, None once the proxy closed the connection; raises what ended the
        reading (:class:`ProtocolError`, ``OSError``) when the messages before it are done."""
        return self._take(self._queue.get())

    def poll(self) -> dict[str, Any] | None:
        """As :meth:`next` without waiting; raises ``queue.Empty`` when nothing is queued."""
        return self._take(self._queue.get_nowait())

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


def _jobs(message: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The jobs of a ``batch``; any other message ends serving: ``ConnectionEnded`` for the end
    of the connection, ``SystemExit`` for ``reject`` and ``shutdown``, :class:`ProtocolError` for
    a message a worker is not sent."""
    if message is None:
        raise ConnectionEnded
    kind = message["type"]
    if kind == "batch":
        jobs = message.get("jobs")
        if not isinstance(jobs, list) or not all(isinstance(job, dict) for job in jobs):
            raise ProtocolError("a batch must carry a list of jobs, each a map")
        return jobs
    if kind == "reject":
        raise SystemExit(f"corral refused this worker: {message.get('message')}")
    if kind == "shutdown":
        log.info("corral is shutting down: %s", message.get("message"))
        raise SystemExit(0)
    raise ProtocolError(f"unexpected message type {kind!r}")


# From this size a frame's body is written after its length prefix instead of copied behind it:
# the copy took ~33 ms for a 48 MiB results frame (three quarters of packing it), the
# second write a few microseconds; below it one write of the joined bytes costs less.
_WRITE_APART = 64 * 1024


def send_body(sock: socket.socket, body: bytes) -> None:
    """Write the frame whose body is ``body``."""
    if len(body) < _WRITE_APART:
        sock.sendall(protocol.framed(body))
    else:
        sock.sendall(protocol.length_prefix(body))
        sock.sendall(body)


class Link:
    """The connection as a batch in progress uses it: what a streaming batch sends as it goes
    (``chunks``, ``results`` of some of its jobs, ``pull``), and what it takes in between steps
    (cancelled job ids, batches that join it): without blocking, but for a joining generator
    that holds no job and waits for the next batch (:meth:`wait_batches`)."""

    def __init__(self, sock: socket.socket, reader: _Reader) -> None:
        self._sock = sock
        self._reader = reader

    def send(self, frame: bytes) -> None:
        """Write one encoded frame (the proxy is read all along meanwhile)."""
        self._sock.sendall(frame)

    def send_results(self, results: list[dict[str, Any]]) -> None:
        """Write the ``results`` frame for ``results``."""
        send_body(self._sock, protocol.results_body(results))

    def take_cancelled(self) -> set[bytes]:
        """Ids from the ``cancel`` frames read since the last call."""
        return self._reader.take_cancelled()

    def keep_cancelled(self, ids: Iterable[bytes]) -> None:
        """Gives back taken ids that name jobs of a batch still queued (see ``_Reader``)."""
        self._reader.keep_cancelled(ids)

    def take_batches(self) -> list[list[dict[str, Any]]]:
        """The jobs of each batch already read, oldest first. A ``shutdown``, ``reject`` or the
        end of the connection behind them ends serving as it does between batches (after the
        batches before it are taken in: their jobs are then the caller's to abandon)."""
        batches = []
        while True:
            try:
                message = self._reader.poll()
            except queue.Empty:
                return batches
            batches.append(_jobs(message))

    def wait_batches(self) -> list[list[dict[str, Any]]]:
        """As :meth:`take_batches`, first waiting for the next frame that is not a ``cancel``:
        for a worker idle in the proxy's eyes, that is a batch, a ``shutdown`` or the end (raised
        as :meth:`take_batches` raises them), as the serve loop waits between batches."""
        return [_jobs(self._reader.next()), *self.take_batches()]


# What answers one batch: the results frame's list (a plain worker), or None when it sent its
# answers itself through the link (a streaming worker).
Answer = Callable[[list[dict[str, Any]], Link], Union[list[dict[str, Any]], None]]


def serve(sock: socket.socket, hello: dict[str, Any], answer: Answer) -> None:
    """Say ``hello`` on a connected socket, then answer each batch with ``answer`` until the
    proxy closes the connection: the results it returns go out as one frame; a streaming
    worker's ``answer`` sends its own frames and returns None. Raises :class:`ProtocolError` on
    a frame the protocol does not allow, ``OSError`` when the connection breaks, and
    ``SystemExit`` on ``reject`` or ``shutdown``. Reading ends with it (the socket's reading side
    is shut down); closing the socket is the caller's."""
    features = hello.get("features", ())
    sock.sendall(protocol.encode_frame(hello))
    memory, first = shared_memory.first_frame(sock) if "shm" in features else (None, None)
    reader = _Reader(sock, track_cancels="cancel" in features, memory=memory, first=first)
    link = Link(sock, reader)
    try:
        while True:
            results = answer(_jobs(reader.next()), link)
            if results is not None:
                send_body(sock, protocol.results_body(results))
    except ConnectionEnded:
        return
    except OSError:
        # A write failed: the proxy may have said why before closing (its grace period ran out
        # during this batch). A shutdown or reject ends serving as it would between batches,
        # not as a lost connection, which a worker started by hand would reconnect after.
        said = reader.farewell()
        if said is not None:
            _jobs(said)  # raises SystemExit
        raise
    finally:
        reader.stop()


def run_forever(path: str, serve_one: Callable[[socket.socket], None]) -> None:
    """Connect to the proxy at ``path`` and ``serve_one`` the connection; an external worker
    reconnects whenever the connection drops, a worker spawned by ``corral -- CMD``
    (``CORRAL_WORKER_INDEX`` set) returns instead, as it does while waiting for a proxy that is
    gone (``CORRAL_PROXY_PID``)."""
    global _connection
    check_path(path)
    spawned = _process_end.spawned()
    proxy = _process_end.ProxyWatch.from_environment()
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
            delay = _back_off(delay)  # nothing to await: the proxy is not there yet
            continue
        waiting_logged = False
        log.info("connected to corral at %s", path)
        connected = time.monotonic()
        _connection = sock
        try:
            serve_one(sock)
            log.info("proxy closed the connection")
        except ProtocolError as e:
            log.error("protocol error: %s", e)
        except OSError as e:
            log.warning("connection to the proxy lost: %s", e)
        finally:
            _connection = None
            sock.close()
        if spawned:
            # The proxy that spawned us restarts us if it still wants a worker; reconnecting
            # on our own could outlive it.
            return
        if time.monotonic() - connected < _SHORT_SESSION:
            # A session that ends as it starts (a proxy of another version refusing our hello,
            # one dropping every connection) is retried with the backoff of a proxy not there
            # yet, not at once: that was 250 connections and 500 log lines a second.
            delay = _back_off(delay)
        else:
            delay = 0.05


# The bytes of a Unix socket's path (sun_path, less its terminating NUL), as Corral counts them.
SOCKET_PATH_LIMIT = 107


def check_path(path: str) -> None:
    """Stops the worker (``SystemExit``) if ``path`` is too long for a Unix socket: every
    connect would fail the same way ("AF_UNIX path too long"), retried for ever."""
    too_long = len(os.fsencode(path)) - SOCKET_PATH_LIMIT
    if too_long > 0:
        raise SystemExit(
            f"the socket path {path!r} is {too_long} bytes over the {SOCKET_PATH_LIMIT} a Unix "
            "socket's path may have: use a shorter one (Corral refuses such a path too)"
        )


# A session shorter than this is retried after a backoff, as a failed connect is.
_SHORT_SESSION = 1.0


def _back_off(delay: float) -> float:
    """Waits ``delay`` seconds before the next connect; returns the wait after it (doubled,
    up to a second)."""
    time.sleep(delay)
    return min(delay * 2, 1.0)
