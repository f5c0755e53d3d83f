"""Payloads and outputs: each job's payload decoded on its own (plain msgpack, or validated by
msgspec straight into a worker's ``input_type``), each output encoded to msgpack (objects with a
``tolist`` method, such as numpy arrays, converted: ``_fallback``) with the media type of an
output that is bytes, and the JSON Schemas the hello carries.

A raw-bytes request's payload is one msgpack ``bin``: it decodes to ``bytes`` like any other
``bin``, so an untyped worker gets ``bytes``, and a typed one gets them where its ``input_type``
takes ``bytes`` (``bytes``, ``bytes | Item``, …) and a 422 with msgspec's message elsewhere.

A typed worker's values travel in their JSON form where msgpack's would differ (``_json_form``):
a base64 string is taken where its ``input_type`` has bytes, and an ``output_type``'s bytes and
aware datetimes go out as the strings its JSON Schema promises.

Tensor values (msgpack ext type 1) in a payload decode to numpy arrays or nested lists
(``_tensors``); in an output that is a dict, the values under the names of the worker's declared
``outputs`` are encoded as tensor values of the declared datatypes. A native client's payload
for a worker that declares ``inputs`` comes as it was sent (plain lists): with numpy, one naming
every input is read as a v2 row would be (:meth:`Codec.as_inputs`), so that ``forward`` sees
one kind of row.

A payload that does not decode or validate raises :class:`ValidationError` (the job's 422); the
codecs for a worker class are built once and kept.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any

import msgpack
import msgspec

from corral import _json_form, _tensors
from corral import _protocol as protocol
from corral._errors import ProtocolError, ValidationError
from corral._fallback import plain, typed


class Codec:
    """A worker class's payload decoder, output encoder and output media type, built once per
    class (:func:`codec`), so that a batch looks them up once, not once per item: msgspec's
    decoder (for ``input_type``) and encoder, and the datatype of each declared output by name.
    The class's ``input_type``, ``output_type`` and ``output_content_type`` are read then, at
    its first use: they are declarations, not settings to change while serving."""

    def __init__(self, worker: type) -> None:
        input_type = getattr(worker, "input_type", None)
        output_type = getattr(worker, "output_type", None)
        self.decoder = msgspec.msgpack.Decoder(input_type or Any, ext_hook=_tensors.ext_hook)
        self.encoder = msgspec.msgpack.Encoder(enc_hook=typed)
        self.outputs = {t.name: t for t in _tensors.declared(worker, "outputs")}
        self.inputs = {t.name: t for t in _tensors.declared(worker, "inputs")}
        self.plain = input_type is None and output_type is None
        self.typed_input = input_type is not None
        info = msgspec.inspect.type_info(input_type) if self.typed_input else None
        # msgspec decodes `memoryview` and `Raw` values as views of the payload: only then does
        # a payload that is itself a view (of its frame, or of shared memory) need copying first.
        self.views_payload = info is not None and _has_views(info)
        # A JSON client's base64 bytes, say: a second try, for the types that may need one.
        self.lenient = None if info is None else _json_form.lenient(input_type, info)
        self.json_form = output_type is not None and _may_differ(output_type)
        self.output_content_type = output_content_type(worker)

    def decode(self, payload: Any) -> Any:
        """One job's payload, as the worker declares its inputs."""
        # A memoryview: of its batch's frame, or of the proxy's shared memory (`payload_at`).
        if not isinstance(payload, (bytes, memoryview)):
            raise ProtocolError("a job payload must be bytes")
        if not self.typed_input:
            # Outputs encoded by msgspec (an `output_type`) write a msgpack ExtType, a namedtuple,
            # as an array: other ext types then arrive as msgspec's Ext, which it writes back.
            ext_hook = _tensors.ext_hook if self.plain else _tensors.msgspec_ext_hook
            try:
                return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)
            except ValidationError:
                raise  # a tensor value that does not fit its header, with its own message
            except Exception as e:  # msgpack raises several unrelated types for bad input
                raise ValidationError(f"the payload is not valid msgpack: {e}") from e
        if self.views_payload and isinstance(payload, memoryview):
            # From the payload's own bytes the item's views keep that row alive, not the whole
            # frame, and never see shared memory the proxy has reused.
            payload = bytes(payload)
        try:
            return self.decoder.decode(payload)
        except msgspec.ValidationError as e:
            if self.lenient is None:
                raise ValidationError(str(e)) from e
            refused = e
        except msgspec.DecodeError as e:
            raise ValidationError(f"the payload is not valid msgpack: {e}") from e
        # Well-formed, refused by the type: maybe a JSON client's (a base64 string for bytes), or
        # a v2 row (tensor values where the type has lists).
        return self.lenient.decode(payload, refused)

    def reader(self, preprocessed: bool) -> Callable[[Any], Any]:
        """The function reading one job's payload for a batch: :meth:`decode`, and for an
        untyped worker that declares ``inputs``, with numpy, :meth:`as_inputs` after it
        (without numpy a v2 row's tensors are nested lists too: a native one is alike)."""
        if not self.inputs or self.typed_input or _tensors.numpy() is None:
            return self.decode
        return lambda payload: self.as_inputs(self.decode(payload), preprocessed)

    def as_inputs(self, row: Any, preprocessed: bool) -> Any:
        """A decoded payload as the declared inputs, where it names every one. A v2 (or KServe
        v1) client's row comes as tensor values the proxy held to the declarations: numpy
        arrays of their datatypes and shapes already, taken as they are (a look at each one's
        dtype and shape). A native client's comes as sent: each value that is not such an
        array (nested lists, a number, strings for ``BYTES``, another tensor value) is made
        its input's datatype and held to its shape, converted as an output is (booleans and
        whole floats are numbers here, where v2's JSON refuses them), or refused (422) saying
        why; such a worker's ``forward`` had got lists where it reads
        arrays, and a client's wrong shape had been the model's 500. A worker with its own
        ``preprocess`` (``preprocessed``) gets a row that cannot be made so as sent, for the
        hook to read (an image as base64 text, say). A payload that names no input (raw bytes,
        a list, other keys) goes on as sent, for whatever reads it; one that names some but not
        all is refused (422) for a worker without its own ``preprocess``."""
        if not isinstance(row, dict):
            return row
        missing = [name for name in self.inputs if name not in row]
        if missing:
            if preprocessed or len(missing) == len(self.inputs):
                return row
            # Some inputs named, one not (a key mistyped): this item's 422, not a `forward`
            # that fails the whole batch over it.
            names = ", ".join(repr(name) for name in self.inputs)
            raise ValidationError(f"no input {missing[0]!r}: the model takes {names}")
        np = _tensors.numpy()
        made = {}
        for name, tensor in self.inputs.items():
            value = row[name]
            if isinstance(value, np.ndarray) and _tensors.holds(value, tensor):
                continue
            try:
                made[name] = _tensors.decode(_tensor(value, tensor, "input"))
            except (TypeError, ValueError) as e:  # `_tensor`'s, naming the input
                if preprocessed:
                    return row
                raise ValidationError(str(e)) from e
        row.update(made)
        return row

    def example_payload(self, example: Any, preprocessed: bool) -> bytes:
        """An example packed as :meth:`example` packs it; one that cannot be (a declared input's
        value no tensor, base64 text, say) packed as a native client would send it, for a
        worker whose own ``preprocess`` reads it, as it does when served."""
        try:
            return self.example(example)
        # What `as_inputs` passes on as sent when served (a None too).
        except (TypeError, ValueError):
            if not (preprocessed and isinstance(example, dict)):
                raise
            return pack(example) if self.plain else self.encoder.encode(example)

    def example(self, example: Any) -> bytes:
        """An example request (``Worker.examples``) packed as a client's reaches the worker: in
        a dict, each value under a declared input's name as a tensor value of that input's
        datatype, as the proxy sends a v2 client's row (unless it is one already,
        ``corral.testing.tensor``), so that it reaches ``forward`` as a numpy array. Packed
        plain, it had come as nested lists, and a worker written for v2 failed its warm-up. A
        typed worker's is packed by msgspec, which writes its types (a Struct instance as an
        example had failed, with advice about outputs)."""
        if self.inputs and isinstance(example, dict):
            missing = [name for name in self.inputs if name not in example]
            if missing:  # a v2 client's request without it is refused (400)
                raise ValueError(f"the example has no input {missing[0]!r}")
            # msgspec writes a msgpack ExtType (a namedtuple) as an array: its own Ext there.
            ext = msgpack.ExtType if self.plain else msgspec.msgpack.Ext
            example = {key: self._example_value(key, value, ext) for key, value in example.items()}
        return pack(example) if self.plain else self.encoder.encode(example)

    def _example_value(self, key: Any, value: Any, ext: Callable[[int, bytes], Any]) -> Any:
        """An example's value under ``key``: a declared input's as a tensor value."""
        if key not in self.inputs:
            return value
        if isinstance(value, msgpack.ExtType):  # `corral.testing.tensor`: made as the proxy does
            return ext(value.code, value.data)
        return ext(_tensors.EXT_TENSOR, _tensor(value, self.inputs[key], "input"))

    def encode(self, output: Any) -> bytes:
        """One output as msgpack bytes: msgspec for a typed worker (Structs need no conversion),
        plain msgpack otherwise; in a dict, each value under a declared output's name as a
        tensor value of that output's datatype. With an ``output_type``, in its JSON form (but
        an output that is bytes as a whole: the raw answer)."""
        output = self._with_tensors(output)
        if self.plain:
            return pack(output)
        if self.json_form and not isinstance(output, (bytes, bytearray, memoryview)):
            output = _json_form.to_json_form(output, typed)
        return self.encoder.encode(output)

    def batch_encoder(self) -> Callable[[Any], bytes]:
        """:meth:`encode` for the outputs of one batch, on one thread: a plain worker's outputs
        share one msgpack Packer (``packb`` makes one per call, which took 0.3 µs of each item's
        0.9 in a batch's postprocess and encoding)."""
        if not self.plain:
            return self.encode
        packer = msgpack.Packer(use_bin_type=True, default=plain)

        def encode(output: Any) -> bytes:
            # A pack that fails part-way leaves nothing behind for the next (msgpack >= 1.0
            # empties the Packer's buffer on any error).
            return packer.pack(self._with_tensors(output))

        return encode

    def check_result(self, output: Any) -> None:
        """A whole result (not a chunk) of a worker that declares ``outputs``: a dict holding
        each of them, as the proxy reads a v2 or KServe v1 answer. Unchecked, a result that was
        no dict, or lacked one, passed warm-up and FakeProxy and was a 500 for every v2 client."""
        if not self.outputs:
            return
        names = _names(output)
        if names is None:
            written = (
                ", an array_like Struct (written as an array)" if array_like(type(output)) else ""
            )
            raise TypeError(
                "a worker that declares outputs returns a dict from output name to its row "
                f"(or an output_type whose fields they are), not {type(output).__name__}{written}"
            )
        for name in self.outputs:
            if name not in names:
                declared = ", ".join(repr(name) for name in self.outputs)
                raise TypeError(f"output {name!r} is missing from the result ({declared} declared)")

    def _with_tensors(self, output: Any) -> Any:
        """Each value of a result under a declared output's name as a tensor value: in a dict,
        or in an ``output_type``'s Struct or dataclass (a copy, each other field as msgspec
        encodes it). A Struct had gone out as it was, its values neither converted nor held to
        their datatypes and shapes: ok in FakeProxy and natively, a 500 for every v2 client."""
        if not self.outputs:
            return output
        ext = msgpack.ExtType if self.plain else msgspec.msgpack.Ext

        def tensor(name: str, value: Any) -> Any:
            return ext(_tensors.EXT_TENSOR, _tensor(value, self.outputs[name]))

        if isinstance(output, dict):
            return {
                key: tensor(key, value) if key in self.outputs else value
                for key, value in output.items()
            }
        return _with_tensor_fields(output, self.outputs, tensor)

    def content_type(self, output: Any) -> str | None:
        """A result's ``content_type``: the worker's ``output_content_type`` for an output that
        is bytes (encoded as one msgpack ``bin``), None for any other output."""
        named = self.output_content_type
        if named is None or not isinstance(output, (bytes, bytearray, memoryview)):
            return None
        return named


