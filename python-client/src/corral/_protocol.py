"""Frames and messages of the worker protocol (worker-protocol/PROTOCOL.md in the repository),
and the checks of a job's fields the protocol constrains (:func:`job_timeout_ms`,
:func:`job_content_type`).

A frame is a 4-byte big-endian length followed by that many bytes: one msgpack map with a ``type``
key. Dicts are built with their keys in the documented order, so that the bytes match the Rust
implementation's exactly (the golden frames in worker-protocol/vectors/ check it).
"""

from __future__ import annotations

import re
import struct
from typing import Any, BinaryIO, Union

import msgpack
import msgspec

from corral._errors import ProtocolError

PROTOCOL_VERSION = 1
"""The protocol version this package speaks."""

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame body either side accepts (the same number as the Rust crate's)."""

_LENGTH = struct.Struct(">I")
# The bytes of a frame's length prefix.
HEADER_BYTES = _LENGTH.size


_TOO_LARGE = "the output is too large for one frame"


RECEIVED = "_received"
"""The key under which a worker's reader stamps each job of a batch with when it was read
(``time.monotonic()``): its deadline counts from then. Local to the package: the proxy's job
maps have no such key, and nothing is sent with it."""


# A media type as the proxy takes a worker's `content_type`: type/subtype, both RFC 9110 tokens,
# optionally `;` (after spaces or tabs) and parameters, visible ASCII, spaces and tabs, at most
# 1 KiB (`format::media_type`).
_MEDIA_TYPE = re.compile(
    r"[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+[ \t]*(;[\t\x20-\x7e]*)?"
)


# The longest media type the proxy passes on (a request's or a worker's), in bytes.
MAX_MEDIA_TYPE = 1024


def is_media_type(text: Any) -> bool:
    """Whether the proxy takes ``text`` as an output's ``content_type``."""
    return (
        isinstance(text, str)
        and len(text.encode("utf-8")) <= MAX_MEDIA_TYPE
        and _MEDIA_TYPE.fullmatch(text) is not None
        and text == text.strip(" \t")
    )


def is_range(text: str) -> bool:
    """Whether a media type is a range (``*/*``, ``image/*``): no output's type, which the
    proxy fails 500 ``bad_output`` (a response names one type). A request may send one."""
    return "*" in (part.strip() for part in text.split(";", 1)[0].split("/", 1))


def safe_text(text: str) -> str:
    """``text`` as valid UTF-8, which a msgpack ``str`` must be. Python strings may hold lone
    surrogates: ``os.fsdecode`` and ``sys.argv`` turn each undecodable byte of a name into one,
    and such a string cannot be encoded. Those bytes come back as ``\\xNN`` escapes of the
    original byte; any other lone surrogate as ``\\uDNNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no undecodable byte stands for
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def hello(
    stage: str,
    pid: int,
    name: str,
    *,
    schemas: dict[str, str] | None = None,
    features: list[str] | None = None,
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    weight: str | None = None,
    max_batch: int | None = None,
) -> dict[str, Any]:
    """The worker's first message. ``schemas`` (the optional ``input_schema``,
    ``output_schema`` and ``schema_components`` keys), ``features`` (``"stream"``,
    ``"cancel"``, ``"join"``, ``"shm"``), the tensor declarations ``inputs`` and ``outputs``
    (each ``{"name", "datatype", "shape"}``), the ``weight`` rule (a JSON Pointer) and
    ``max_batch`` (the most jobs a batch may bring) are left out when empty (``weight`` and
    ``max_batch`` when ``None``: ``""`` names the whole payload), so a hello with none of them
    is the v1 bytes."""
    message: dict[str, Any] = {
        "type": "hello",
        "version": PROTOCOL_VERSION,
        "stage": safe_text(stage),
        "pid": pid,
        "name": safe_text(name),
    }
    message.update(schemas or {})
    if features:
        message["features"] = list(features)
    if inputs:
        message["inputs"] = list(inputs)
    if outputs:
        message["outputs"] = list(outputs)
    if weight is not None:
        message["weight"] = weight
    if max_batch is not None:
        message["max_batch"] = max_batch
    return message


def ok(job_id: bytes, data: bytes, content_type: str | None = None) -> dict[str, Any]:
    """A job's output; ``content_type`` names the media type of an output that is one ``bin``."""
    if content_type is None:
        return {"id": job_id, "status": "ok", "data": data}
    return {"id": job_id, "status": "ok", "data": data, "content_type": safe_text(content_type)}


