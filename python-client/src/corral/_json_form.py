"""A typed worker's values in their JSON form: the form the JSON Schemas in its hello describe,
which is what a JSON client reads in ``/openapi.json`` and sends.

msgspec's msgpack codec and its JSON Schemas disagree about a few values. ``bytes`` (and
``bytearray``, ``memoryview``) are a base64 string in the schema, a ``bin`` in msgpack; a
timezone-aware ``datetime`` is a string in the schema, msgpack's timestamp extension on the wire
(naive ones are strings in both); a number-keyed dict (``dict[int, str]``) has string keys in a
JSON object. The proxy transcodes a JSON body to msgpack value for value, and a msgpack output
to JSON the same way, so left to msgpack a JSON client could send no bytes (its base64 string
reaches the decoder as a ``str``: 422), would get bytes back as an array of numbers, and a
msgpack client would get an aware datetime as a timestamp where the schema says a string (the
proxy writes a timestamp for a JSON client as RFC 3339 text).

So, in the worker:

- a payload its ``input_type`` refuses is decoded again from its JSON form (:class:`Lenient`):
  ``msgspec.convert`` base64-decodes a string where bytes go and reads a string key as the number
  the type wants. Only for types that hold such values, and only once the one-pass decoder has
  refused: a msgpack client's ``bin`` costs what it always did. A v2 row's tensors become lists
  there, its ``BYTES`` inputs text where the type's field takes text (:func:`text_inputs`);
- a worker with an ``output_type`` writes its outputs in their JSON form (:func:`to_json_form`,
  ``msgspec.to_builtins``) for every client, so that its one schema holds for JSON and msgpack
  alike: datetimes as RFC 3339 strings, bytes as base64 strings. An output that is bytes as a
  whole stays a ``bin``, the raw-bytes answer (``output_content_type``). Types that hold none of
  those values skip the conversion, which would change nothing (:func:`differs_in_msgpack`).

This module imports nothing of the package but ``_tensors`` and its errors, so ``_typing`` uses it
without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from corral import _tensors
from corral._errors import ValidationError

_BYTES = (
    msgspec.inspect.BytesType,
    msgspec.inspect.ByteArrayType,
    msgspec.inspect.MemoryViewType,
)
_STR_KEYS = (msgspec.inspect.StrType, msgspec.inspect.AnyType)


def holds(root: msgspec.inspect.Type, found: Callable[[msgspec.inspect.Type], bool]) -> bool:
    """Whether a value of this type (msgspec's description of it) may hold, anywhere inside it,
    a type for which ``found`` is true (recursive types are walked once)."""
    return first(root, found) is not None


def first(
    root: msgspec.inspect.Type, found: Callable[[msgspec.inspect.Type], bool]
) -> msgspec.inspect.Type | None:
    """The first type inside this one (msgspec's description of it), itself included, for which
    ``found`` is true, if any (recursive types are walked once)."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if found(node):
            return node
        if id(node) in seen:
            continue
        seen.add(id(node))
        # Every description is a Struct: its parts are types, fields, or tuples of them.
        for name in node.__struct_fields__:
            value = getattr(node, name)
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, msgspec.inspect.Field):
                    part = part.type
                if isinstance(part, msgspec.inspect.Type):
                    pending.append(part)
    return None


def refused_in_json_form(node: msgspec.inspect.Type) -> bool:
    """A type whose JSON form msgspec's msgpack decoder refuses: bytes (a base64 string), a dict
    whose keys are not strings (a JSON object's keys are)."""
    if isinstance(node, _BYTES):
        return True
    key = getattr(node, "key_type", None)  # dict-like types
    return key is not None and not isinstance(key, _STR_KEYS)


def differs_in_msgpack(node: msgspec.inspect.Type) -> bool:
    """A type whose value msgspec's msgpack encoder may write otherwise than its JSON form:
    bytes, a datetime that may be aware, and whatever ``Any`` (``dict``, ``list``) or a custom
    type (``object``, the encoder's ``enc_hook``) may turn out to hold. ``Any`` costs such a
    worker about 0.7 µs an output; left out, an aware datetime in a ``dict`` output was a 500
    for JSON and v2 clients, and an ``Any`` field's bytes depended on its sibling fields."""
    if isinstance(node, msgspec.inspect.DateTimeType):
        return node.tz is not False  # naive datetimes are strings in msgpack too
    return isinstance(node, (*_BYTES, msgspec.inspect.AnyType, msgspec.inspect.CustomType))


def lenient(input_type: Any, info: msgspec.inspect.Type) -> Lenient | None:
    """The second try for payloads of ``input_type`` (``info``, msgspec's description of it), or
    None for a type that holds a ``Raw`` (which only the one-pass decoder makes). A payload the
    one-pass decoder refused may be a JSON client's (a type holding values refused in their JSON
    form) or an Open Inference Protocol v2 row, whose tensors only a second try turns into the
    lists the type asks for (typed workers once refused every v2 request)."""
    if holds(info, lambda node: isinstance(node, msgspec.inspect.RawType)):
        return None
    return Lenient(
        input_type,
        json_form=holds(info, refused_in_json_form),
        text=text_inputs(info),
        arrays=any_inputs(info),
    )


# Types whose JSON form is a string: a v2 client's text reaches them as BYTES.
_TEXT = (
    msgspec.inspect.StrType,
    msgspec.inspect.DateTimeType,
    msgspec.inspect.DateType,
    msgspec.inspect.TimeType,
    msgspec.inspect.TimeDeltaType,
    msgspec.inspect.UUIDType,
    msgspec.inspect.DecimalType,
)


def _is_text(node: msgspec.inspect.Type) -> bool:
    """A type a string is (or may be) in its JSON form: ``str``, a datetime, a UUID, a Decimal,
    a ``Literal`` or an ``Enum`` of strings."""
    if isinstance(node, msgspec.inspect.LiteralType):
        return any(isinstance(value, str) for value in node.values)
    if isinstance(node, msgspec.inspect.EnumType):
        return any(isinstance(member.value, str) for member in node.cls)
    return isinstance(node, _TEXT)


def text_inputs(info: msgspec.inspect.Type) -> Callable[[Any], bool]:
    """Which of a v2 row's inputs (the keys of its map) ``input_type`` (``info``) takes as text:
    the fields that hold text (:func:`_is_text`) and no bytes, of the type or of any member of
    a union (``Optional[Row]``). A v2 client sends text as ``BYTES``, its only string type; such
    a field refused it ("Expected `str`, got `bytes`") though a native client's text went in,
    while a field of bytes must keep its elements as they came."""

    def wants_text(node: msgspec.inspect.Type) -> bool:
        return holds(node, _is_text) and not holds(node, lambda n: isinstance(n, _BYTES))

    members = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
    text: set[str] = set()
    other: set[str] = set()  # a field that is no text in some member: bytes there, say
    for member in members:
        fields = getattr(member, "fields", None)  # Structs, dataclasses, TypedDicts
        if isinstance(fields, tuple):
            for field in fields:
                (text if wants_text(field.type) else other).add(field.encode_name)
            # A tagged Struct's tag (a union's must have one) is text too, and no field.
            if isinstance(getattr(member, "tag", None), str):
                text.add(member.tag_field)
        elif isinstance(member, msgspec.inspect.DictType) and wants_text(member.value_type):
            return lambda _: True
    # Where members disagree, as the rows came: a `bytes` field's base64-looking text would
    # otherwise be decoded, silently.
    return frozenset(text - other).__contains__


def any_inputs(info: msgspec.inspect.Type) -> Callable[[Any], bool]:
    """Which of a v2 row's inputs (the keys of its map) ``input_type`` (``info``) types
    ``typing.Any``, in every member of a union that has it: those keep their tensor as it
    arrives (a numpy array), as the one-pass decoder gives them. Turned into lists with the
    rest on the second try, an ``Any`` field's value was an array or a list depending on its
    sibling fields (a list beside a ``list[float]`` field)."""
    members = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
    anything: set[str] = set()
    other: set[str] = set()
    for member in members:
        fields = getattr(member, "fields", None)  # Structs, dataclasses, TypedDicts
        if isinstance(fields, tuple):
            for field in fields:
                is_any = isinstance(field.type, msgspec.inspect.AnyType)
                (anything if is_any else other).add(field.encode_name)
    return frozenset(anything - other).__contains__


class Lenient:
    """The second try at a payload the one-pass decoder of ``input_type`` refused: decoded as
    any msgpack value, its tensor values as nested lists, then converted to ``input_type`` from
    its JSON form. Only a payload that may be worth it is tried: one with a tensor value, or any
    where the type holds values refused in their JSON form (``json_form``)."""

    def __init__(
        self,
        input_type: Any,
        json_form: bool,
        text: Callable[[Any], bool],
        arrays: Callable[[Any], bool],
    ) -> None:
        self.type = input_type
        self.json_form = json_form
        self.text = text
        self.arrays = arrays

    def decode(self, payload: bytes | memoryview, refused: msgspec.ValidationError) -> Any:
        """The payload as ``input_type``, or :class:`ValidationError` with msgspec's message
        about its JSON form (an invalid base64 string, say, rather than "expected bytes"); the
        first decoder's (``refused``) where a second try could change nothing."""
        found: list[_Found] = []

        def ext_hook(code: int, data: Any) -> Any:
            value = _tensors.ext_hook(code, data)
            if code != _tensors.EXT_TENSOR:
                return value
            tensor = _Found(value)
            found.append(tensor)
            return tensor

        try:
            # A decoder per try: its hook counts this payload's tensors (refused payloads only).
            value = msgspec.msgpack.Decoder(Any, ext_hook=ext_hook).decode(payload)
        except msgspec.DecodeError as e:  # malformed past where the typed decoder stopped
            raise ValidationError(f"the payload is not valid msgpack: {e}") from e
        if not found and not self.json_form:
            raise ValidationError(str(refused)) from refused
        taken = 0
        if found and isinstance(value, dict):
            # A v2 row: each input as its field wants it (`_input`). Marked by a
            # wrapper, not found by the id of its lists: a scalar tensor's value is a cached
            # small int, which another input equal to it shares.
            row = {}
            for key, item in value.items():
                if type(item) is _Found:
                    taken += 1
                    item = self._input(key, item)
                row[key] = item
            value = row
        if taken < len(found):
            value = _as_lists(value)  # tensors deeper in: their lists
        try:
            # str_keys: a JSON object's keys are strings, whatever the type's are.
            return msgspec.convert(value, self.type, str_keys=True)
        except msgspec.ValidationError as e:
            raise ValidationError(str(e)) from e

    def _input(self, key: Any, tensor: _Found) -> Any:
        """A v2 row's input as its field wants it: as it came where the field is ``Any``
        (:func:`any_inputs`), a BYTES tensor's elements as text where it takes text
        (:func:`text_inputs`), else its nested lists."""
        if self.arrays(key):
            return tensor.value
        listed = tensor.listed()
        if tensor.holds_bytes() and self.text(key):
            return _as_text(listed)
        return listed


class _Found:
    """A tensor value the second try decoded, until it is known what its place wants."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value  # a numpy array, or nested lists without numpy

    def listed(self) -> Any:
        return self.value.tolist() if hasattr(self.value, "tolist") else self.value

    def holds_bytes(self) -> bool:
        """A BYTES tensor: numpy's are an object array; without numpy, nested lists of bytes."""
        if hasattr(self.value, "dtype"):
            return self.value.dtype.kind == "O"
        return _holds_bytes(self.value)


def _as_lists(value: Any) -> Any:
    """``value`` with each tensor inside it as its nested lists."""
    if type(value) is _Found:
        return value.listed()
    if isinstance(value, list):
        return [_as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_lists(item) for key, item in value.items()}
    return value


def _holds_bytes(listed: Any) -> bool:
    """Whether nested lists' first element is bytes (a BYTES tensor decoded without numpy)."""
    while isinstance(listed, list) and listed:
        listed = listed[0]
    return isinstance(listed, bytes)


def _as_text(listed: Any) -> Any:
    """A BYTES tensor's nested lists with each element that is UTF-8 as a ``str``."""
    if isinstance(listed, list):
        return [_as_text(item) for item in listed]
    if isinstance(listed, bytes):
        try:
            return listed.decode()
        except UnicodeDecodeError:
            return listed
    return listed


def to_json_form(output: Any, enc_hook: Callable[[Any], Any]) -> Any:
    """``output`` as the builtin values of its JSON form, but for the msgpack extensions the
    worker means to send as they are (tensor values, a client's own ext) and ``Raw`` values,
    which msgpack writes unchanged."""
    return msgspec.to_builtins(
        output, builtin_types=(msgspec.msgpack.Ext, msgspec.Raw), enc_hook=enc_hook
    )
