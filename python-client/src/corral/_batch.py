"""The per-job steps around ``forward`` that the plain and the streaming serve paths share, here
so that each of their rules is written once: :func:`prepare` decodes and preprocesses a batch's
jobs one at a time before ``forward``, and the function that :func:`answerer` makes postprocesses
and encodes each output after it (or each chunk of a stream) into its job's answer. ``_plain``
(a plain ``forward``) and ``_streaming`` (a generator) both go through them, so both call the
same hooks (one the worker does not override is skipped), set ``deadline`` and ``content_type``
alike while a hook runs (the item's own; between items ``math.inf`` and ``None``: :func:`clear`),
and answer a failing item on its own (``invalid`` or ``error``) while its batch-mates go on.
:func:`warm_up_batch` sets the same for a warm-up ``forward`` on the worker's examples.

What this module uses of a worker is :class:`Hooks`, a Protocol that ``_worker.Worker``
satisfies, and ``Worker`` marks its pass-through hooks with :func:`passes_through`: this module
imports none of ``_worker``, ``_plain`` and ``_streaming``, which import it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from corral import _failures, _tracing, _typing
from corral import _protocol as protocol
from corral._errors import STOPS as _STOPS
from corral._errors import ProtocolError, ValidationError
from corral._errors import cut as _cut
from corral._errors import describe as _describe
from corral._errors import text as _text
from corral._protocol import RECEIVED, job_content_type, job_timeout_ms


class Hooks(Protocol):
    """What the batch step uses of a worker (see ``_worker.Worker`` for each)."""

    deadline: float
    deadlines: list[float]
    content_type: str | None
    content_types: list[str | None]

    def preprocess(self, item: Any) -> Any: ...

    def postprocess(self, output: Any) -> Any: ...


_Hook = TypeVar("_Hook", bound=Callable[..., Any])

# The base class's pass-through hooks, by name, as defined (see passes_through).
_PASSING: dict[str, Callable[..., Any]] = {}


def passes_through(hook: _Hook) -> _Hook:
    """Marks a base class's hook that returns its argument unchanged. Unless the worker has its
    own, the batch step skips that hook and does not set ``deadline`` and ``content_type`` for
    it (an item whose job is traced still runs it, in a span). The function is
    kept as it was defined, not looked up on the class, so a patch of the base class's hook (a
    spy, instrumentation) counts as the worker's own and is called."""
    _PASSING[hook.__name__] = hook
    return hook


def own(method: Any, name: str) -> bool:
    """Whether a bound hook is the worker's own rather than the base class's pass-through: a
    subclass's method, a function set on the instance, or the base class's replaced (patched,
    wrapped) since."""
    return getattr(method, "__func__", None) is not _PASSING[name]


def prepare(
    worker: Hooks, jobs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any] | None], list[Any], list[float]]:
    """Each job decoded and preprocessed on its own. Returns three lists aligned with ``jobs``:
    the answer of each job that fails (``expired``, ``invalid``, ``error``), None for each that
    goes on to ``forward``; the inputs of the latter, in order; and every job's deadline.
    Raises :class:`ProtocolError` for a job the protocol does not allow."""
    now = time.monotonic()
    answers: list[dict[str, Any] | None] = [None] * len(jobs)
    # From when the batch was read (a batch sent ahead waits out the one before it), or now.
    deadlines = [job.get(RECEIVED, now) + job_timeout_ms(job) / 1000 for job in jobs]
    inputs: list[Any] = []
    # Without a preprocess of its own, nothing reads `deadline` or `content_type` while the
    # batch is prepared, and there is no hook to call. The clock is still read per job: a
    # large payload, or a typed one's `__post_init__`, can take long enough to decode that
    # a later job expires meanwhile.
    hooked = own(worker.preprocess, "preprocess")
    decode = _typing.codec(type(worker)).reader(hooked)  # once a batch, not once an item
    for position, job in enumerate(jobs):
        job_id = job.get("id")
        if not isinstance(job_id, bytes):
            raise ProtocolError("a job id must be bytes")
        content_type = job_content_type(job)
        if hooked:
            worker.deadline = deadlines[position]
            worker.content_type = content_type
        if deadlines[position] <= time.monotonic():
            # Its client has had a 408 already; the proxy would drop the result.
            answers[position] = protocol.expired(job_id, "the deadline passed before processing")
            continue
        try:
            if "traceparent" in job:  # not a helper: measured 10% of a small batch's cost
                with _tracing.item(job, "preprocess"):
                    item = worker.preprocess(decode(job.get("payload")))
            elif hooked:
                item = worker.preprocess(decode(job.get("payload")))
            else:
                item = decode(job.get("payload"))
        except ValidationError as e:
            answers[position] = protocol.invalid(job_id, _cut(_text(e)))
        except _STOPS as e:
            _failures.stopping("preprocess", e)
            raise
        except BaseException as e:
            _failures.failed("preprocess", e, [job_id])
            answers[position] = protocol.error(job_id, _describe(e))
        else:
            inputs.append(item)
    clear(worker)
    return answers, inputs, deadlines


