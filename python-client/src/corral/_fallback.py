"""What the encoders fall back on for a value they cannot write themselves: numpy's arrays and
scalars converted (``tolist``), and anything else refused with a message that says what to return
instead (the type alone had told an author nothing). :func:`plain` is msgpack's ``default`` (a
worker without ``input_type`` or ``output_type``), :func:`typed` msgspec's ``enc_hook``: msgspec
writes Python datetimes and timedeltas itself, msgpack does not."""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from typing import Any


def plain(value: Any) -> Any:
    """msgpack fallback for numpy arrays and scalars (and anything else with ``tolist``)."""
    kind = _time_kind(value)
    if kind:
        # A numpy datetime64 or timedelta64 (or an array of them) becomes a Python value msgpack
        # has no form for, or at nanoseconds a bare integer, silently: refused whatever its unit,
        # with numpy's advice (a date's `isoformat` is no numpy method).
        what = "array of " + str(value.dtype) if hasattr(value, "shape") and value.shape else kind
        raise TypeError(f"cannot encode numpy's {what} as msgpack: {_numpy_instead(kind)}")
    return _listed(value)


def typed(value: Any) -> Any:
    """msgspec's fallback (a worker with an ``input_type`` or ``output_type``): as :func:`plain`,
    but a numpy datetime64 or timedelta64 (or an array of them) becomes the Python datetime or
    timedelta msgspec writes itself (ISO 8601), as the advice for a worker without such a type
    says: taken to microseconds first, since numpy gives a bare integer for nanoseconds (pandas'
    unit) and a date for days."""
    kind = _time_kind(value)
    if kind:
        try:
            value = value.astype(f"{kind}[us]")
        except (TypeError, ValueError):
            pass  # months or years have no fixed length: numpy's own value, as it converts
    return _listed(value)


def _time_kind(value: Any) -> str:
    """``"datetime64"`` or ``"timedelta64"`` for a numpy value or array of that kind, else
    ``""``."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return {"M": "datetime64", "m": "timedelta64"}.get(kind, "") if isinstance(kind, str) else ""


_TIMES = (datetime.date, datetime.time, datetime.timedelta)


def _listed(value: Any) -> Any:
    """A value with ``tolist`` (numpy's) converted; ``TypeError`` saying what to return instead
    for one that has none, or that converts to nothing msgpack or msgspec writes."""
    tolist = getattr(value, "tolist", None)
    if not callable(tolist):
        raise TypeError(f"cannot encode {type(value).__name__} as msgpack: {_instead(value)}")
    converted = tolist()
    name = type(value).__name__
    # numpy's longdouble (and clongdouble) is its own tolist(), having no Python type that holds
    # it: msgspec would call this hook again, until a RecursionError.
    if type(converted) is type(value):
        raise TypeError(
            f"cannot encode {name} as msgpack: numpy's {name} has no Python type to hold it; "
            "convert it first, e.g. value.astype(numpy.float64) (or complex128), or str(value) "
            "to keep its precision"
        )
    if isinstance(converted, complex):
        raise TypeError(f"cannot encode numpy's {name} as msgpack: {_instead(converted)}")
    return converted


def _numpy_instead(kind: str) -> str:
    """What to return instead of a numpy datetime64 or timedelta64 (``kind``, as
    :func:`_time_kind` says). Not a Python value's advice: numpy's have no ``isoformat`` or
    ``total_seconds``."""
    if kind == "timedelta64":
        return (
            "return value / numpy.timedelta64(1, 's') (seconds, a float) or str(value), or "
            "declare an output_type, which writes it as an ISO 8601 duration"
        )
    return (
        "return str(value) (ISO 8601; numpy.datetime_as_string(array) for an array), or "
        "declare an output_type, which writes it so"
    )


def _instead(value: Any) -> str:
    """What to return instead of a value msgpack does not encode (the message's second half:
    the type alone told an author nothing, and "int" was about its size)."""
    if isinstance(value, int):
        return (
            f"an integer of {value.bit_length()} bits is past msgpack's range (-2**63 to "
            "2**64-1); return it as a str"
        )
    if isinstance(value, (datetime.date, datetime.time)):
        return "return value.isoformat() (or declare an output_type, which writes it so)"
    if isinstance(value, datetime.timedelta):
        return (
            "return value.total_seconds() (seconds, a float) or str(value) (or declare an "
            "output_type, which writes it as an ISO 8601 duration)"
        )
    if isinstance(value, enum.Enum):
        return "return value.value"
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return "return str(value)"
    return (
        "return str, int, float, bool, None, bytes, or a list or dict of them (numpy arrays "
        "and scalars are converted)"
    )
