"""Open Inference Protocol v2 tensors: the :class:`Tensor` declaration a worker class lists in
``inputs`` and ``outputs``, the datatype table, and the tensor value of the worker protocol (a
msgpack ext of type 1 whose data is ``[datatype, shape, bin]``, see the repository's
worker-protocol/PROTOCOL.md, "Tensors and raw bytes"), decoded and encoded.

A tensor value decodes to a numpy array when numpy can be imported: numeric datatypes as a
zero-copy, read-only view of the message's bytes, ``BYTES`` as an object array of ``bytes``.
Without numpy it decodes to nested lists (the row's shape) of ``bool``, ``int``, ``float`` or
``bytes``. numpy is imported lazily and only if present: it is not a dependency of the package.
A tensor value that does not fit its own header (an unknown datatype, a byte count that does
not match the shape, ``BYTES`` lengths that do not fill the data) raises
:class:`ValidationError`, the job's 422.

This module imports nothing else of the package but its errors, so ``_typing`` and
``_worker`` both use it without an import circle.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

import msgpack
import msgspec

from corral._errors import ValidationError

EXT_TENSOR = 1
"""The msgpack ext type of a tensor value."""


class Datatype(NamedTuple):
    """One v2 datatype: numpy's dtype string for it (explicitly little-endian, the wire's byte
    order), the size of one element in bytes (0: variable, ``BYTES``), and its ``struct``
    format character (used without numpy)."""

    numpy: str
    size: int
    struct: str


DATATYPES: dict[str, Datatype] = {
    "BOOL": Datatype("|b1", 1, "?"),
    "UINT8": Datatype("|u1", 1, "B"),
    "UINT16": Datatype("<u2", 2, "H"),
    "UINT32": Datatype("<u4", 4, "I"),
    "UINT64": Datatype("<u8", 8, "Q"),
    "INT8": Datatype("|i1", 1, "b"),
    "INT16": Datatype("<i2", 2, "h"),
    "INT32": Datatype("<i4", 4, "i"),
    "INT64": Datatype("<i8", 8, "q"),
    "FP16": Datatype("<f2", 2, "e"),
    "FP32": Datatype("<f4", 4, "f"),
    "FP64": Datatype("<f8", 8, "d"),
    "BYTES": Datatype("O", 0, ""),
}
"""The datatypes of the protocol, by their v2 name."""

# The struct codes of the integer datatypes.
_INTEGERS = frozenset("bBhHiIqQ")

# numpy 2 allows 64 dimensions (numpy 1: 32, where reshape's own error answers). A bound also
# keeps the nested lists built without numpy within Python's recursion limit.
_MAX_DIMS = 64

# The largest dimension a hello carries: the proxy reads each as a signed 64-bit integer.
MAX_DIMENSION = (1 << 63) - 1

# An empty tensor still becomes nested empty lists without numpy, one per row of the dimensions
# before its first 0: a shape such as [2**40, 0] would be a cheap request for a huge loop.
_MAX_EMPTY_ROWS = 1 << 16

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Tensor:
    """One declared tensor of a worker: ``name`` (e.g. ``"INPUT0"``), ``datatype`` (one of v2's:
    ``BOOL``, ``UINT8`` … ``UINT64``, ``INT8`` … ``INT64``, ``FP16``, ``FP32``, ``FP64``,
    ``BYTES``) and ``shape``, one row's shape without the
    batch dimension (``-1``: a dimension of any length; ``()``: a scalar per row)."""

    name: str
    datatype: str
    shape: Sequence[int] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tensor's name must be a non-empty str, not {self.name!r}")
        if self.datatype not in DATATYPES:
            known = ", ".join(DATATYPES)
            raise ValueError(
                f"tensor {self.name!r}: unknown datatype {self.datatype!r} (one of {known})"
            )
        shape = self.shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise ValueError(f"tensor {self.name!r}: the shape must be a sequence of ints")
        # bool is no dimension; past 2**63 - 1 no hello can carry it (the proxy reads an i64):
        # the worker had been refused, or failed packing its hello, at every restart.
        if not all(type(d) is int and -1 <= d <= MAX_DIMENSION for d in shape):
            raise ValueError(
                f"tensor {self.name!r}: each dimension must be an int from -1 to 2**63 - 1, "
                f"got {list(shape)}"
            )
        # A tuple, so that the declaration stays frozen (and hashable) whatever was passed.
        object.__setattr__(self, "shape", tuple(shape))

    def spec(self) -> dict[str, Any]:
        """The declaration as the hello carries it (keys in the documented order)."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def declared(worker: type, attribute: str) -> tuple[Tensor, ...]:
    """A worker class's ``inputs`` or ``outputs``, checked: a sequence of :class:`Tensor` with
    distinct names (``TypeError`` or ``ValueError`` otherwise, naming the class)."""
    tensors = getattr(worker, attribute, ())
    where = f"{worker.__name__}.{attribute}"
    if tensors is None:
        return ()
    if isinstance(tensors, (str, bytes, Tensor)) or not isinstance(tensors, Sequence):
        raise TypeError(f"{where} must be a tuple of corral.Tensor, not {type(tensors).__name__}")
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{where} must hold corral.Tensor, not {type(tensor).__name__}")
    names = [t.name for t in tensors]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{where} declares {', '.join(map(repr, twice))} more than once")
    return tuple(tensors)