def output_content_type(cls: type) -> str | None:
    """The class's ``output_content_type``, if it is a media type the proxy takes; else
    ``TypeError``: the proxy answers every bytes output under another name 500 ``bad_output``.
    Checked where the class is defined and again when its codec is built, for a class whose
    attribute was set after its definition (from configuration, say)."""
    named = getattr(cls, "output_content_type", None)
    length = len(named.encode("utf-8")) if isinstance(named, str) else 0
    if length > protocol.MAX_MEDIA_TYPE:
        # It may well be one (a long parameter): "must be a media type" misled.
        raise TypeError(
            f"{cls.__name__}.output_content_type is {length} bytes, longer than the "
            f"{protocol.MAX_MEDIA_TYPE} a media type may have: {named!r:.80}"
        )
    if named is not None and (not protocol.is_media_type(named) or protocol.is_range(named)):
        raise TypeError(
            f"{cls.__name__}.output_content_type must be a media type such as "
            f'"image/png" (type/subtype, visible ASCII, not a range), not {named!r:.80}'
        )
    return named


def _has_views(root: msgspec.inspect.Type) -> bool:
    """Whether a value of this type (msgspec's description of it) may hold a ``memoryview`` or
    ``msgspec.Raw``, anywhere inside it (recursive types are walked once)."""
    views = (msgspec.inspect.MemoryViewType, msgspec.inspect.RawType)
    return _json_form.holds(root, lambda node: isinstance(node, views))


