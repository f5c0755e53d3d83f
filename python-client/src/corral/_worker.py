"""The :class:`Worker` base class: per-item hooks around a batched ``forward``, and the loop that
serves a proxy connection.

Each job's payload is decoded on its own, so one undecodable or invalid item is answered alone
(422) and never costs its batch-mates their results. Only an exception in ``forward`` itself,
which sees the whole batch, fails every item that reached it (500). The worker lives on either way.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import msgpack
import msgspec

from corral import _protocol as protocol
from corral._errors import ProtocolError, ValidationError

log = logging.getLogger("corral")

# Room for a results frame's own keys and per-result overhead when keeping it under the limit.
_FRAME_SLACK = 64 * 1024
_RESULT_OVERHEAD = 64


class Worker:
    """Base class for an inference worker. Override :meth:`forward`; optionally
    :meth:`preprocess` and :meth:`postprocess`.

    ``stage`` names the proxy stage this worker serves (``"default"`` for a single-stage proxy);
    ``run(stage=...)``, ``--stage`` on the command line and ``CORRAL_STAGE`` (which Corral sets
    for the workers it spawns) override it, in that order.
    """

    stage: str = "default"

    examples: ClassVar[Sequence[Any]] = ()
    """Example requests (as a client would send them, decoded) run through the hooks and
    ``forward`` once at start, before the worker connects, so that the first real batch is not
    the slow one. If any fails, the worker logs why and exits instead of serving."""

    input_type: ClassVar[Any] = None
    """Optional: the type each request must have — typically a ``msgspec.Struct``, or any type
    msgspec can validate (``list[float]``, ``dict[str, int]``, …). Each payload is decoded and
    validated straight from msgpack into it; a payload that does not fit answers 422 with
    msgspec's message and the path of the bad field, and its batch-mates go on. Its JSON Schema
    goes to the proxy in the handshake, for ``GET /openapi.json``."""

    output_type: ClassVar[Any] = None
    """Optional: the type of each response (documented in ``/openapi.json``; outputs are encoded
    with msgspec, so ``msgspec.Struct`` instances need no conversion)."""

    deadline: float = math.inf
    """During ``preprocess`` and ``postprocess``: the current item's deadline, on the
    ``time.monotonic()`` clock. Past it the client has had its 408 and the result is dropped."""

    deadlines: list[float]
    """During ``forward``: each input's deadline, aligned with the batch (``time.monotonic()``)."""

    def preprocess(self, item: Any) -> Any:
        """Turn one decoded request into a model input. Raise :class:`ValidationError` to reject
        this item alone (422)."""
        return item

    def forward(self, batch: list[Any]) -> list[Any]:
        """Run the model on a batch; return one output per input, in the same order."""
        raise NotImplementedError("a Worker must implement forward(batch)")

    def postprocess(self, output: Any) -> Any:
        """Turn one model output into the response value (anything msgpack can encode; objects
        with a ``tolist()`` method, such as numpy arrays, are converted)."""
        return output

    # -- running ---------------------------------------------------------------------------

    @classmethod
    def run(cls, socket_path: str | None = None, stage: str | None = None) -> None:
        """Create the worker and serve the proxy at ``socket_path`` (default: ``--socket`` on the
        command line, else ``CORRAL_SOCKET``, else ``corral.sock``) for ``stage`` (default:
        ``--stage``, else ``CORRAL_STAGE``, else the class's :attr:`stage`), reconnecting if the
        connection drops, until the process is stopped."""
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        argv = _options_from_argv()
        path = socket_path or argv.socket or os.environ.get("CORRAL_SOCKET", "corral.sock")
        worker = cls()
        worker.stage = stage or argv.stage or os.environ.get("CORRAL_STAGE") or cls.stage
        try:
            worker.warm_up()
        except Exception as e:
            log.exception("warm-up failed; this worker will not serve")
            raise SystemExit(f"warm-up failed: {_describe(e)}") from e
        try:
            worker._run_forever(path)
        except KeyboardInterrupt:
            pass

    def warm_up(self) -> None:
        """Run :attr:`examples` through ``preprocess``, ``forward`` and ``postprocess`` as one
        batch; raise if any step fails or an output cannot be encoded."""
        if not self.examples:
            return
        started = time.monotonic()
        # The same path as a real request: encoded, decoded (and validated), then the hooks.
        inputs = [self.preprocess(self._decode(_pack(example))) for example in self.examples]
        outputs = list(self.forward(inputs))
        if len(outputs) != len(inputs):
            raise RuntimeError(f"forward returned {len(outputs)} outputs for {len(inputs)} inputs")
        for output in outputs:
            self._encode(self.postprocess(output))
        log.info("warmed up on %d examples in %.2fs", len(inputs), time.monotonic() - started)

    def _run_forever(self, path: str) -> None:
        """Connect and serve; an external worker reconnects whenever the connection drops, a
        worker spawned by ``corral -- CMD`` (CORRAL_WORKER_INDEX set) exits instead."""
        spawned = "CORRAL_WORKER_INDEX" in os.environ
        delay = 0.05
        waiting_logged = False
        while True:
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
                self.serve(sock)
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

    def serve(self, sock: socket.socket) -> None:
        """Serve one connected socket until the proxy closes it: hello, then one results frame
        per batch. Raises :class:`ProtocolError` on a frame the protocol does not allow and
        ``SystemExit`` when the proxy refuses this worker."""
        stream = sock.makefile("rb")
        try:
            name = type(self).__name__
            hello = {**protocol.hello(self.stage, os.getpid(), name), **self.schemas()}
            sock.sendall(protocol.encode_frame(hello))
            while True:
                message = protocol.read_frame(stream)
                if message is None:
                    return
                kind = message["type"]
                if kind == "batch":
                    jobs = message.get("jobs")
                    if not isinstance(jobs, list):
                        raise ProtocolError("a batch must carry a list of jobs")
                    answer = protocol.results(self.process(jobs))
                    sock.sendall(protocol.encode_frame(answer))
                elif kind == "reject":
                    raise SystemExit(f"corral refused this worker: {message.get('message')}")
                elif kind == "shutdown":
                    log.info("corral is shutting down: %s", message.get("message"))
                    raise SystemExit(0)
                else:
                    raise ProtocolError(f"unexpected message type {kind!r}")
        finally:
            stream.close()

    def _decode(self, payload: Any) -> Any:
        if self.input_type is None:
            return _decode_payload(payload)
        if not isinstance(payload, bytes):
            raise ProtocolError("a job payload must be bytes")
        try:
            return _typed(type(self)).decoder.decode(payload)
        except msgspec.ValidationError as e:
            raise ValidationError(str(e)) from e
        except msgspec.DecodeError as e:
            raise ValidationError(f"the payload is not valid msgpack: {e}") from e

    def _encode(self, output: Any) -> bytes:
        if self.input_type is None and self.output_type is None:
            return _pack(output)
        return _typed(type(self)).encoder.encode(output)

    def schemas(self) -> dict[str, str]:
        """The hello's schema keys: JSON Schemas of ``input_type`` and ``output_type`` (as JSON
        text, references pointing into ``#/components/schemas/``), and those components."""
        declared = [t for t in (self.input_type, self.output_type) if t is not None]
        if not declared:
            return {}
        template = "#/components/schemas/{name}"
        found, components = msgspec.json.schema_components(declared, ref_template=template)
        found = list(found)
        schemas = {}
        if self.input_type is not None:
            schemas["input_schema"] = msgspec.json.encode(found.pop(0)).decode()
        if self.output_type is not None:
            schemas["output_schema"] = msgspec.json.encode(found.pop(0)).decode()
        schemas["schema_components"] = msgspec.json.encode(components).decode()
        return schemas

    def remaining(self) -> float:
        """Seconds left before the current item's deadline (see :attr:`deadline`)."""
        return self.deadline - time.monotonic()

    def process(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result per job of a batch (the protocol's ``results`` list)."""
        received = time.monotonic()
        answers: list[dict[str, Any] | None] = [None] * len(jobs)
        deadlines = [received + _timeout_ms(job) / 1000 for job in jobs]
        inputs: list[Any] = []
        positions: list[int] = []
        for position, job in enumerate(jobs):
            job_id = job.get("id")
            if not isinstance(job_id, bytes):
                raise ProtocolError("a job id must be bytes")
            self.deadline = deadlines[position]
            if self.deadline <= time.monotonic():
                # Its client has had a 408 already; the proxy would drop the result.
                answers[position] = protocol.expired(
                    job_id, "the deadline passed before processing"
                )
                continue
            try:
                item = self.preprocess(self._decode(job.get("payload")))
            except ValidationError as e:
                answers[position] = protocol.invalid(job_id, str(e))
            except Exception as e:
                log.exception("preprocess failed")
                answers[position] = protocol.error(job_id, _describe(e))
            else:
                inputs.append(item)
                positions.append(position)
        if inputs:
            self._forward_and_encode(jobs, inputs, positions, answers, deadlines)
        self.deadline = math.inf
        return _fit_in_frame([a for a in answers if a is not None])

    def _forward_and_encode(
        self,
        jobs: list[dict[str, Any]],
        inputs: list[Any],
        positions: list[int],
        answers: list[dict[str, Any] | None],
        deadlines: list[float],
    ) -> None:
        self.deadlines = [deadlines[p] for p in positions]
        try:
            outputs = list(self.forward(inputs))
            if len(outputs) != len(inputs):
                raise RuntimeError(
                    f"forward returned {len(outputs)} outputs for {len(inputs)} inputs"
                )
        except Exception as e:
            log.exception("forward failed on a batch of %d", len(inputs))
            message = _describe(e)
            for position in positions:
                answers[position] = protocol.error(jobs[position]["id"], message)
            return
        for position, output in zip(positions, outputs):
            job_id = jobs[position]["id"]
            self.deadline = deadlines[position]
            try:
                data = self._encode(self.postprocess(output))
            except Exception as e:
                log.exception("postprocess or encoding failed")
                answers[position] = protocol.error(job_id, _describe(e))
            else:
                answers[position] = protocol.ok(job_id, data)


def _timeout_ms(job: dict[str, Any]) -> int:
    timeout = job.get("timeout_ms")
    if not isinstance(timeout, int) or timeout < 0:
        raise ProtocolError("a job's timeout_ms must be a non-negative integer")
    return timeout


def _decode_payload(payload: Any) -> Any:
    if not isinstance(payload, bytes):
        raise ProtocolError("a job payload must be bytes")
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:
        raise ValidationError(f"the payload is not valid msgpack: {e}") from e


class _Typed:
    """A worker class's msgspec decoder (for its input_type) and encoder, built once."""

    def __init__(self, worker: type[Worker]) -> None:
        self.decoder = msgspec.msgpack.Decoder(worker.input_type or Any)
        self.encoder = msgspec.msgpack.Encoder(enc_hook=_plain)


_TYPED: dict[type, _Typed] = {}


def _typed(worker: type[Worker]) -> _Typed:
    typed = _TYPED.get(worker)
    if typed is None:
        typed = _TYPED[worker] = _Typed(worker)
    return typed


def _pack(value: Any) -> bytes:
    # A Packer per call: a shared one would be left in a bad state by an encoding error.
    return msgpack.packb(value, use_bin_type=True, default=_plain)


def _plain(value: Any) -> Any:
    """msgpack fallback for numpy arrays and scalars (and anything else with ``tolist``)."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as msgpack")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _fit_in_frame(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace results that would push the frame over the protocol limit with errors, so one
    huge output fails alone instead of breaking the connection for the whole batch."""
    budget = protocol.MAX_FRAME_BYTES - _FRAME_SLACK
    sizes = [len(a.get("data") or a.get("message", "")) + _RESULT_OVERHEAD for a in answers]
    if sum(sizes) <= budget:
        return answers
    used = 0
    fitted = []
    for answer in answers:
        size = len(answer.get("data") or answer.get("message", "")) + _RESULT_OVERHEAD
        if used + size > budget:
            answer = protocol.error(answer["id"], "the output is too large for one frame")
            size = _RESULT_OVERHEAD * 2
        used += size
        fitted.append(answer)
    return fitted


def _options_from_argv() -> argparse.Namespace:
    """``--socket`` and ``--stage`` if the command line has them; other arguments are the
    worker's own."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--socket")
    parser.add_argument("--stage")
    known, _ = parser.parse_known_args(sys.argv[1:])
    return known
