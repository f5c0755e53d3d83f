"""What a :class:`~corral.Worker` subclass declares, checked where the class is defined: a
mistake there (an ``async`` hook, a type that is no type, ``examples`` without its comma) raises
at once, naming the attribute, rather than in a worker that says ready and then fails every
batch, or dies at every connection with a message that names none of it. What an instance may
set or change (``stage``, ``max_running``, a ``weight`` set after the class statement) is
checked again by :func:`check_instance`, before the worker warms up."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from corral import _json_form, _streaming, _tensors, _typing


def check(cls: Any) -> None:
    """Raises ``TypeError`` naming the first bad declaration of the Worker subclass ``cls``."""
    _tensors.declared(cls, "inputs")
    _tensors.declared(cls, "outputs")
    # The outer callable only: a sync wrapper around an async def (asyncio.run) is fine.
    forward = cls.forward
    if inspect.iscoroutinefunction(forward) or inspect.isasyncgenfunction(forward):
        raise TypeError(
            f"{cls.__name__}.forward is async: it must be a plain function (one output per "
            "input) or a generator (to stream); run a coroutine from it with asyncio.run"
        )
    for name in ("preprocess", "postprocess"):
        # Called per item and never awaited: each item would be a coroutine, and fail.
        hook = getattr(cls, name)
        if inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook):
            raise TypeError(
                f"{cls.__name__}.{name} is async: hooks are plain functions (run a coroutine "
                "from one with asyncio.run)"
            )
    _examples(cls)
    _types(cls)
    # Else a streaming worker died before its hello, at every restart. Read as declared: a
    # property (set once the model is loaded, say) is read at the hello, as before; a plain
    # worker's is only warned of when it serves.
    declared = inspect.getattr_static(cls, "max_running", None)
    if _streaming.is_streaming(cls) and not hasattr(declared, "__get__"):
        try:
            _streaming.limit(cls)
        except TypeError as error:
            raise TypeError(f"{cls.__name__}.{error}") from None
    _weight(cls)
    # None: given where it runs (`run(stage=...)`, --stage, CORRAL_STAGE), checked then. A
    # property could not be given it: Corral sets CORRAL_STAGE for every worker it spawns, and
    # `run` failed on a property it could not set (an AttributeError naming nothing of Corral's).
    stage = inspect.getattr_static(cls, "stage", "default")
    if hasattr(stage, "__get__"):
        raise TypeError(
            f"{cls.__name__}.stage must be a str class attribute (or None), not a property: "
            "run(stage=...), --stage and CORRAL_STAGE set it where the worker runs"
        )
    if stage is not None:
        _stage(cls.__name__, stage)
    _typing.output_content_type(cls)


# Declarations read from the class wherever the worker runs (the codec, the hello, the tensors'
# encoding, the weight). Set on an instance, in __init__ say, `input_type` was advertised in
# /openapi.json and enforced nowhere. Only a value that is such a declaration is refused: these
# are common names for a model's own data (`self.weight = load_params()`, `self.outputs = []`).
def _is_tensors(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(t, _tensors.Tensor) for t in value)
    )


def _is_type(value: Any) -> bool:
    return isinstance(value, type) or typing.get_origin(value) is not None


_DECLARATIONS = {
    "input_type": _is_type,
    "output_type": _is_type,
    "inputs": _is_tensors,
    "outputs": _is_tensors,
    "output_content_type": lambda value: isinstance(value, str),
    "weight": lambda value: isinstance(value, str),
}


def check_instance(worker: Any) -> None:
    """Raises ``TypeError`` for a declaration set on a worker instance (Corral reads those from
    its class), a missing ``forward``, a ``weight`` or a streaming worker's ``max_running``
    the proxy would refuse, and a ``stage`` (from ``run``, the command line or ``__init__``)
    that names no stage: checked before the worker warms up or says hello."""
    name = type(worker).__name__
    own = getattr(worker, "__dict__", {})
    for attribute, is_declaration in _DECLARATIONS.items():
        if attribute in own and is_declaration(own[attribute]):
            raise TypeError(
                f"{name}.{attribute} is set on the instance (in __init__?): Corral reads it "
                f"from the class; set it as a class attribute, {name}.{attribute} = ..."
            )
    # Not where the class is defined: a base class of the user's own may leave it to its
    # subclasses. A worker run without one had answered every batch 500 for as long as it ran.
    if getattr(type(worker).forward, "unwritten", False) and "forward" not in own:
        raise TypeError(f"{name} has no forward(batch): a Worker must implement it")
    # Again: set after the class statement (from configuration), a weight the proxy refuses
    # had its worker refused at every start, which FakeProxy served.
    _weight(type(worker))
    # And a streaming worker's `max_running`, which `__init__` may set (once its model is
    # loaded): read first at serving, a bad one failed past the warm-up, its traceback in lines.
    if _streaming.is_streaming(worker):
        _streaming.limit(worker)
    _stage(name, worker.stage)


def _weight(cls: type) -> None:
    if cls.weight is not None and not _is_pointer(cls.weight):
        raise TypeError(
            f'{cls.__name__}.weight must be a JSON Pointer such as "/text" (a string that '
            f"is empty or starts with /, a ~ in it written ~0 and a / ~1), not {cls.weight!r}"
        )


def _stage(name: str, stage: Any) -> None:
    if not isinstance(stage, str) or not stage:
        raise TypeError(f"{name}.stage must be a stage's name (a non-empty str), not {stage!r}")


def _is_pointer(weight: Any) -> bool:
    """RFC 6901, as the proxy reads it: empty, or ``/`` then tokens in which ``~`` is only
    ``~0`` or ``~1`` (the proxy refused "/a~2" at every connection)."""
    if not isinstance(weight, str):
        return False
    if not weight:
        return True
    return weight.startswith("/") and all(
        after.startswith(("0", "1")) for after in weight.split("~")[1:]
    )


def _examples(cls: type) -> None:
    """``examples`` is a collection of requests: a string (a tuple's missing comma) or a
    mapping would warm up on its characters or keys. ``None`` is none, and a property (examples
    loaded when the worker is made) is read then."""
    examples = inspect.getattr_static(cls, "examples")
    if examples is None or hasattr(examples, "__get__"):
        return
    if isinstance(examples, (str, bytes, bytearray, Mapping)) or not isinstance(
        examples, Collection
    ):
        raise TypeError(
            f"{cls.__name__}.examples must be a tuple or list of requests, not a "
            f"{type(examples).__name__} (one example: ({examples!r:.60},) with its comma)"
        )


def _types(cls: type) -> None:
    """``input_type`` is one msgspec decodes into, and ``output_type`` no plain mistake (a
    string naming a type, an instance, a tuple of types): where the class is defined, not in a
    worker that dies at every connection, its error naming neither."""
    for name in ("input_type", "output_type"):
        declared = getattr(cls, name)
        if declared is None:
            continue
        if isinstance(declared, (str, tuple, list, dict, msgspec.Struct)):
            raise TypeError(
                f"{cls.__name__}.{name} must be a type (a msgspec.Struct class, list[float], "
                f"...), not the {type(declared).__name__} {declared!r:.60}"
            )
    # Never written as a map (an array, a str, a float), its results were ok natively and in
    # FakeProxy, and a 500 for every v2 and KServe v1 client, which read a result as a map of the
    # outputs; read as one, every row of theirs (a map of the inputs) was a 422 blaming the
    # client ("Expected `array`, got `object`").
    _map_of_tensors(cls, "output_type", "outputs", "answers")
    _map_of_tensors(cls, "input_type", "inputs", "takes")
    if cls.input_type is not None:  # type: ignore[attr-defined]
        try:
            msgspec.msgpack.Decoder(cls.input_type)  # type: ignore[attr-defined]
        except TypeError as e:
            raise TypeError(f"{cls.__name__}.input_type cannot be decoded into: {e}") from None
        custom = _custom_type(msgspec.inspect.type_info(cls.input_type))  # type: ignore[attr-defined]
        if custom is not None:
            # msgspec takes any class as a type of its own to decode with a `dec_hook`, and the
            # package passes none: every request was then a 422 blaming the client's input.
            raise TypeError(
                f"{cls.__name__}.input_type holds {custom.__qualname__}, a type msgspec decodes "
                "only with a hook of the worker's own: declare it of types msgspec reads "
                "(msgspec.Struct, dataclasses, list[float], dict[str, int], ...), or leave "
                "input_type out and convert the payload in preprocess"
            )


def _map_of_tensors(cls: type, name: str, tensors: str, does: str) -> None:
    """Raises ``TypeError`` when ``cls`` declares ``tensors`` and its ``name`` (``input_type``
    or ``output_type``) is a type msgspec never writes as a map, saying what to declare."""
    declared = getattr(cls, name)
    if not (_tensors.declared(cls, tensors) and _never_a_map(declared)):
        return
    if _typing.array_like(declared):
        raise TypeError(
            f"{cls.__name__}.{name} {declared.__name__} is array_like: a worker that "
            f"declares {tensors} {does} a map of them (drop array_like=True)"
        )
    shown = declared.__name__ if isinstance(declared, type) else repr(declared)
    written = (
        "is written as an array" if _written_as_array(declared) else "is never written as a map"
    )
    raise TypeError(
        f"{cls.__name__}.{name} {shown} {written}: a worker that declares {tensors} {does} a "
        "map of them (a msgspec.Struct, a dataclass or a TypedDict whose fields they are)"
    )


# What msgspec writes and reads as an array (a Struct only when `array_like`).
_ARRAYS = (
    msgspec.inspect.ListType,
    msgspec.inspect.TupleType,
    msgspec.inspect.VarTupleType,
    msgspec.inspect.SetType,
    msgspec.inspect.FrozenSetType,
    msgspec.inspect.NamedTupleType,
)

# What msgspec writes and reads as a single value, never a map (Literal and Enum values are
# strs and ints). Not a CustomType: the package's `enc_hook` may write one as a map, and
# `object` is any value; nor Raw, which is whatever bytes it holds.
_SCALARS = (
    msgspec.inspect.BoolType,
    msgspec.inspect.IntType,
    msgspec.inspect.FloatType,
    msgspec.inspect.StrType,
    msgspec.inspect.BytesType,
    msgspec.inspect.ByteArrayType,
    msgspec.inspect.MemoryViewType,
    msgspec.inspect.DateTimeType,
    msgspec.inspect.TimeType,
    msgspec.inspect.DateType,
    msgspec.inspect.TimeDeltaType,
    msgspec.inspect.UUIDType,
    msgspec.inspect.DecimalType,
    msgspec.inspect.ExtType,
    msgspec.inspect.LiteralType,
    msgspec.inspect.EnumType,
)


def _written_as_array(declared: Any) -> bool:
    """Whether msgspec writes (and reads) every value of ``declared`` but ``None`` as an array:
    a list, tuple, set, NamedTuple or array_like Struct, under ``Annotated`` or in a union of
    such (``Optional[...]`` too: its ``None`` is no map either). A union with a member written
    as a map takes maps; a type msgspec cannot describe is left to the checks that read it."""
    if _typing.array_like(declared):
        return True  # told without reading its fields (one may not be defined yet)
    kinds = _kinds(declared)
    return bool(kinds) and all(_is_array(kind) for kind in kinds)


def _never_a_map(declared: Any) -> bool:
    """Whether msgspec writes (and reads) no value of ``declared`` but ``None`` as a map: each
    is an array (:func:`_written_as_array`) or a scalar (a str, a float, a Literal, an Enum,
    a datetime, ...). Anything that may be a map (a Struct, dataclass, attrs class, TypedDict,
    dict, ``Any``, ``object``, a class the ``enc_hook`` writes) lets the whole union through."""
    if _typing.array_like(declared):
        return True
    kinds = _kinds(declared)
    return bool(kinds) and all(_is_array(kind) or isinstance(kind, _SCALARS) for kind in kinds)


def _is_array(kind: msgspec.inspect.Type) -> bool:
    """Whether msgspec writes a value of this kind (no union, no metadata) as an array."""
    return isinstance(kind, _ARRAYS) or (
        isinstance(kind, msgspec.inspect.StructType) and kind.array_like
    )


def _kinds(declared: Any) -> tuple[msgspec.inspect.Type, ...]:
    """The kinds of value ``declared`` allows but ``None``, each stripped of its ``Annotated``
    metadata; none for a type msgspec cannot describe (a forward reference not yet defined)."""
    try:
        info = msgspec.inspect.type_info(declared)
    except Exception:  # a NameError for an undefined forward reference, a type it cannot read
        # A union msgspec refuses to describe as a whole (`Union[str, bytes]`: more than one
        # str-like type) may still be described member by member; one member not describable
        # leaves the whole alone.
        if typing.get_origin(declared) not in (typing.Union, types.UnionType):
            return ()
        members = [_kinds(m) for m in typing.get_args(declared) if m is not type(None)]
        return () if not all(members) else tuple(k for kinds in members for k in kinds)
    return _members(info)


def _members(info: msgspec.inspect.Type) -> tuple[msgspec.inspect.Type, ...]:
    """A union's members, but ``None``, unwrapped of metadata at every level: the metadata of
    ``Optional[Annotated[Row, Meta(...)]]`` sits inside the union, and hid an array_like Row."""
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    if isinstance(info, msgspec.inspect.UnionType):
        return tuple(kind for member in info.types for kind in _members(member))
    return () if isinstance(info, msgspec.inspect.NoneType) else (info,)


def _custom_type(info: msgspec.inspect.Type) -> type | None:
    """The first type in ``info`` (an ``input_type``'s tree) that msgspec decodes only with a
    ``dec_hook``, if any. (`object` is a custom type to msgspec's inspection, and decodes as any
    value.)"""
    found = _json_form.first(
        info, lambda node: isinstance(node, msgspec.inspect.CustomType) and node.cls is not object
    )
    return found.cls if isinstance(found, msgspec.inspect.CustomType) else None