# -- numpy, when there is one ---------------------------------------------------------------

_UNSET: Any = object()
_numpy_module: Any = _UNSET


def numpy() -> Any:
    """The numpy module, or None when it cannot be imported (imported once, on first use, so
    that workers without tensors never pay for it)."""
    global _numpy_module
    if _numpy_module is _UNSET:
        try:
            import numpy as np
        except ImportError:
            np = None
        _numpy_module = np
    return _numpy_module


# -- decoding -------------------------------------------------------------------------------


def ext_hook(code: int, data: Any) -> Any:
    """msgpack's and msgspec's ``ext_hook``: a tensor value (ext type 1) decoded; any other ext
    type as the decoder would give it without a hook (``msgpack.ExtType``, or
    ``msgspec.msgpack.Ext`` for a typed worker: ``data`` is then a memoryview), as it always
    has: the protocol claims type 1 only, and a msgpack client may send others on its own
    routes."""
    if code == EXT_TENSOR:
        # msgspec's data is a view of the buffer it decodes (a batch frame, or shared memory the
        # proxy reuses once the job is answered): the array gets a copy of its own.
        return decode(bytes(data) if isinstance(data, memoryview) else data)
    if isinstance(data, memoryview):  # only msgspec passes one
        return msgspec.msgpack.Ext(code, bytes(data))
    return msgpack.ExtType(code, data)


def msgspec_ext_hook(code: int, data: Any) -> Any:
    """:func:`ext_hook` for a worker whose outputs msgspec encodes: ext types other than a
    tensor's as ``msgspec.msgpack.Ext``, which msgspec writes back as the ext it was."""
    if code == EXT_TENSOR:
        return ext_hook(code, data)
    return msgspec.msgpack.Ext(code, bytes(data))


def decode(data: bytes | memoryview) -> Any:
    """One tensor value's data (``[datatype, shape, bin]``) as a numpy array, or nested lists
    without numpy. The elements are not copied where numpy can view them in place."""
    datatype, shape, elements = _header(data)
    info = DATATYPES[datatype]
    np = numpy()
    if datatype == "BYTES":
        items = _split_bytes(elements, math.prod(shape))
        if np is None:
            return _nest(items, shape)
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return _reshape(array, shape)
    count = math.prod(shape)
    if count * info.size != len(elements):
        raise ValidationError(
            f"tensor data of {len(elements)} bytes does not fit {datatype} of shape {shape}"
            f" ({count * info.size} bytes)"
        )
    if datatype == "BOOL" and bytes(elements).translate(None, b"\x00\x01"):
        raise ValidationError("a BOOL tensor's bytes must each be 0 or 1")
    if np is None:
        return _nest(list(struct.unpack_from(f"<{count}{info.struct}", elements)), shape)
    return _reshape(np.frombuffer(elements, dtype=info.numpy, count=count), shape)


def _reshape(array: Any, shape: list[int]) -> Any:
    try:
        return array.reshape(shape)
    except ValueError as e:  # more dimensions than this numpy allows, or too large a product
        raise ValidationError(f"a tensor of shape {shape} cannot be built: {e}") from e


