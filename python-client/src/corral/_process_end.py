"""The end of a spawned worker's process, made certain. Corral restarts a worker it spawned when
the process exits, and expects none to outlive it:

- :func:`watch_proxy`, from the start of ``Worker.run``: a daemon thread that ends the process
  once the proxy named by ``CORRAL_PROXY_PID`` is gone, whatever the worker is doing then
  (loading its model, warming up, in a batch). The parent-death signal Corral asks for reaches
  a wrapper that does not ``exec`` (``sh -c``, ``uv run``, ``conda run``) and not its child:
  such a worker ran its model load, warm-up or batch to the end after a SIGKILLed proxy,
  holding its GPU as long, or for good when the batch never ended.
- :func:`watch_threads`, when ``Worker.run`` is done: a daemon thread that waits while the main
  thread runs (the application's own code after ``run``), gives the other threads
  :data:`LINGER` seconds to end, and ends the process itself if they have not (with ``run``'s
  status). A thread that is not a daemon (a metrics pusher, a weights watcher, a library's pool)
  had kept a stopped worker's process alive, its stage a worker short for good, every request
  there a 408. The interpreter runs ``atexit`` handlers only once every such thread has ended,
  so those threads had kept them from running too; ended here, the process skips them.

:func:`exit_now` is that end. :class:`ProxyWatch` also serves the connect loop (``_serve``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger("corral")

# How long threads that are not daemons may hold a spawned worker's process once its main
# thread is done, before the process ends without them.
LINGER = 1.0

# How often a spawned worker looks for its proxy.
PROXY_EVERY = 0.2

# The parent as this process started: a parent that changes later has exited (see ProxyWatch).
# A process forked from this one (a launcher's `multiprocessing` children) started under its own
# parent: inherited, the proxy's pid had each child take its proxy for gone, and never serve.
_first_parent = os.getppid()


def _forked() -> None:
    global _first_parent
    _first_parent = os.getppid()


os.register_at_fork(after_in_child=_forked)


def spawned() -> bool:
    """Whether Corral spawned this worker (``corral -- CMD``), rather than someone by hand."""
    return "CORRAL_WORKER_INDEX" in os.environ


def watch_proxy() -> None:
    """For a spawned worker: ends the process once its proxy is gone."""
    proxy = ProxyWatch.from_environment()
    if proxy is None or not spawned():
        return
    thread = threading.Thread(target=_watch, args=(proxy,), name="corral-proxy-watch", daemon=True)
    thread.start()


def _watch(proxy: ProxyWatch) -> None:
    while not proxy.gone():
        time.sleep(PROXY_EVERY)
    log.warning("the proxy (pid %d) is gone; exiting now", proxy.pid)
    exit_now(1)


def watch_threads(status: int) -> None:
    """For a spawned worker: ends the process with ``status`` if threads that are not daemons
    hold it alive past the main thread's end."""
    if not spawned():
        return  # a worker started by hand: its process is its operator's
    threading.Thread(target=_end, args=(status,), name="corral-process-end", daemon=True).start()


def _end(status: int) -> None:
    threading.main_thread().join()  # returns once the interpreter is finishing
    deadline = time.monotonic() + LINGER
    for thread in _holding():
        thread.join(max(0.0, deadline - time.monotonic()))
    if not _holding():
        return
    names = ", ".join(sorted(thread.name for thread in _holding()))
    log.warning(
        "serving is over but threads that are not daemons keep this process alive (%s); "
        "ending it so that corral can restart the worker",
        names,
    )
    exit_now(status)


def _holding() -> list[threading.Thread]:
    current, main = threading.current_thread(), threading.main_thread()
    return [
        thread
        for thread in threading.enumerate()
        if thread.is_alive() and not thread.daemon and thread not in (current, main)
    ]


def exit_now(status: int) -> None:
    """Ends the process at once, from any thread, with what the logs and the standard streams
    hold written out first (``os._exit`` flushes nothing: stdout is a pipe to Corral, buffered)."""
    handlers = [*logging.getLogger().handlers, *log.handlers]
    for stream in (*handlers, sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed stream, a handler that fails: the exit comes first
            pass
    os._exit(status & 0xFF)


class ProxyWatch:
    """Whether the proxy process that spawned this worker still exists."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        # The proxy is usually our parent: once it exits we are handed to another process at
        # once, while its pid may go on existing as a zombie until its own parent reaps it.
        self._parent = pid if pid == _first_parent else None

    @classmethod
    def from_environment(cls) -> ProxyWatch | None:
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
        return _zombie(self.pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (a killed proxy whose parent has not
    yet waited for it still answers signal 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False  # no /proc (macOS): signal 0 alone decides
    # The state follows the command name's closing parenthesis (a name may hold one too).
    state = stat.rfind(b")") + 2
    return stat[state : state + 1] == b"Z"
