"""Frames and messages of the worker protocol (worker-protocol/PROTOCOL.md in the repository).

A frame is a 4-byte big-endian length followed by that many bytes: one msgpack map with a ``type``
key. Dicts are built with their keys in the documented order, so that the bytes match the Rust
implementation's exactly (the golden frames in worker-protocol/vectors/ check it).
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack

from corral._errors import ProtocolError

PROTOCOL_VERSION = 1
"""The protocol version this package speaks."""

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame body either side accepts (the same number as the Rust crate's)."""

_LENGTH = struct.Struct(">I")


def hello(stage: str, pid: int, name: str) -> dict[str, Any]:
    return {"type": "hello", "version": PROTOCOL_VERSION, "stage": stage, "pid": pid, "name": name}


def ok(job_id: bytes, data: bytes) -> dict[str, Any]:
    return {"id": job_id, "status": "ok", "data": data}


def invalid(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "invalid", "message": message}


def error(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "error", "message": message}


def expired(job_id: bytes, message: str) -> dict[str, Any]:
    return {"id": job_id, "status": "expired", "message": message}


def results(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "results", "results": items}


def encode_frame(message: dict[str, Any]) -> bytes:
    """One complete frame: length prefix and msgpack body."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes is over the {MAX_FRAME_BYTES} limit")
    return _LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """One frame body into a message dict; anything but a msgpack map with a string ``type`` is
    a protocol error."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"undecodable frame: {e}") from e
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a frame must be a msgpack map with a 'type' key")
    return message


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message from a buffered stream, or None on a clean close between frames."""
    header = stream.read(_LENGTH.size)
    if not header:
        return None
    if len(header) < _LENGTH.size:
        raise ProtocolError("connection closed inside a frame header")
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes is over the {MAX_FRAME_BYTES} limit")
    body = stream.read(length)
    if len(body) < length:
        raise ProtocolError("connection closed inside a frame")
    return decode_body(body)