# The header read by msgspec: its ``memoryview`` points into the value's own bytes, so the
# elements are not copied out of the message (msgpack would copy them into a ``bytes``).
_HEADER = msgspec.msgpack.Decoder(
    tuple[
        str,
        Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=_MAX_DIMS)],
        memoryview,
    ]
)


def _header(data: bytes | memoryview) -> tuple[str, list[int], memoryview]:
    """The datatype, the shape and a view of the elements."""
    try:
        datatype, shape, elements = _HEADER.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        if "utf-8" in str(e).lower():  # msgspec's builds word it apart; the datatype is the str
            raise ValidationError("a tensor value's datatype is not valid UTF-8") from e
        # msgspec says what and where ("Expected `int` >= 0 - at `$[1][0]`": $[1] the shape).
        head = "a tensor value must be [datatype (str), shape (array of non-negative ints)"
        raise ValidationError(f"{head}, data (bin)]: {e}") from e
    if datatype not in DATATYPES:
        raise ValidationError(f"unknown tensor datatype {datatype!r}")
    return datatype, shape, elements


def _split_bytes(data: memoryview, count: int) -> list[bytes]:
    """``count`` BYTES elements, each a 4-byte little-endian length and then that many bytes,
    filling ``data`` exactly."""
    end = len(data)
    if count > end // _LENGTH.size:  # each element takes 4 bytes at least
        raise ValidationError(f"{end} bytes cannot hold {count} BYTES elements")
    elements = []
    at = 0
    for _ in range(count):
        if at + _LENGTH.size > end:
            raise ValidationError(f"the tensor's data ends before its {count} BYTES elements")
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if at + size > end:
            raise ValidationError("a BYTES element's length runs past the tensor's data")
        elements.append(bytes(data[at : at + size]))
        at += size
    if at != end:
        raise ValidationError("a BYTES tensor's data goes on past its elements")
    return elements


def _nest(flat: list[Any], shape: list[int]) -> Any:
    """Flat row-major elements as nested lists of ``shape`` (a scalar for shape ``[]``)."""
    if not shape:
        return flat[0]
    if not flat and math.prod(_before_zero(shape)) > _MAX_EMPTY_ROWS:
        raise ValidationError(f"an empty tensor of shape {shape} has too many empty rows")
    return _nest_rows(flat, shape)


def _before_zero(shape: list[int]) -> list[int]:
    return shape[: shape.index(0)] if 0 in shape else shape


def _nest_rows(flat: list[Any], shape: list[int]) -> list[Any]:
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    inner = shape[1:]
    return [_nest_rows(flat[i * step : (i + 1) * step], inner) for i in range(shape[0])]


# -- encoding -------------------------------------------------------------------------------


def encode(value: Any, datatype: str, declared: Sequence[int] | None = None) -> bytes:
    """A row as the data of a tensor value of ``datatype``: a numpy array (or anything
    ``numpy.asarray`` takes: lists, scalars, other arrays) converted to the datatype; without
    numpy, a scalar or nested lists. ``BYTES`` elements are ``bytes`` or ``str`` (as UTF-8).
    Raises ``TypeError`` or ``ValueError`` for a value that cannot be that datatype, or whose
    shape is not the ``declared`` one (-1: any length)."""
    info = DATATYPES[datatype]
    np = numpy()
    if np is not None:
        if datatype == "BYTES":
            array = np.asarray(value, dtype=object)
            shape, data = list(array.shape), _join_bytes(array.flat)
        else:
            # The '<' dtypes: the wire is little-endian whatever this machine's order is.
            array = _exact(np, value, datatype, np.dtype(info.numpy))
            shape = list(array.shape)
            _held_to(shape, declared)  # before a large array is copied out for nothing
            data = array.tobytes()
    else:
        shape, flat = _flatten(value)
        if datatype == "BYTES":
            data = _join_bytes(flat)
        else:
            # As with numpy: numbers only (struct takes any truthy value as a BOOL's True).
            wrong = next((x for x in flat if type(x) not in (bool, int, float)), None)
            if wrong is not None or (datatype == "BOOL" and any(x not in (0, 1) for x in flat)):
                shown = f"a {type(wrong).__name__}" if wrong is not None else "a value not 0 or 1"
                raise ValueError(f"cannot encode {shown} as {datatype}")
            if info.struct in _INTEGERS:
                # As with numpy: a float that is a whole number is that integer (struct refuses
                # every float); one with a fraction, NaN or an infinity would change.
                if any(type(x) is float and not x.is_integer() for x in flat):
                    raise ValueError(
                        f"these values would change as {datatype} (fractions, NaN or infinities)"
                    )
                flat = [int(x) if type(x) is float else x for x in flat]
            try:
                data = struct.pack(f"<{len(flat)}{info.struct}", *flat)
            except (struct.error, OverflowError) as e:  # out of the datatype's range
                if info.struct in "efd":  # FP16/FP32 (an int or a float): numpy's words, `_exact`
                    raise ValueError(f"a finite value is past {datatype}'s range") from e
                raise ValueError(f"cannot encode these values as {datatype}: {e}") from e
    _held_to(shape, declared)  # each element's own error first, as before
    return msgpack.packb([datatype, shape, data], use_bin_type=True)


