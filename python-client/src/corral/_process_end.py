"""The end of a spawned worker's process, made certain. Corral restarts a worker it spawned when
the process exits, not when its connection ends; a process the interpreter keeps alive after
serving is over (a thread that is not a daemon: a metrics pusher, a weights watcher, a library's
pool) left its stage a worker short for good, every request there a 408.

:func:`watch` starts a daemon thread when ``Worker.run`` is done. It waits while the main thread
runs (the application's own code after ``run``), then gives the other threads :data:`LINGER`
seconds to end, and ends the process itself if they have not (with ``run``'s status). The
interpreter runs ``atexit`` handlers only once every such thread has ended, so those threads
had kept them from running too; ended here, the process skips them. :func:`exit_now` is that
end, for the orphan watch (``_serve``) as well.
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


def watch(status: int) -> None:
    """For a worker Corral spawned (``CORRAL_WORKER_INDEX`` set): ends the process with
    ``status`` if threads that are not daemons hold it alive past the main thread's end."""
    if "CORRAL_WORKER_INDEX" not in os.environ:
        return  # a worker started by hand: its process is its operator's
    threading.Thread(target=_end, args=(status,), name="corral-process-end", daemon=True).start()


def _end(status: int) -> None:
    main = threading.main_thread()
    main.join()  # returns once the interpreter is finishing: only threads hold it now
    deadline = time.monotonic() + LINGER
    while time.monotonic() < deadline:
        if not _holding():
            return
        time.sleep(0.05)
    names = ", ".join(sorted(thread.name for thread in _holding()))
    log.warning(
        "serving is over but threads that are not daemons keep this process alive (%s); "
        "ending it so that corral can restart the worker",
        names,
    )
    exit_now(status)


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


def _holding() -> list[threading.Thread]:
    current = threading.current_thread()
    return [
        thread
        for thread in threading.enumerate()
        if thread.is_alive()
        and not thread.daemon
        and thread is not current
        and thread is not threading.main_thread()
    ]