# The job of an output that has none to trace (a chunk): never changed.
_UNTRACED: dict[str, Any] = {}


def answerer(worker: Hooks, *, chunks: bool = False) -> Callable[..., dict[str, Any]]:
    """The answer function for one batch's outputs (or, with ``chunks``, one streaming step's
    chunks), made once so that they share one encoder and one hook check.

    ``answer(job_id, deadline, content_type, output, job)`` runs the worker's ``postprocess``
    on ``output`` and encodes the value. Returns an ``ok`` result, or a ``chunks`` entry (no
    media type) with ``chunks``. A failure there (logged) returns the job's ``error`` result
    instead: an entry with a ``status``, which a chunk entry lacks. ``postprocess`` is called
    when the worker has its own, or when ``job`` (the output's job, omitted for a chunk:
    chunks are not traced) carries a ``traceparent``, in a span then. ``deadline`` and
    ``content_type`` are set on the worker for it and left set: :func:`clear` them after the
    last output."""
    codec = _typing.codec(type(worker))
    encode = codec.batch_encoder()
    media_type = codec.content_type
    check_result = codec.check_result
    hooked = own(worker.postprocess, "postprocess")  # as in prepare

    def answer(
        job_id: bytes,
        deadline: float,
        content_type: str | None,
        output: Any,
        job: dict[str, Any] = _UNTRACED,
    ) -> dict[str, Any]:
        traced = "traceparent" in job
        if hooked or traced:
            worker.deadline = deadline
            worker.content_type = content_type
        try:
            if traced:
                with _tracing.item(job, "postprocess"):
                    value = worker.postprocess(output)
            elif hooked:  # without a context manager's cost per item
                value = worker.postprocess(output)
            else:  # the usual case: no postprocess of the worker's own
                value = output
            # A chunk is not held to the declared outputs: a stream's chunks may each carry
            # part of them (a token's text, the log-probabilities at the end), and no v2 or
            # KServe v1 answer is made of chunks (the proxy refuses a streaming worker's there).
            if chunks:
                return protocol.chunk(job_id, encode(value))
            encoded = encode(value)
            check_result(value)  # after: a value that cannot be its tensor is said first
            return protocol.ok(job_id, encoded, media_type(value))
        except _STOPS as e:
            _failures.stopping("postprocess", e)
            raise
        except BaseException as e:
            what = "postprocess or encoding of a chunk" if chunks else "postprocess or encoding"
            _failures.failed(what, e, [job_id])
            return protocol.error(job_id, _describe(e))

    return answer


def clear(worker: Hooks) -> None:
    """``deadline`` and ``content_type`` as they are outside an item's hooks: no item's."""
    worker.deadline = math.inf
    worker.content_type = None


def warm_up_batch(worker: Hooks, count: int) -> None:
    """``deadlines`` and ``content_types`` for a ``forward`` on ``count`` examples (warm-up):
    no deadline and no media type."""
    worker.deadlines = [math.inf] * count
    worker.content_types = [None] * count