def holds(array: Any, tensor: Tensor) -> bool:
    """Whether a numpy array is already a row of ``tensor``: its datatype and a shape its
    declaration allows (a look, no copy: every input of every v2 row passes here)."""
    declared = tensor.shape
    if array.dtype != _numpy_dtype(tensor.datatype) or array.ndim != len(declared):
        return False
    return all(d < 0 or n == d for n, d in zip(array.shape, declared))


@functools.cache
def _numpy_dtype(datatype: str) -> Any:
    """The numpy dtype a row of ``datatype`` decodes to, made once (1 µs a call)."""
    return numpy().dtype(object if datatype == "BYTES" else DATATYPES[datatype].numpy)


def _held_to(shape: list[int], declared: Sequence[int] | None) -> None:
    """Raises ``ValueError`` for a row whose ``shape`` its declaration does not allow (-1: any
    length), as the proxy holds a v2 or KServe v1 answer to it: a worker whose tests passed
    here had failed every request of those clients (500)."""
    fits = declared is None or (
        len(shape) == len(declared) and all(d < 0 or n == d for n, d in zip(shape, declared))
    )
    if not fits:
        raise ValueError(f"shape {shape} where {list(declared or ())} is declared")


def _numbers_of(np: Any, objects: Any) -> Any:
    """An object array whose elements are all numbers (``np.array([1, 2], dtype=object)``, a
    list built up of mixed ints and floats) as the array of numbers it holds, for the checks
    below to convert exactly; any other object array as it is, to be refused."""
    try:
        numbers = np.array(objects.tolist())
    except (TypeError, ValueError):  # ragged elements
        return objects
    if numbers.dtype.kind in "biuf" and numbers.shape == objects.shape:
        return numbers
    return objects


# What a value of each numpy kind that is no number is, in a client's words (a native client's
# row read `FP32 holds numbers, not values of numpy dtype <U3` for `{"X": "abc"}`).
_NOT_NUMBERS = {
    "U": "strings",
    "S": "bytes",
    "O": "objects (None, strings, maps, or lists of unequal lengths)",
    "M": "dates",
    "m": "durations",
    "c": "complex numbers",
    "V": "structured values",
}


def _plain_numbers(objects: Any) -> bool:
    """Whether an object array holds Python integers, floats and booleans only (no subclass,
    which may convert as it likes)."""
    return all(type(x) in (int, float, bool) for x in objects.flat)


