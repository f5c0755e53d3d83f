"""The :class:`Worker` base class: per-item hooks around a batched ``forward``, and starting a
worker (options, warm-up, the hello). The connection itself is ``_serve``'s; a plain batch's path
from jobs to results is ``_plain``'s, a streaming one's ``_streaming``'s; payload decoding and
output encoding are ``_typing``'s; the per-job steps around ``forward`` (each job prepared before
it, each output answered after it) are ``_batch``'s.

Each job's payload is decoded on its own, so one undecodable or invalid item is answered alone
(422) and never costs its batch-mates their results. Only an exception in ``forward`` itself,
which sees the whole batch, fails every item that reached it (500). The worker lives on either
way, whatever a hook raises (any ``BaseException`` included), except ``KeyboardInterrupt`` and
``SystemExit``, which stop it. A ``forward`` that is a generator streams; running it is
``_streaming``'s, with the same per-job steps of ``_batch``. The private methods the package adds
to answer a batch are named ``_corral_*`` so that a subclass's own helpers, such as an
``_answer`` or a ``_prepare``, never replace them.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence, Set
from typing import Any, ClassVar

from corral import (
    _allocator,
    _batch,
    _declarations,
    _logging,
    _output,
    _plain,
    _process_end,
    _serve,
    _shared_memory,
    _stream_warm_up,
    _streaming,
    _tensors,
    _typing,
)
from corral import _protocol as protocol
from corral._errors import describe as _describe

log = logging.getLogger("corral")

# Whether `max_running` on a worker that does not stream was warned about (once a process).
_warned_max_running = threading.Event()


class _class_or_instance:
    """A method that gets its class and, called on an instance, that instance too (else
    ``None``): ``Worker.run()`` builds the worker, ``Worker(...).run()`` serves the one built
    (a classmethod would build another and drop its configuration)."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    def __get__(self, instance: Any, owner: type) -> Callable[..., Any]:
        bound = functools.partial(self._method, owner, instance)

        # A function, not the partial itself: help() and __doc__ showed functools.partial's.
        def method(*args: Any, **kwargs: Any) -> Any:
            return bound(*args, **kwargs)

        functools.update_wrapper(method, self._method)
        method.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
        return method


