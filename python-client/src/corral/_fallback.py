"""What the encoders fall back on for a value they cannot write themselves: numpy's arrays and
scalars converted (``tolist``; another class's ``tolist`` too, if what it gives is written), and
anything else refused with a message that says what to return instead (the type alone had told
an author nothing). :func:`plain` is msgpack's ``default`` (a worker without ``input_type`` or
``output_type``): numpy's dates and durations refused with numpy's advice. :func:`typed` is
msgspec's ``enc_hook``, which writes them as ISO 8601 (:func:`_iso`): msgspec writes Python
datetimes and timedeltas itself, msgpack does not."""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from typing import Any

from msgpack import Timestamp


def plain(value: Any) -> Any:
    """msgpack fallback for numpy arrays and scalars (and anything else with ``tolist``)."""
    kind = _time_kind(value)
    if kind:
        # A numpy datetime64 or timedelta64 (or an array of them) becomes a Python value msgpack
        # has no form for, or at nanoseconds a bare integer, silently: refused whatever its unit,
        # with numpy's advice (a date's `isoformat` is no numpy method).
        what = "array of " + str(value.dtype) if hasattr(value, "shape") and value.shape else kind
        raise TypeError(f"cannot encode numpy's {what} as msgpack: {_numpy_instead(kind)}")
    converted = _listed(value)
    # Another class's `tolist` that gives a numpy value (its own data, say): converted in turn,
    # as the advice below promises, rather than refused saying numpy's values are converted.
    if _numpys(converted) and not _numpys(value):
        return plain(converted)
    # msgpack calls this hook once for the value, not again for what it returned: a `tolist`
    # of some other class that gives what msgpack does not write had msgpack's own words
    # ("can not serialize 'Decimal' object"), with no advice.
    # (Nor an integer past its range: msgpack's bare "Integer value out of range".)
    if not isinstance(converted, _WRITTEN) or _too_wide(converted):
        name, gave = type(value).__name__, type(converted).__name__
        raise TypeError(
            f"cannot encode {name} as msgpack: its tolist() gave {gave}: {_instead(converted)}"
        )
    return converted


def _too_wide(value: Any) -> bool:
    """Whether ``value`` is an integer msgpack has no form for (past -2**63 to 2**64-1)."""
    return isinstance(value, int) and not -(2**63) <= value < 2**64


# What msgpack writes itself, as a fallback's answer (what a list or dict holds is looked at
# again, with this fallback; an ExtType is a tuple).
_WRITTEN = (
    list,
    tuple,
    dict,
    str,
    bytes,
    bytearray,
    memoryview,
    int,
    float,
    bool,
    type(None),
    Timestamp,
)


def typed(value: Any) -> Any:
    """msgspec's fallback (a worker with an ``input_type`` or ``output_type``): as :func:`plain`,
    but numpy's dates and durations are written as ISO 8601, as the advice for a worker without
    such a type says (:func:`_iso`)."""
    kind = _time_kind(value)
    return _iso(value, kind) if kind else _listed(value)


def _iso(value: Any, kind: str) -> Any:
    """A numpy datetime64 or timedelta64 (or an array of them) as msgspec writes ISO 8601, NaT
    as null: a date by :func:`_iso_dates`, a duration by :func:`_iso_durations`."""
    return _iso_dates(value) if kind == "datetime64" else _iso_durations(value)


def _iso_dates(value: Any) -> Any:
    """A numpy datetime64 (or an array of them) as ISO 8601 text in its own unit: numpy's own
    text (its ``tolist`` gives a bare integer at nanoseconds, pandas' unit, and past the years 1
    to 9999), with a year outside 0000 to 9999 in ISO 8601's expanded form (:func:`_expanded`)."""
    import numpy  # only a numpy value comes here

    # A masked array's hidden values are missing, as its floats' are (written as null).
    missing = numpy.ma.getmaskarray(value) | numpy.isnat(numpy.ma.getdata(value))
    # In this machine's byte order: numpy's datetime_as_string reads a big-endian array's bytes
    # as its own ("2020-01-01" came out as the year 17021397593678114).
    value = numpy.asarray(numpy.ma.getdata(value)).astype(value.dtype.newbyteorder("="))
    text = numpy.asarray(numpy.datetime_as_string(value), dtype=object)
    # A date of picoseconds or finer lies within days of 1970, and numpy cannot cast it to
    # years (the factor overflows int64).
    if numpy.datetime_data(value.dtype)[0] not in ("ps", "fs", "as"):
        # Compared in years: a bound cast to a finer unit could overflow; NaT is never outside.
        # Only the few expanded years pay for Python's string work.
        years = numpy.asarray(value).astype("datetime64[Y]")
        # ISO 8601's four digits, without a sign, hold the years 0000 (1 BC) to 9999.
        outside = (years < numpy.datetime64("0000", "Y")) | (years > numpy.datetime64("9999", "Y"))
        text[outside] = [_expanded(date) for date in text[outside]]
    return numpy.where(missing, None, text).tolist()