def invalid(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "invalid", "message": safe_text(message)}


def error(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "error", "message": safe_text(message)}


def expired(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "expired", "message": safe_text(message)}


def end(job_id: bytes) -> dict[str, Any]:
    """The result that ends a job that streamed (no ``data``)."""
    return {"id": job_id, "status": "end"}


def results(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "results", "results": items}


def chunk(job_id: bytes, data: bytes) -> dict[str, Any]:
    """One entry of a ``chunks`` message: one chunk (``data``, one msgpack value) of one job."""
    return {"id": job_id, "data": data}


def chunks(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Chunks of several jobs' streams in one message (one job's entries in order)."""
    return {"type": "chunks", "chunks": entries}


def pull(room: int) -> dict[str, Any]:
    """A joining worker's offer to take ``room`` more jobs now (0 withdraws an offer)."""
    return {"type": "pull", "max": room}


def job(
    job_id: bytes,
    timeout_ms: int,
    payload: bytes,
    content_type: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> dict[str, Any]:
    """One job of a batch; ``content_type`` only for a raw-bytes request, ``traceparent`` and
    ``tracestate`` only for a traced one."""
    message = {"id": job_id, "timeout_ms": timeout_ms, "payload": payload}
    if content_type is not None:
        message["content_type"] = content_type
    if traceparent is not None:
        message["traceparent"] = traceparent
    if tracestate is not None:
        message["tracestate"] = tracestate
    return message


def job_timeout_ms(job: dict[str, Any]) -> int:
    """A job's ``timeout_ms``, which must be a non-negative integer."""
    timeout = job.get("timeout_ms")
    if not isinstance(timeout, int) or timeout < 0:
        raise ProtocolError("a job's timeout_ms must be a non-negative integer")
    return timeout


def job_content_type(job: dict[str, Any]) -> str | None:
    """A raw-bytes job's media type (its payload is then one msgpack ``bin``); None otherwise."""
    content_type = job.get("content_type")
    if content_type is not None and not isinstance(content_type, str):
        raise ProtocolError("a job's content_type must be a string")
    return content_type


def batch(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "batch", "jobs": jobs}


def cancel(ids: list[bytes]) -> dict[str, Any]:
    """The proxy's message: these held jobs' clients left or their deadlines passed."""
    return {"type": "cancel", "ids": ids}


def shutdown(message: str) -> dict[str, Any]:
    return {"type": "shutdown", "message": message}


def reject(message: str) -> dict[str, Any]:
    return {"type": "reject", "message": message}


def encode_frame(message: dict[str, Any]) -> bytes:
    """One complete frame: length prefix and msgpack body."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes is over the {MAX_FRAME_BYTES} limit")
    return framed(body)


def framed(body: bytes) -> bytes:
    """``body`` as one complete frame, its length prefix in front (a copy of ``body``)."""
    return _LENGTH.pack(len(body)) + body


def length_prefix(body: bytes) -> bytes:
    """The 4 bytes that go before ``body`` on the wire."""
    return _LENGTH.pack(len(body))


def encode_results(items: list[dict[str, Any]], limit: int = MAX_FRAME_BYTES) -> bytes:
    """The ``results`` frame for ``items`` (the same bytes as ``encode_frame(results(items))``)."""
    return framed(results_body(items, limit))


def results_body(items: list[dict[str, Any]], limit: int = MAX_FRAME_BYTES) -> bytes:
    """The body of the ``results`` frame for ``items``, without its length prefix (a large one
    is written after its prefix rather than copied behind it: see ``_serve.send_body``).

    The frame is packed in one call; only if that fails, or the frame is over ``limit``, is
    each result encoded on its own, so that one that cannot be encoded becomes an error result
    for its job alone, and results that would take the body past ``limit`` become errors too
    (the earliest results keep their place): one bad or huge output fails its own job instead
    of the connection and the whole batch.
    """
    packer = msgpack.Packer(use_bin_type=True)  # autoreset: each call returns its own bytes
    try:
        # The usual case in one call (half the time of a call per result, measured): every
        # result encodes and the frame fits.
        body = packer.pack({"type": "results", "results": items})
    except Exception:  # msgpack raises TypeError, ValueError, OverflowError, ...
        pass  # each result on its own, below (a failed pack leaves nothing: msgpack >= 1.0)
    else:
        if len(body) <= limit:
            return body
        del body  # over the limit: not kept alive while each result is encoded again
    head = b"".join(
        [
            packer.pack_map_header(2),
            packer.pack("type"),
            packer.pack("results"),
            packer.pack("results"),
            packer.pack_array_header(len(items)),
        ]
    )
    encoded = [_encode_result(packer, item) for item in items]
    if len(head) + sum(len(body) for body in encoded) <= limit:  # the usual case: all fit
        return b"".join([head, *encoded])
    # Start from the smallest frame: each result as the shorter of itself and the "too large"
    # error (a result shorter than that error always keeps its place), then let each longer
    # result in turn have its real size while the body stays within limit.
    fallbacks = [packer.pack(error(item["id"], _TOO_LARGE)) for item in items]
    used = len(head) + sum(min(len(b), len(f)) for b, f in zip(encoded, fallbacks))
    parts = [head]
    for body, fallback in zip(encoded, fallbacks):
        if len(body) <= len(fallback):
            parts.append(body)
        elif used - len(fallback) + len(body) <= limit:
            used += len(body) - len(fallback)
            parts.append(body)
        else:
            parts.append(fallback)
    if used > limit:  # only if even the errors alone are over it
        raise ProtocolError(f"{len(items)} results cannot fit in a frame of {limit} bytes")
    return b"".join(parts)


def encode_chunks(
    entries: list[dict[str, Any]], limit: int = MAX_FRAME_BYTES
) -> tuple[list[bytes], list[int]]:
    """The ``chunks`` frames for ``entries``: one frame (the same bytes as
    ``encode_frame(chunks(entries))``) unless they would take its body past ``limit``; then as
    few frames as keep each within it, entries in order. Also returns the indices of the
    entries too large for any frame on their own: they are left out, and their jobs must end
    with an error."""
    packer = msgpack.Packer(use_bin_type=True)
    prefix = packer.pack("type") + packer.pack("chunks") + packer.pack("chunks")
    head_room = 1 + len(prefix) + 5  # map header, keys, the largest array header
    frames: list[bytes] = []
    too_large: list[int] = []
    group: list[bytes] = []
    used = head_room

    def flush() -> None:
        if group:
            head = packer.pack_map_header(2) + prefix + packer.pack_array_header(len(group))
            size = len(head) + sum(len(body) for body in group)
            # The length prefix joined in with the rest: one copy of the chunks, not two.
            frames.append(b"".join([_LENGTH.pack(size), head, *group]))

    for index, entry in enumerate(entries):
        body = packer.pack(entry)
        if head_room + len(body) > limit:
            too_large.append(index)
            continue
        if used + len(body) > limit:
            flush()
            group, used = [], head_room
        group.append(body)
        used += len(body)
    flush()
    return frames, too_large


def _encode_result(packer: msgpack.Packer, item: dict[str, Any]) -> bytes:
    try:
        return packer.pack(item)
    except Exception as e:  # msgpack raises TypeError, ValueError, OverflowError, ...
        packer.reset()  # a failed pack may leave partial output in the packer's buffer
        return packer.pack(error(item["id"], f"the result could not be encoded: {e}"))


# A batch frame as the proxy writes it starts with these bytes (its keys in this order).
_BATCH_HEAD = b"\x82\xa4type\xa5batch\xa4jobs"

# The smallest batch frame read without copying its payloads: below it the copies cost less
# than building each job's map by hand (a batch of 32 small jobs: ~5 us more that way).
_VIEWS_FROM = 64 * 1024


class _BatchJob(msgspec.Struct, forbid_unknown_fields=True):
    """A batch's job as read without copying its payload. Only a job exactly as the protocol
    has it is read this way (a key it does not know, or a value of another type, sends the whole
    frame to the plain reading, which keeps what it finds for the checks where it is used)."""

    id: bytes
    timeout_ms: int
    payload: memoryview
    # Union, not `|`: msgspec evaluates these annotations, and Python 3.9 has no `|` for types.
    content_type: Union[str, msgspec.UnsetType] = msgspec.UNSET  # noqa: UP007
    traceparent: Union[str, msgspec.UnsetType] = msgspec.UNSET  # noqa: UP007
    tracestate: Union[str, msgspec.UnsetType] = msgspec.UNSET  # noqa: UP007
    payload_at: Union[list[int], msgspec.UnsetType] = msgspec.UNSET  # noqa: UP007


class _Batch(msgspec.Struct):
    type: str
    jobs: list[_BatchJob]


_BATCH = msgspec.msgpack.Decoder(_Batch)


def _batch_without_copies(body: bytes) -> dict[str, Any] | None:
    """A ``batch`` frame whose payloads are views into ``body`` rather than copies: a raw body
    of 10 MB is then copied once in the worker (into the ``bytes`` its item is), not twice. None
    for anything else, or anything this reading does not take, which the plain reading then
    decodes (or refuses) as before."""
    if len(body) < _VIEWS_FROM or not body.startswith(_BATCH_HEAD):
        return None
    try:
        batch = _BATCH.decode(body)
    except Exception:  # msgspec's errors, bad UTF-8, deep nesting: the plain reading judges it
        return None
    jobs = []
    for job in batch.jobs:
        entry = {"id": job.id, "timeout_ms": job.timeout_ms, "payload": job.payload}
        if job.content_type is not msgspec.UNSET:
            entry["content_type"] = job.content_type
        if job.traceparent is not msgspec.UNSET:
            entry["traceparent"] = job.traceparent
        if job.tracestate is not msgspec.UNSET:
            entry["tracestate"] = job.tracestate
        if job.payload_at is not msgspec.UNSET:
            entry["payload_at"] = job.payload_at
        jobs.append(entry)
    return {"type": "batch", "jobs": jobs}


def decode_body(body: bytes) -> dict[str, Any]:
    """One frame body into a message dict; anything but a msgpack map with a string ``type`` is
    a protocol error. A ``batch`` frame of 64 KiB or more has its payloads as ``memoryview``s
    into ``body`` where it is exactly as the protocol has it, ``bytes`` otherwise (each job
    decodes its own: see ``_typing.Codec.decode``)."""
    batch = _batch_without_copies(body)
    if batch is not None:
        return batch
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"undecodable frame: {e}") from e
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a frame must be a msgpack map with a 'type' key")
    return message


def frame_length(header: bytes) -> int:
    """The body length a frame's header announces; a protocol error for a cut header or a body
    over the limit."""
    if len(header) < _LENGTH.size:
        raise ProtocolError("connection closed inside a frame header")
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes is over the {MAX_FRAME_BYTES} limit")
    return length


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message from a buffered stream, or None on a clean close between frames."""
    header = stream.read(_LENGTH.size)
    if not header:
        return None
    length = frame_length(header)
    body = stream.read(length)
    if len(body) < length:
        raise ProtocolError("connection closed inside a frame")
    return decode_body(body)
