"""A worker's encoded output as the proxy reads it: one well-formed msgpack value, nested at most
:data:`MAX_DEPTH` levels, its tensor values well-formed. What FakeProxy answers an output with,
and what warm-up holds each example's output to: one the proxy would refuse (500 ``bad_output``)
fails the worker's start, not every request once it says ready."""

from __future__ import annotations

import functools
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


def check(data: bytes, what: str) -> None:
    """Raises ``ValueError`` saying why, where the proxy would refuse ``data`` as an output
    (``what``: "example 0's output", say).
    Lighter than :func:`unpack`: arrays stay tuples (hashable as keys, no hook per map) and
    only tensor values are read, so that an example's output of a million small maps is not
    many times its encoding's cost (and an ext type of another code passes, as the proxy
    passes it)."""
    read = functools.partial(
        msgpack.unpackb, raw=False, strict_map_key=False, use_list=False, ext_hook=_tensor_only
    )
    try:
        try:
            value = read(data)
        except TypeError:  # a map key that is a map, or holds one
            value = read(data, object_pairs_hook=lambda pairs: {_as_key(k): v for k, v in pairs})
        if _depth(value) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    except Exception as error:  # msgpack's, or a tensor's that is malformed
        raise ValueError(f"{what} is not one the proxy reads: {error}") from error


def _as_key(key: Any) -> Any:
    """A map key as a hashable value that nests as deep as the proxy counts it: a map's entries
    in one tuple (one level, as a map is), an array's elements alike, each converted."""
    if isinstance(key, dict):
        return tuple(_as_key(part) for pair in key.items() for part in pair)
    if isinstance(key, (list, tuple)):
        return tuple(_as_key(part) for part in key)
    return key


def _tensor_only(code: int, data: bytes) -> Any:
    # Checked, then a leaf, as the proxy counts it (without numpy its value is lists, which
    # would count as nesting).
    if code == _tensors.EXT_TENSOR:
        _tensors.ext_hook(code, data)
    return None


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, dict):
        return tuple((_hashable(k), _hashable(v)) for k, v in key.items())
    return key


def _depth(value: Any) -> int:
    """How many arrays and maps deep ``value`` nests (decoded tensors count as none), up to one
    past :data:`MAX_DEPTH` (deeper is refused all the same). Level by level, each level's
    containers gathered by C loops rather than a Python step per child: a million small maps
    had taken 5 s."""
    containers = (dict, list, tuple)
    level = [value] if isinstance(value, containers) else []
    depth = 0
    while level and depth <= MAX_DEPTH:
        depth += 1
        children: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                children += node.keys()
                children += node.values()
            else:
                children += node
        level = [child for child in children if isinstance(child, containers)]
    return depth