def _exact(np: Any, value: Any, datatype: str, target: Any) -> Any:
    """``value`` as an array of ``target``. For integer and boolean datatypes, a conversion that
    would change a value is refused: floats with a fraction (numpy truncates), integers out of
    range (numpy wraps, also between signed and unsigned of one width), NaN. For FP16 and FP32,
    a finite number past the type's range (numpy makes it infinite) is refused. The proxy
    refuses the same in JSON inputs: a tensor never holds a number its sender did not. (Floats
    narrowing to FP16 or FP32 round, as they must, and so do integers made floats: 2**24 + 1 as
    FP32, or an integer past 64 bits as FP64.)"""
    # Only booleans and numbers are numbers: numpy would cast strings ("1.5", "False" to True),
    # None (to NaN, in an object array), Decimals and complex numbers (dropping the imaginary
    # part) without a word, and the client would get a value the worker never returned.
    try:
        source = value if isinstance(value, np.ndarray) else np.asarray(value)
    except ValueError as e:  # numpy's "setting an array element with a sequence...": in ours
        if "sequence" not in str(e):
            raise
        raise ValueError("nested lists are not rectangular (lists of unequal lengths)") from e
    if source.size and source.dtype.kind == "O":
        source = _numbers_of(np, source)
    if source.size and source.dtype.kind == "O" and _plain_numbers(source):
        # Integers past 64 bits (with floats or not), which numpy keeps as objects: past every
        # integer datatype (they had been told "not numbers"), numbers still for a float one.
        if target.kind != "f":
            raise ValueError(f"a value does not fit in {datatype}")
        try:
            source = np.array(source.tolist(), dtype=np.float64)
        except OverflowError as e:
            raise ValueError(f"a finite value is past {datatype}'s range") from e
    if source.size and source.dtype.kind not in "biuf":
        what = _NOT_NUMBERS.get(source.dtype.kind, "values")
        raise ValueError(f"{datatype} holds numbers, not {what} (numpy dtype {source.dtype})")
    if target.kind == "f":
        # numpy flags a cast that makes a finite number infinite as an overflow (from 1.24 on),
        # element by element and at no cost when none is (an infinity given is no overflow).
        try:
            with np.errstate(over="raise", invalid="ignore"):
                return np.asarray(source, dtype=target)
        except FloatingPointError as e:
            raise ValueError(f"a finite value is past {datatype}'s range") from e
    # What a cast loses is checked below, not warned about (NaN, overflow) as it happens.
    with np.errstate(invalid="ignore", over="ignore"):
        try:
            array = np.asarray(value, dtype=target)
        except OverflowError as e:
            # numpy's own words are CPython's ("Python int too large to convert to C long").
            raise ValueError(f"a value does not fit in {datatype}") from e
        except ValueError as e:
            # A scalar NaN is refused by numpy itself ("cannot convert float NaN to integer"),
            # where an array of them is cast and found below: said alike.
            raise ValueError(
                f"these values would change as {datatype} (fractions, range or NaN)"
            ) from e
        if target.kind not in "iub":
            return array
        plain = source  # the value as numpy reads it, converted once (above)
        if plain.dtype == target or plain.dtype.kind not in "biuf" or not plain.size:
            return array
        if plain.dtype.kind in "iu" and target.kind in "iu":
            # A round trip would not see -1 as UINT64 (it comes back -1): compare the ranges.
            info = np.iinfo(target)
            same = info.min <= int(plain.min()) and int(plain.max()) <= info.max
        else:
            same = np.array_equal(array.astype(plain.dtype), plain)
    if not same:
        raise ValueError(f"these values would change as {datatype} (fractions, range or NaN)")
    return array


def _join_bytes(elements: Any) -> bytes:
    parts = []
    for element in elements:
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif isinstance(element, (bytearray, memoryview)):
            element = bytes(element)  # a memoryview's len counts items, not bytes
        elif not isinstance(element, bytes):
            raise TypeError(f"a BYTES element must be bytes or str, not {type(element).__name__}")
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def _flatten(value: Any) -> tuple[list[int], list[Any]]:
    """The shape and row-major elements of a scalar or of nested lists (tuples too), which must
    be rectangular. ``str`` and ``bytes`` are elements, never sequences."""
    shape: list[int] = []
    probe = value
    while isinstance(probe, (list, tuple)):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat: list[Any] = []

    # As with numpy (`_exact`), with the shape the first lists gave.
    ragged = f"nested lists are not rectangular (lists of unequal lengths: shape {shape} expected)"

    def walk(item: Any, depth: int) -> None:
        if depth == len(shape):
            if isinstance(item, (list, tuple)):
                raise ValueError(ragged)
            flat.append(item)
            return
        if not isinstance(item, (list, tuple)) or len(item) != shape[depth]:
            raise ValueError(ragged)
        for inner in item:
            walk(inner, depth + 1)

    walk(value, 0)
    return shape, flat