def _may_differ(output_type: Any) -> bool:
    """Whether an output of this type may be written otherwise in msgpack than in its JSON form
    (then each is converted first). A type msgspec cannot describe (an untagged union, say,
    which it encodes all the same) is converted."""
    try:
        info = msgspec.inspect.type_info(output_type)
    except (TypeError, ValueError):
        return True
    return _json_form.holds(info, _json_form.differs_in_msgpack)


_CODECS: dict[type, Codec] = {}


def codec(worker: type) -> Codec:
    """The :class:`Codec` of a Worker subclass (built on first use)."""
    found = _CODECS.get(worker)
    if found is None:
        found = _CODECS[worker] = Codec(worker)
    return found


def _names(output: Any) -> Collection[str] | None:
    """The names a result holds as the map it is encoded as: a dict's keys, or the fields of a
    msgspec Struct or a dataclass (an ``output_type``'s, by the names it encodes them under);
    None for anything that is encoded as no map."""
    if isinstance(output, Mapping):
        return output.keys()
    if isinstance(output, msgspec.Struct):
        if array_like(type(output)):
            return None
        # Those set: an unset field is left out of its map (the proxy then answers v2 clients
        # 500 "missing from the worker's result").
        fields = _struct_fields(type(output))
        return [
            name for attribute, name in fields if getattr(output, attribute) is not msgspec.UNSET
        ]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        # As for a Struct: a field never set (`field(init=False)`) is left out of its map.
        return [name for name in _field_names(type(output)) if hasattr(output, name)]
    return None