class Worker:
    """Base class for an inference worker. Override :meth:`forward`; optionally
    :meth:`preprocess` and :meth:`postprocess`.

    ``stage`` names the proxy stage this worker serves (``"default"`` for a single-stage proxy);
    ``run(stage=...)``, ``--stage`` on the command line and ``CORRAL_STAGE`` (which Corral sets
    for the workers it spawns) override it, in that order; a worker Corral spawned for one stage
    that names another it spawns workers for is refused.

    **Streaming.** A ``forward`` written as a generator streams each item's answer in pieces.
    Each ``yield`` is a list with one entry per item: a chunk for each item that has one this
    step, ``None`` for an item with nothing this step, or :data:`corral.END` to end that item's
    stream now (its client's stream closes at once; later entries at its position are ignored).
    The chunks of one yield go to the proxy in one frame, each through ``postprocess`` first.
    When the generator returns, every item not yet ended ends (if it returns a value, they fail
    saying so: no client would get it); if it raises, those items get an error (500 / an error
    event) and the ones already ended are unaffected. Between yields,
    :attr:`cancelled` holds the positions whose stream is over without an ``END`` from you —
    the client left, the proxy's stream timeout passed, the deadline passed before the item's
    first chunk, or its chunk failed ``postprocess`` — each already ended for you: stop
    computing them (their chunks are dropped). A streaming worker declares ``stream`` and
    ``cancel`` in its hello; a plain one declares nothing (it could not act on a cancel in the
    middle of ``forward``), so its frames are exactly protocol v1's.

    **Joining.** With :attr:`max_running` set, items join a running generator between steps:
    while fewer than ``max_running`` items are running, the package asks the proxy for more,
    and each ``yield`` *returns* the list of the new items' inputs (preprocessed; ``[]`` when
    none joined). They take the next positions, in order: from the next yield on, the yielded
    list, :attr:`cancelled` and :attr:`deadlines` cover them too. Positions never move during
    one generator: an ended item keeps its position (yield ``None`` there). ::

        class Generate(corral.Worker):
            max_running = 32

            def forward(self, prompts):
                texts = list(prompts)                     # position -> text so far
                left = [100] * len(texts)                 # characters to go; 0: END next; -1: over
                while True:
                    for p in self.cancelled:              # ended for us already
                        left[p] = -1
                    if all(n < 0 for n in left):
                        return
                    live = [p for p, n in enumerate(left) if n > 0]
                    step = [corral.END if n == 0 else None for n in left]
                    for p, char in zip(live, self.sample([texts[p] for p in live])):
                        texts[p] += char                  # one model step for the whole batch
                        step[p] = char
                    left = [n - 1 if n > 0 else -1 for n in left]
                    new = yield step                      # inputs of the items that joined
                    texts += new
                    left += [100] * len(new)
    """

    stage: str = "default"

    examples: ClassVar[Sequence[Any]] = ()
    """Example requests (as a client would send them, decoded) run through the hooks and
    ``forward`` once at start, before the worker connects, so that the first real batch is not
    the slow one. For a worker that declares ``inputs``, each declared input's value reaches the
    hooks as a v2 client's row does, a numpy array of its datatype. If any fails, the worker
    logs why and exits instead of serving."""

    input_type: ClassVar[Any] = None
    """Optional: the type each request must have — typically a ``msgspec.Struct``, or any type
    msgspec can validate (``list[float]``, ``dict[str, int]``, …). Each payload is decoded and
    validated straight from msgpack into it; a payload that does not fit answers 422 with
    msgspec's message and the path of the bad field, and its batch-mates go on. Its JSON Schema
    goes to the proxy in the handshake, for ``GET /openapi.json``; a payload in that schema's
    form is taken too (bytes as a base64 string, as a JSON client sends them)."""

    output_type: ClassVar[Any] = None
    """Optional: the type of each response (documented in ``/openapi.json``; outputs are encoded
    with msgspec, so ``msgspec.Struct`` instances need no conversion), written as its JSON Schema
    says for every client: bytes as base64 strings, aware datetimes as RFC 3339 strings (an
    output that is bytes as a whole stays the raw answer)."""

    inputs: ClassVar[Sequence[_tensors.Tensor]] = ()
    """Optional, for Open Inference Protocol v2 clients: the tensors each request holds, as
    :class:`corral.Tensor` declarations (name, datatype, one row's shape). Each payload is then a
    dict from input name to that row: a numpy array (zero-copy and read-only) when numpy can be
    imported, else nested lists. Checked when the class is defined (distinct names)."""

    outputs: ClassVar[Sequence[_tensors.Tensor]] = ()
    """Optional: the tensors each response holds. Return a dict from output name to that row
    (a numpy array, nested lists or a scalar), converted to the declared datatype."""

    weight: ClassVar[str | None] = None
    """Optional: how heavy each request is, for a proxy run with ``--max-batch-weight``: a JSON
    Pointer into the request (e.g. ``"/text"``); the request weighs the length of the string
    (in characters), list, dict or bytes found there, else 1. A client's ``x-corral-weight``
    header overrides it. The proxy bounds each batch's total weight and learns the batch cost per
    unit of weight; what a unit costs (tokens, pixels) is this worker's business."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A bad declaration fails where the class is defined, not at the first hello.
        _declarations.check(cls)

    deadline: float = math.inf
    """During ``preprocess`` and ``postprocess``: the current item's deadline, on the
    ``time.monotonic()`` clock. Past it the client has had its 408 and the result is dropped.
    During a plain ``forward``: the latest of the batch's :attr:`deadlines`, so that once
    :meth:`remaining` is not positive no item of the batch can make it; during a streaming one,
    the same over its items while none has sent a chunk yet (kept up to date at each
    ``yield``), and ``inf`` once one streams (the proxy's stream timeout ends it, with a
    cancel)."""

    # Empty until the first batch (read in a hook before it, it had been an AttributeError, a
    # 500); each batch then sets a list of its own, so this one is never added to.
    deadlines: list[float] = []  # noqa: RUF012
    """During ``forward`` (and the ``postprocess`` after it): each input's deadline, aligned with
    the batch (``time.monotonic()``). A streaming item's deadline bounds the time to its first
    chunk. In ``preprocess`` the batch is not formed yet: use :attr:`deadline`."""

    content_type: str | None = None
    """During ``preprocess`` and ``postprocess``: the media type of the current item if its
    request was raw bytes (a ``Content-Type`` other than JSON or msgpack, e.g. ``"image/png"``,
    as the client sent it, parameters included); the item is then ``bytes``. ``None`` for a JSON
    or msgpack request (and for :attr:`examples`)."""

    content_types: list[str | None] = []  # noqa: RUF012  (as deadlines)
    """During ``forward`` (and the ``postprocess`` after it): each input's
    :attr:`content_type`, aligned with the batch. In ``preprocess`` the batch is not formed
    yet: use :attr:`content_type`."""

    output_content_type: ClassVar[str | None] = None
    """Optional: the media type of the outputs that are ``bytes`` (after ``postprocess``), e.g.
    ``"image/png"``. A client that accepts it (or ``application/octet-stream``, or one that sent
    raw bytes and left ``Accept`` open) gets those bytes as the body with this type; other
    clients get them in JSON or msgpack. Outputs of other types are unaffected. Unset, bytes go
    back raw as ``application/octet-stream`` to the clients that accept that."""

    max_running: ClassVar[int | None] = None
    """A streaming worker that sets it (a positive integer) lets items join its running
    generator between steps, up to this many running at once (see the class docstring);
    ``None`` or 0: each generator runs only the batch it started with."""

    cancelled: Set[int] = frozenset()
    """During a streaming ``forward``: the positions whose stream is over without an ``END``
    (client gone, deadline passed, chunk failed), updated between yields without blocking."""

    @_batch.passes_through
    def preprocess(self, item: Any) -> Any:
        """Turn one decoded request into a model input. Raise :class:`ValidationError` to reject
        this item alone (422)."""
        return item

    def forward(self, batch: list[Any]) -> list[Any]:
        """Run the model on a batch; return one output per input, in the same order. Or write
        it as a generator to stream (see the class docstring)."""
        raise NotImplementedError("a Worker must implement forward(batch)")

    forward.unwritten = True  # type: ignore[attr-defined]  # `_declarations.check_instance`

    @_batch.passes_through
    def postprocess(self, output: Any) -> Any:
        """Turn one model output into the response value (anything msgpack can encode; objects
        with a ``tolist()`` method, such as numpy arrays, are converted)."""
        return output

    # -- running ---------------------------------------------------------------------------

    @_class_or_instance
    def run(
        cls, instance: Worker | None, socket_path: str | None = None, stage: str | None = None
    ) -> None:
        """Create the worker (``Worker.run()``; or serve this one, ``Worker(...).run()``, as
        configured) and serve the proxy at ``socket_path`` (default: ``--socket`` on the
        command line, else ``CORRAL_SOCKET``, else ``corral.sock``) for ``stage`` (default:
        ``--stage``, else ``CORRAL_STAGE``, else the worker's :attr:`stage`). A worker started
        by hand waits for the proxy, reconnects if the connection drops, and exits (status 0)
        when the proxy says ``shutdown``; one the proxy spawned exits when its connection ends
        (its proxy is gone or restarting it)."""
        _logging.configure()
        # From here a spawned worker ends once its proxy is gone: loading, warming up or serving.
        _process_end.watch_proxy()
        argv = _options_from_argv()
        # An empty CORRAL_SOCKET is as good as none (a template that left it blank).
        path = socket_path or argv.socket or os.environ.get("CORRAL_SOCKET") or "corral.sock"
        _serve.check_path(path)  # before a model is loaded and warmed for minutes
        # What ends the process if threads hold it (see _process_end): from the model's load
        # on, since `__init__` may start them and a failed warm-up leave them running.
        status = 1
        try:
            # A failure to start is logged as one record, its level and traceback kept (JSON
            # logs: one ERROR object); left to Python's own handler, the commonest one, a model
            # that cannot load, had been a line per frame, each forwarded as INFO. The exit's
            # one line says it again in short, for whoever ran the worker by hand.
            try:
                worker = cls() if instance is None else instance
                worker.stage = stage or argv.stage or os.environ.get("CORRAL_STAGE") or worker.stage
                _declarations.check_instance(worker)  # before a warm-up of minutes
            except Exception as e:
                log.exception("the worker failed to start; it will not serve")
                raise SystemExit(f"the worker failed to start: {_describe(e)}") from e
            try:
                worker.warm_up()
            except Exception as e:
                log.exception("warm-up failed; this worker will not serve")
                raise SystemExit(f"warm-up failed: {_describe(e)}") from e
            worker._run_forever(path)
            status = 0
        except KeyboardInterrupt:
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            raise
        finally:
            _process_end.watch_threads(status)

    def warm_up(self) -> None:
        """Run :attr:`examples` through ``preprocess``, ``forward`` and ``postprocess`` as one
        batch (a streaming worker's in batches of at most ``max_running``); raise if any step
        fails or an output cannot be encoded."""
        if not self.examples:
            return
        started = time.monotonic()
        # The same path as a real request: encoded, decoded (and validated, a native row held
        # to the declared inputs as served), then the hooks.
        codec = _typing.codec(type(self))
        preprocessed = _batch.own(self.preprocess, "preprocess")
        read = codec.reader(preprocessed)
        examples = (read(codec.example_payload(example, preprocessed)) for example in self.examples)
        inputs = [self.preprocess(example) for example in examples]
        count = len(inputs)  # counted before forward, which may consume or pad its list
        if _streaming.is_streaming(self):
            # As serving runs them: at most `max_running` at once (a memory bound, say).
            step = _streaming.limit(self) or count or 1
            for start in range(0, count, step):
                _stream_warm_up.warm_up(self, inputs[start : start + step], start)
            log.info("warmed up on %d examples in %.2fs", count, time.monotonic() - started)
            return
        _batch.warm_up_batch(self, count)
        outputs = _plain.counted(self.forward(inputs), count)
        for index, output in enumerate(outputs):
            value = self.postprocess(output)
            # As the proxy reads it: one nested past its 128 levels had passed, and the worker
            # said ready to fail every request.
            _output.check(codec.encode(value), f"example {index}'s output")
            codec.check_result(value)
            codec.content_type(value)
        log.info("warmed up on %d examples in %.2fs", count, time.monotonic() - started)

    def _run_forever(self, path: str) -> None:
        """Connect and serve; an external worker reconnects whenever the connection drops, a
        worker spawned by ``corral -- CMD`` (CORRAL_WORKER_INDEX set) exits instead, and so does
        one waiting for a proxy that is gone (CORRAL_PROXY_PID)."""
        if not _streaming.is_streaming(self) and _shared_memory.features():
            # Large bodies may come to this worker: let their pages be reused (once a process,
            # as it starts serving; not for a test's FakeProxy, which calls `serve` itself).
            _allocator.tune()
        _serve.run_forever(path, self.serve)

    def serve(self, sock: socket.socket) -> None:
        """Serve one connected socket until the proxy closes it: hello, then one results frame
        per batch (a streaming worker: chunks as they come, and each job's result as it ends).
        Raises :class:`ProtocolError` on a frame the protocol does not allow and ``SystemExit``
        when the proxy refuses this worker or shuts down. The proxy's frames are read all
        along, also while results are written."""
        # Again here, for a worker served without `run` (FakeProxy, a test calling `serve`).
        _declarations.check_instance(self)
        # Decided once a connection, from the instance (a forward set in __init__ counts), as
        # the hello declares it: not again per batch.
        # The codec first: an `input_type` msgspec cannot decode into (an untagged union of
        # Structs, say) fails here, with msgspec's message, not at the first batch after a hello
        # that said ready (the worker then died at every batch, restarted for ever).
        _typing.codec(type(self))
        streams = _streaming.is_streaming(self)
        limit = _streaming.limit(self) if streams else 0  # `join` or not, for the connection
        hello = protocol.hello(
            self.stage,
            os.getpid(),
            type(self).__name__,
            schemas=self.schemas(),
            # Shared memory only for a plain worker: the proxy keeps it from streaming ones.
            # The instance's `max_running` (set in __init__, say) is the one its streams use.
            features=_streaming.features(self, limit) or _shared_memory.features(),
            inputs=[t.spec() for t in _tensors.declared(type(self), "inputs")],
            outputs=[t.spec() for t in _tensors.declared(type(self), "outputs")],
            weight=type(self).weight,
            # A joining worker runs at most `max_running` items: no fresh batch brings more.
            max_batch=limit or None,
        )
        if not streams and self.max_running and not _warned_max_running.is_set():
            _warned_max_running.set()  # once a process, not at every reconnect
            log.warning(
                "max_running is set but forward is not a generator: items join only a "
                "streaming forward, and this worker serves batches as they come"
            )
        if streams:
            _serve.serve(sock, hello, lambda jobs, link: _streaming.run(self, jobs, link, limit))
        else:
            _serve.serve(sock, hello, lambda jobs, link: self._corral_process(jobs))

    def schemas(self) -> dict[str, str]:
        """The hello's schema keys: JSON Schemas of ``input_type`` and ``output_type`` (as JSON
        text, references pointing into ``#/components/schemas/``), and those components. A type
        that msgspec decodes but cannot describe (``object``, an ``Ext``) gives none: schemas
        are documentation, and the worker serves without them (logged)."""
        try:
            # The class's, as the codec reads them: what is published is what is enforced.
            worker = type(self)
            return _typing.schemas(worker.input_type, worker.output_type)
        except (TypeError, ValueError) as e:
            log.warning("no JSON Schema for this worker's types: %s", _describe(e))
            return {}

    def remaining(self) -> float:
        """Seconds left before the current item's deadline (in a plain ``forward``, the
        batch's last; see :attr:`deadline`)."""
        return self.deadline - time.monotonic()

    def _corral_process(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result per job of a batch (the protocol's ``results`` list; a plain worker:
        ``_plain``'s path). Named ``_corral_*``, as the package's other batch methods: a
        subclass's own helper named ``process`` once replaced it, and every batch failed."""
        return _plain.process(self, jobs)


def _options_from_argv() -> argparse.Namespace:
    """``--socket`` and ``--stage`` if the command line has them; other arguments are the
    worker's own."""
    # No abbreviations: the worker's own `--s 5` was refused as ambiguous, its `--sock` taken
    # for the socket.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--socket")
    parser.add_argument("--stage")
    known, _ = parser.parse_known_args(sys.argv[1:])
    return known
