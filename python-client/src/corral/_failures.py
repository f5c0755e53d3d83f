"""Failures of the worker's own code (``forward``, ``preprocess``, ``postprocess``), logged with
the jobs they failed: in full, traceback and all, the first time each distinct failure is seen,
then at most once a minute with how many like it went unlogged meanwhile.

A model failing every batch once wrote a traceback per batch, and per item where a hook failed:
about 1.5 KB a failed request, some 130 GB a day at a thousand a second, and no line named a job,
so a client's 500 (its ``x-request-id`` is its job's id) could not be matched to its traceback.
Two failures are alike when they are the same hook's, of the same exception type, raised at the
same line.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence

from corral._errors import describe

log = logging.getLogger("corral")

# Least time between two logs of one kind of failure.
EVERY = 60.0

# Kinds of failure remembered at most: past it the memory starts afresh (each kind is then
# logged once more), so a worker raising ever new exception types cannot grow it without bound.
_KINDS = 1024

# Per kind: when it was last logged, and how many like it went unlogged since. Shared by every
# worker of the process (a test's FakeProxy workers too: it forgets at each start), under a lock
# (a worker run in threads).
_seen: dict[tuple[str, str, str, int], list[float]] = {}
_lock = threading.Lock()


def failed(what: str, error: BaseException, job_ids: Sequence[bytes]) -> None:
    """Logs that ``what`` failed with ``error`` for the jobs ``job_ids``, unless a failure like
    it was logged less than :data:`EVERY` seconds ago (then it is only counted)."""
    kind = (what, *_raised_at(error))
    now = time.monotonic()
    with _lock:
        seen = _seen.get(kind)
        if seen is not None and now - seen[0] < EVERY:
            seen[1] += 1
            return
        if seen is None and len(_seen) >= _KINDS:
            _seen.clear()
        _seen[kind] = [now, 0]
    more = ""
    if seen is not None and seen[1]:
        more = f" ({int(seen[1])} more like it since it was last logged, {now - seen[0]:.0f} s ago)"
    _log_with_traceback(logging.ERROR, f"{what} failed for {jobs(job_ids)}{more}", error)


def stopping(what: str, error: BaseException) -> None:
    """Logs that ``what`` raised ``error`` (``SystemExit``, ``KeyboardInterrupt``), which stops
    the worker: said whichever hook raised it, or the log showed only a worker gone."""
    if isinstance(error, KeyboardInterrupt):
        log.info("%s raised KeyboardInterrupt: this worker stops", what)  # Ctrl-C, as a rule
        return
    described = f"{what} raised {describe(error)}: this worker stops"
    _log_with_traceback(logging.ERROR, described, error)


def _log_with_traceback(level: int, message: str, error: BaseException) -> None:
    """``message`` with ``error``'s traceback, or without it when writing it raises: logging
    lets only an ``Exception`` from a handler pass, and a traceback quotes ``str(error)``."""
    try:
        log.log(level, "%s", message, exc_info=error)
    except BaseException:
        log.log(level, "%s (%s; its traceback could not be written)", message, type(error).__name__)


def _raised_at(error: BaseException) -> tuple[str, str, int]:
    """The exception's type and the file and line it was raised at."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    if traceback is None:
        return type(error).__qualname__, "", 0
    return type(error).__qualname__, traceback.tb_frame.f_code.co_filename, traceback.tb_lineno


def jobs(job_ids: Sequence[bytes], shown: int = 4) -> str:
    """``job_ids`` as UUIDs (a one-item request's is the ``x-request-id`` it was answered with):
    the first few, and how many more."""
    names = ", ".join(_name(job_id) for job_id in job_ids[:shown])
    rest = len(job_ids) - shown
    noun = "job" if len(job_ids) == 1 else "jobs"
    return f"{noun} {names}" + (f" and {rest} more" if rest > 0 else "")


def _name(job_id: bytes) -> str:
    """A job id as a UUID; in hex if it is not the 16 bytes the protocol promises (this runs
    while a failure is being answered: it must not fail itself)."""
    raw = bytes(job_id)
    return str(uuid.UUID(bytes=raw)) if len(raw) == 16 else raw.hex()


def forget() -> None:
    """Forgets every failure seen: each kind is logged in full again (a test's new worker)."""
    with _lock:
        _seen.clear()