def _expanded(date: str) -> str:
    """numpy's text for a date whose year is outside 0000 to 9999, in ISO 8601's expanded form:
    a sign always and at least four digits (numpy writes the year -5 as "-005" and 12000 with
    no sign, which a reader of ISO 8601 takes for no year or a malformed one)."""
    sign, body = ("-", date[1:]) if date.startswith("-") else ("+", date)
    rest = body.lstrip("0123456789")
    year = body[: len(body) - len(rest)]
    return f"{sign}{year.zfill(4)}{rest}"


def _iso_durations(value: Any) -> Any:
    """A numpy timedelta64 (or an array of them) as a Python timedelta, which msgspec writes as
    an ISO 8601 duration, where it is one exactly (cast to microseconds, numpy wraps a large
    one's sign without a word and drops nanoseconds; a month or a year has no fixed length, a
    duration without a unit no length at all). Otherwise refused with numpy's advice."""
    import numpy  # only a numpy value comes here

    unit = numpy.datetime_data(value.dtype)[0]
    nat = numpy.isnat(value)
    if numpy.all(nat):
        return numpy.where(nat, None, None).tolist()
    if unit == "generic":
        # numpy.timedelta64(5) is 5 of whatever unit it meets: cast to microseconds it had been
        # written as 5 µs, where a worker without an output_type refuses it.
        why = "it has no unit: give it one, e.g. numpy.timedelta64(5, 's') for 5 seconds"
    elif unit in ("Y", "M"):
        why = "numpy gives months and years no fixed length: return str(value)"
    else:
        micro = value.astype("timedelta64[us]")
        if numpy.all(nat | (micro.astype(value.dtype) == value)):
            return micro.tolist()
        why = (
            "it is finer than a microsecond, or longer than a Python timedelta holds: return "
            "value / numpy.timedelta64(1, 's') (seconds, a float) or str(value)"
        )
    raise TypeError(f"cannot write numpy's timedelta64[{unit}] {value} as ISO 8601: {why}")


def _numpys(value: Any) -> bool:
    """Whether ``value`` is one of numpy's own (an array or a scalar)."""
    return type(value).__module__.partition(".")[0] == "numpy"


def _time_kind(value: Any) -> str:
    """``"datetime64"`` or ``"timedelta64"`` for a numpy value or array of that kind, else
    ``""``."""
    dtype = getattr(value, "dtype", None)
    # numpy's own dtypes only: pandas' zoned dates say "M" too, and go as their Timestamps.
    if type(dtype).__module__.partition(".")[0] != "numpy":
        return ""
    return {"M": "datetime64", "m": "timedelta64"}.get(getattr(dtype, "kind", None), "")


_TIMES = (datetime.date, datetime.time, datetime.timedelta)


def _listed(value: Any) -> Any:
    """A value with ``tolist`` (numpy's) converted; ``TypeError`` saying what to return instead
    for one that has none, or that converts to nothing msgpack or msgspec writes."""
    tolist = getattr(value, "tolist", None)
    if not callable(tolist):
        raise TypeError(f"cannot encode {type(value).__name__} as msgpack: {_instead(value)}")
    converted = tolist()
    name = type(value).__name__
    numpys = _numpys(value)  # else some other class's
    # numpy's longdouble (and clongdouble) is its own tolist(), having no Python type that holds
    # it: msgspec would call this hook again, until a RecursionError.
    if type(converted) is type(value):
        if not numpys:
            raise TypeError(
                f"cannot encode {name} as msgpack: its tolist() gives a {name} again; "
                + _instead(value)
            )
        raise TypeError(
            f"cannot encode {name} as msgpack: numpy's {name} has no Python type to hold it; "
            "convert it first, e.g. value.astype(numpy.float64) (or complex128), or str(value) "
            "to keep its precision"
        )
    if isinstance(converted, complex):
        owner = "numpy's " if numpys else ""
        raise TypeError(f"cannot encode {owner}{name} as msgpack: {_instead(converted)}")
    return converted


def _numpy_instead(kind: str) -> str:
    """What to return instead of a numpy datetime64 or timedelta64 (``kind``, as
    :func:`_time_kind` says). Not a Python value's advice: numpy's have no ``isoformat`` or
    ``total_seconds``."""
    if kind == "timedelta64":
        return (
            "return value / numpy.timedelta64(1, 's') (seconds, a float) or str(value) (str "
            "alone for a unit of months or years), or declare an output_type, which writes it "
            "as an ISO 8601 duration (given a unit: numpy.timedelta64(5, 's'), not (5))"
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
