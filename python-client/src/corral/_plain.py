"""The plain answer path: one batch of a worker whose ``forward`` is not a generator, from its
jobs to one result each (the protocol's ``results`` list), beside ``_streaming``'s path for a
generator ``forward``. Both prepare and answer each job by ``_batch``'s per-job steps; what is
this path's own is calling ``forward`` once on the batch's prepared inputs, failing every item
that reached it if ``forward`` raises (500, each answered ``error``), and :func:`outputs`, which
checks that what ``forward`` returned can be read as one output per input before it is.

The worker is passed in as a :class:`Forwarder` (``_worker.Worker`` is one): this module never
imports ``_worker``, which imports it.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Protocol

from corral import _batch, _failures, _tracing
from corral import _protocol as protocol
from corral._errors import amount
from corral._errors import describe as _describe


class Forwarder(_batch.Hooks, Protocol):
    """What the plain path uses of a worker: the per-job hooks, and ``forward``."""

    def forward(self, batch: list[Any]) -> Any: ...


def process(worker: Forwarder, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per job of a batch: each prepared (an item that cannot be is answered alone),
    the rest through one ``forward``, each output answered."""
    answers, inputs, deadlines = _batch.prepare(worker, jobs)
    positions = [position for position, answer in enumerate(answers) if answer is None]
    if inputs:
        _forward(worker, jobs, inputs, positions, answers, deadlines)
    _batch.clear(worker)
    return [a for a in answers if a is not None]


def _forward(
    worker: Forwarder,
    jobs: list[dict[str, Any]],
    inputs: list[Any],
    positions: list[int],
    answers: list[dict[str, Any] | None],
    deadlines: list[float],
) -> None:
    """``forward`` on the prepared inputs (the jobs at ``positions``), and each output's
    answer into ``answers``; every one of them an error if ``forward`` fails."""
    worker.deadlines = [deadlines[p] for p in positions]
    # The batch's last deadline: once `remaining()` is not positive, none of it can make it.
    worker.deadline = max(worker.deadlines)
    content_types = [jobs[p].get("content_type") for p in positions]  # checked in prepare
    worker.content_types = content_types
    count = len(positions)  # not len(inputs): forward may consume or pad its list
    try:
        with _tracing.batch([jobs[p] for p in positions]):
            returned = counted(worker.forward(inputs), count)
    except (SystemExit, KeyboardInterrupt) as e:
        # Raised by the model or a library (sys.exit), it stops the worker: say where, or
        # the log shows only a worker gone and its batch retried elsewhere.
        _failures.stopping("forward", e)
        raise
    except BaseException as e:
        _failures.failed("forward", e, [jobs[p]["id"] for p in positions])
        message = _describe(e)
        for position in positions:
            answers[position] = protocol.error(jobs[position]["id"], message)
        return
    answer = _batch.answerer(worker)
    for position, content_type, output in zip(positions, content_types, returned):
        job = jobs[position]
        answers[position] = answer(job["id"], deadlines[position], content_type, output, job)


def counted(returned: Any, count: int) -> list[Any]:
    """What ``forward`` returned for ``count`` inputs as its list of outputs, one per input;
    refused (:func:`outputs`) where it cannot be, or holds another number of them."""
    source = outputs(returned)
    if isinstance(source, Sized):
        listed = list(source)
        returned_words = amount(len(listed), "output", "outputs")
    else:
        # An iterator is read one past the count, no further: `itertools.count()` was read
        # whole, at 600 MB a second with the GIL held, until the worker ran out of memory.
        listed = list(itertools.islice(source, count + 1))
        if inspect.isgenerator(source):
            source.close()  # its `finally` runs now, not whenever it is collected
        returned_words = amount(min(len(listed), count), "output", "outputs")
        if len(listed) > count:
            returned_words = f"more than {returned_words}"
    if len(listed) != count:
        raise RuntimeError(
            f"forward returned {returned_words} for {amount(count, 'input', 'inputs')}"
        )
    return listed


def outputs(returned: Any) -> Any:
    """What ``forward`` returned, if it can be its outputs (one per input, in order); refused
    with the fix where it cannot, rather than read item by item into wrong answers:

    - a coroutine (a wrapper that returns an ``async def``'s call), closed first;
    - a generator: a ``forward`` that yields, under a decorator that hides it (no
      ``functools.wraps``), so the worker was not made a streaming one; each step would have
      been taken as one item's whole answer, the batch's tokens mixed across its clients;
    - a mapping (a model's output of named batched arrays), a string or bytes (a
      ``memoryview`` too): iterating them gives keys, characters or byte values;
    - a set: it has no order, so its outputs went to other clients' inputs (7 of 8 clients got
      another's answer);
    - a data frame (pandas', polars': anything with ``columns``): iterating it gives its column
      names, which had gone to the clients as their answers, with 200;
    - anything that is not iterable (``None``, a number)."""
    if inspect.iscoroutine(returned) or inspect.isasyncgen(returned):
        if inspect.iscoroutine(returned):
            returned.close()
        raise TypeError(
            "forward returned a coroutine: it must return the outputs (run an async model "
            "with asyncio.run)"
        )
    # The hidden forward's own generator (its code is named so); a generator expression or a
    # helper generator returned from a plain forward is read into its outputs, as ever.
    if inspect.isgenerator(returned) and returned.gi_code.co_name == "forward":
        returned.close()
        raise TypeError(
            "forward returned a generator, but the worker does not stream: a decorator around "
            "a generator forward must keep it visible (functools.wraps); to return outputs, "
            "return a list"
        )
    if isinstance(returned, (Mapping, str, bytes, bytearray, memoryview)):
        hint = (
            f" (keys {', '.join(map(repr, list(returned)[:3]))}): return one output per input, "
            "e.g. a list of dicts, or the batched array itself"
            if isinstance(returned, Mapping)
            else ": return a list with one output per input"
        )
        raise TypeError(f"forward returned a {type(returned).__name__}{hint}")
    if hasattr(returned, "columns") and not isinstance(returned, Sequence):
        raise TypeError(
            f"forward returned a {type(returned).__name__}: iterating it gives its column "
            "names, not one output per input; return one per row, e.g. "
            "frame.to_dict('records') (pandas) or frame.to_dicts() (polars)"
        )
    if isinstance(returned, (set, frozenset)):
        raise TypeError(
            f"forward returned a {type(returned).__name__}, which has no order: return a list "
            "with one output per input, in the inputs' order"
        )
    try:
        iter(returned)  # what list() takes: `__iter__`, or a sequence's `__getitem__`
    except TypeError:
        raise TypeError(
            f"forward returned {type(returned).__name__}, not its outputs: return a list with "
            "one output per input"
        ) from None
    return returned
