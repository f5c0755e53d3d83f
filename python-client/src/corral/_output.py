"""A worker's encoded output as the proxy reads it: one well-formed msgpack value, nested at most
:data:`MAX_DEPTH` levels, its tensor values well-formed. What FakeProxy answers an output with,
and what warm-up holds each example's output to: one the proxy would refuse (500 ``bad_output``)
fails the worker's start, not every request once it says ready."""

from __future__ import annotations

from typing import Any

import msgpack

from corral import _tensors

# As deep as the proxy lets an output nest (PROTOCOL.md): a deeper one is its job's 500.
MAX_DEPTH = 128

NOT_READABLE = "the worker's output for this job is not one well-formed msgpack value"


def unpack(data: bytes) -> Any:
    # Tensor values as a worker's forward would see them: numpy arrays, or lists without numpy.
    # A map key that is an array (a tuple key, which the proxy passes to msgpack clients) comes
    # back as a tuple: as a list it cannot be a dict key.
    value = msgpack.unpackb(
        data,
        raw=False,
        strict_map_key=False,
        ext_hook=_tensors.ext_hook,
        object_pairs_hook=lambda pairs: {_hashable(key): v for key, v in pairs},
    )
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return value


def check(data: bytes) -> None:
    """Raises ``ValueError`` saying why, where the proxy would refuse ``data`` as an output."""
    try:
        unpack(data)
    except Exception as error:  # msgpack's, or a tensor's that is malformed
        raise ValueError(f"{NOT_READABLE}: {error}") from error


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, dict):
        return tuple((_hashable(k), _hashable(v)) for k, v in key.items())
    return key


def _depth(value: Any) -> int:
    """How many arrays and maps deep ``value`` nests (decoded tensors count as none). Only
    containers are kept to visit: a flat list of a million numbers costs no entry each."""
    containers = (dict, list, tuple)
    deepest, todo = 0, [(value, 1)] if isinstance(value, containers) else []
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        todo.extend((child, level + 1) for child in children if isinstance(child, containers))
    return deepest