def array_like(cls: Any) -> bool:
    """Whether ``cls`` is a msgspec Struct type encoded as an array (``array_like=True``)."""
    return (
        isinstance(cls, type)
        and issubclass(cls, msgspec.Struct)
        and bool(cls.__struct_config__.array_like)
    )


def _with_tensor_fields(
    output: Any, outputs: Collection[str], tensor: Callable[[str, Any], Any]
) -> Any:
    """A Struct or dataclass result with the fields named as declared outputs made tensor
    values (``tensor(name, value)``), in a copy: its other fields, a tag, fields left out as
    defaults or unset, go as msgspec writes them. Anything else as it is."""
    if isinstance(output, msgspec.Struct):
        changes = {
            attribute: tensor(name, getattr(output, attribute))
            for attribute, name in _struct_fields(type(output))
            if name in outputs and getattr(output, attribute) is not msgspec.UNSET
        }
        if not changes:
            return output
        # Set on a copy, not by `structs.replace`: that runs the class's `__post_init__` again,
        # on the tensor values (one that checked its fields failed every result). msgspec's own
        # copy, not the class's `__copy__`: a frozen type's may return itself, and a constant
        # result would have been changed for good.
        copied = msgspec.Struct.__copy__(output)
        for attribute, value in changes.items():
            msgspec.structs.force_setattr(copied, attribute, value)
        return copied
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        copied = copy.copy(output)
        for name in _field_names(type(output)):
            # A field never set (`field(init=False)`) has no value to convert.
            if name in outputs and hasattr(output, name):
                object.__setattr__(copied, name, tensor(name, getattr(output, name)))
        return copied
    return output


@functools.cache
def _struct_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """A Struct type's fields as (attribute, the name it is encoded under): once a type."""
    return tuple((field.name, field.encode_name) for field in msgspec.structs.fields(cls))


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    """The names a dataclass type is encoded under: once a type, not once a result."""
    return frozenset(field.name for field in dataclasses.fields(cls))


def _tensor(value: Any, tensor: _tensors.Tensor, kind: str = "output") -> bytes:
    name, datatype = tensor.name, tensor.datatype
    if value is None:  # numpy would make a float NaN of it, and an integer one an odd error
        raise TypeError(f"{kind} {name!r} is None, not a tensor of {datatype}")
    try:
        return _tensors.encode(value, datatype, tensor.shape)
    except TypeError as e:  # the message names the tensor: a result may hold several
        raise TypeError(f"{kind} {name!r} cannot be a tensor of {datatype}: {e}") from e
    # numpy's RuntimeError: a value nested past its 32 dimensions.
    except (ValueError, OverflowError, RuntimeError) as e:
        raise ValueError(f"{kind} {name!r} cannot be a tensor of {datatype}: {e}") from e


def pack(value: Any) -> bytes:
    # One value on its own (an example, a streamed chunk): packb's own Packer. A batch's outputs
    # share one instead (Codec.batch_encoder).
    return msgpack.packb(value, use_bin_type=True, default=plain)


# An output that is bytes as a whole, as a JSON client gets it: the raw answer, which JSON has
# only as a `bin`'s array of byte values (msgspec's schema says a base64 string, which no client
# got: the proxy answered `[0, 1, 2]`, and the array sent back as input was refused).
WHOLE_BYTES = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 255},
    "description": "Bytes: raw (with their media type) to a client that accepts them, a bin in "
    "msgpack, an array of byte values in JSON.",
}


def schemas(input_type: Any, output_type: Any) -> dict[str, str]:
    """The hello's schema keys: JSON Schemas of the declared types (as JSON text, references
    pointing into ``#/components/schemas/``), and those components; empty if none is declared."""
    declared = [t for t in (input_type, output_type) if t is not None]
    if not declared:
        return {}
    template = "#/components/schemas/{name}"
    found, components = msgspec.json.schema_components(declared, ref_template=template)
    found = list(found)
    result = {}
    if input_type is not None:
        result["input_schema"] = msgspec.json.encode(found.pop(0)).decode()
    if output_type is not None:
        output = found.pop(0)
        if output_type in (bytes, bytearray, memoryview):
            output = WHOLE_BYTES  # the raw answer (`encode`), not msgspec's base64 string
        result["output_schema"] = msgspec.json.encode(output).decode()
    result["schema_components"] = msgspec.json.encode(components).decode()
    return result
