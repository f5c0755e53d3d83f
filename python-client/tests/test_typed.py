"""Typed workers: requests validated by msgspec straight from msgpack, 422 with the path of the
bad field for that item alone, the schemas sent in the hello, and the values whose JSON form (what
those schemas describe) msgpack writes otherwise."""

from __future__ import annotations

import datetime
import json
import re
import uuid
from typing import Annotated, Any, Literal, Optional, Union

import jsonschema
import msgspec
import pytest

import corral
from corral import _typing
from corral.testing import FakeProxy, Result, tensor


class Point(msgspec.Struct):
    x: float
    y: float


class StrictPoint(msgspec.Struct, forbid_unknown_fields=True):
    x: float
    y: float


class Norm(msgspec.Struct):
    norm: float


class Length(corral.Worker):
    input_type = Point
    output_type = Norm

    def forward(self, batch):
        return [Norm(norm=(p.x**2 + p.y**2) ** 0.5) for p in batch]


class StrictLength(Length):
    input_type = StrictPoint


def test_valid_items_are_decoded_into_the_declared_type():
    with FakeProxy(Length()) as proxy:
        got = proxy.infer([{"x": 3, "y": 4}, {"x": 0.0, "y": 1.5}])
    assert got == [Result("ok", value={"norm": 5.0}), Result("ok", value={"norm": 1.5})]


def test_wrong_type_and_missing_field_are_422_with_their_path():
    with FakeProxy(Length()) as proxy:
        wrong, missing, fine = proxy.infer([{"x": "three", "y": 4}, {"x": 1}, {"x": 0, "y": 2}])
    assert wrong.status == "invalid" and "$.x" in wrong.message and "float" in wrong.message
    assert missing.status == "invalid" and "`y`" in missing.message
    assert fine == Result("ok", value={"norm": 2.0})


def test_extra_fields_follow_the_struct_s_own_rule():
    item = {"x": 3, "y": 4, "z": 12}
    with FakeProxy(Length()) as proxy:
        assert proxy.infer([item]) == [Result("ok", value={"norm": 5.0})]
    with FakeProxy(StrictLength()) as proxy:
        (strict,) = proxy.infer([item])
    assert strict.status == "invalid" and "z" in strict.message


def test_the_hello_carries_json_schemas():
    with FakeProxy(Length()) as proxy:
        hello = proxy.hello
    assert json.loads(hello["input_schema"]) == {"$ref": "#/components/schemas/Point"}
    assert json.loads(hello["output_schema"]) == {"$ref": "#/components/schemas/Norm"}
    components = json.loads(hello["schema_components"])
    assert components["Point"]["required"] == ["x", "y"]
    assert components["Norm"]["properties"]["norm"] == {"type": "number"}


def test_an_output_of_bytes_as_a_whole_is_documented_as_clients_get_it():
    """Bytes as a whole are the raw answer, which a JSON client gets as an array of byte values
    (a msgpack `bin`): the hello had said msgspec's base64 string, which no client got."""

    class Reverse(corral.Worker):
        input_type = bytes
        output_type = bytes

        def forward(self, batch):
            return [data[::-1] for data in batch]

    with FakeProxy(Reverse()) as proxy:
        hello = proxy.hello
        (answer,) = proxy.infer([b"\x00\x01\xff"])
    schema = json.loads(hello["output_schema"])
    assert answer == Result("ok", value=b"\xff\x01\x00")
    jsonschema.validate(list(answer.value), schema)  # what the proxy writes a JSON client
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("/wEA", schema)
    assert json.loads(hello["input_schema"])["contentEncoding"] == "base64"  # sent so, it is


def test_an_untyped_worker_sends_no_schemas():
    class Plain(corral.Worker):
        def forward(self, batch):
            return batch

    with FakeProxy(Plain()) as proxy:
        assert "input_schema" not in proxy.hello


def test_an_ext_value_comes_back_as_sent_from_a_worker_with_only_an_output_type():
    """Decoded by msgpack (no input_type), an ext was a namedtuple that msgspec (output_type)
    wrote back as an array: `[5, b"hi"]`, another value than the client's."""
    from typing import Any

    import msgpack

    class Echo(corral.Worker):
        output_type = Any

        def forward(self, batch):
            return batch

    ext = msgpack.ExtType(5, b"hi")
    with FakeProxy(Echo()) as proxy:
        [answer] = proxy.infer([{"v": ext}])
    assert answer == Result("ok", {"v": ext})


class Opaque:
    """A class of the worker's own, which msgspec decodes only with a `dec_hook`."""


class Image(msgspec.Struct):
    name: str
    pixels: list[Opaque]


class Tree(msgspec.Struct):  # recursive, and nothing but what msgspec reads
    value: float
    children: list[Tree] = []


def test_a_typed_worker_s_examples_may_be_instances_of_its_types():
    """Packed plain, a Struct as an example failed the warm-up ("cannot encode Tree as msgpack:
    return str, int, ...", advice about outputs), though msgspec writes it."""

    class Summing(corral.Worker):
        input_type = Tree
        examples = (Tree(1.0, [Tree(2.0)]), {"value": 3.0})

        def forward(self, batch):
            return [tree.value + sum(child.value for child in tree.children) for tree in batch]

    Summing().warm_up()


def test_an_input_type_holding_a_type_msgspec_needs_a_hook_for_fails_where_it_is_defined():
    """msgspec takes any class as one to decode with a `dec_hook`, and the package passes none:
    a Struct holding a numpy array (or a pydantic model as the input_type) was defined, said
    ready, and answered every request 422, blaming the client's input."""
    annotated = Annotated[Opaque, msgspec.Meta(description="pixels")]
    for declared in (Image, dict[str, Opaque], Optional[Opaque], list[annotated]):
        with pytest.raises(TypeError, match=r"input_type holds Opaque.*preprocess"):

            class Hooked(corral.Worker):
                input_type = declared

                def forward(self, batch):
                    return batch

    class Fine(corral.Worker):
        input_type = Tree

        def forward(self, batch):
            return batch

    with FakeProxy(Fine()) as proxy:
        (got,) = proxy.infer([{"value": 1.0, "children": [{"value": 2.0}]}])
    assert got.status == "ok"


def test_an_input_type_msgspec_cannot_decode_fails_where_the_class_is_defined():
    """It once said hello (ready), then died at every batch and was restarted for ever; then it
    died at every connection with msgspec's message, which named no ``input_type``."""

    class A(msgspec.Struct):
        x: int

    class B(msgspec.Struct):
        y: int

    import pytest

    with pytest.raises(TypeError, match=r"Untagged\.input_type cannot be decoded into.*tagged"):

        class Untagged(corral.Worker):
            input_type = A | B

            def forward(self, batch):
                return batch

    class Later(corral.Worker):
        def forward(self, batch):
            return batch

    # Set after the class was made (past the class check): still refused before the hello.
    Later.input_type = A | B
    import socket

    proxy, worker = socket.socketpair()
    with proxy, worker:
        with pytest.raises(TypeError, match="Struct"):
            Later().serve(worker)
        proxy.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing was said: no hello went out
            proxy.recv(1)


@pytest.mark.parametrize(
    ("name", "declared", "said"),
    [
        ("input_type", "Point", "the str 'Point'"),
        ("output_type", "Norm", "the str 'Norm'"),
        ("input_type", (int, str), "the tuple"),
        ("output_type", Norm(1.0), "the Norm"),
    ],
)
def test_a_declared_type_that_is_no_type_fails_where_the_class_is_defined(name, declared, said):
    """A string naming the type only logged a warning and dropped every schema (output), or
    failed at every connection with msgspec's message (input)."""
    with pytest.raises(TypeError, match=rf"Bad\.{name} must be a type .*not {re.escape(said)}"):
        type("Bad", (corral.Worker,), {name: declared, "forward": lambda self, batch: batch})


# -- values whose JSON form msgpack writes otherwise (bytes, aware datetimes, number keys) -------

PLUS_TWO = datetime.timezone(datetime.timedelta(hours=2))
AWARE = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=PLUS_TWO)


class Stamp(msgspec.Struct):
    aware: datetime.datetime
    naive: datetime.datetime
    data: bytes
    tags: dict[str, bytearray]


class Stamper(corral.Worker):
    output_type = Stamp

    def forward(self, batch):
        naive = AWARE.replace(tzinfo=None)
        return [Stamp(AWARE, naive, b"\x00\xff", {"t": bytearray(b"!")}) for _ in batch]


def test_an_output_type_s_datetimes_and_bytes_go_out_as_the_strings_its_schema_says():
    """Written by msgpack, an aware datetime was its timestamp extension (a JSON client got 500
    unrepresentable_output) and bytes a bin (an array of numbers in JSON), where the schema
    says string; a msgpack client gets the schema's strings too."""
    with FakeProxy(Stamper()) as proxy:
        (result,) = proxy.infer([None])
        components = json.loads(proxy.hello["schema_components"])
    assert result == Result(
        "ok",
        {
            "aware": "2024-05-06T07:08:09+02:00",
            "naive": "2024-05-06T07:08:09",
            "data": "AP8=",
            "tags": {"t": "IQ=="},
        },
    )
    fields = components["Stamp"]["properties"]
    assert fields["aware"]["type"] == "string"
    assert fields["data"] == {"type": "string", "contentEncoding": "base64"}


def test_a_streamed_chunk_is_written_as_its_schema_says_too():
    class Ticks(corral.Worker):
        output_type = datetime.datetime

        def forward(self, batch):
            yield [AWARE] * len(batch)

    with FakeProxy(Ticks()) as proxy:
        (stream,) = proxy.stream([None])
    assert stream.chunks == ["2024-05-06T07:08:09+02:00"] and stream.status == "end"


def test_an_output_that_is_bytes_as_a_whole_is_still_the_raw_answer():
    class Thumbnail(corral.Worker):
        output_type = Union[bytes, Norm]
        output_content_type = "image/png"

        def forward(self, batch):
            return [b"\x89PNG", Norm(1.0)]

    with FakeProxy(Thumbnail()) as proxy:
        raw, norm = proxy.infer([None, None])
    assert raw == Result("ok", b"\x89PNG", content_type="image/png")
    assert norm == Result("ok", {"norm": 1.0})


class Blob(msgspec.Struct):
    data: bytes
    more: list[bytearray] = []


class BlobSize(corral.Worker):
    input_type = Blob
    examples = ({"data": "AP8="},)  # as a JSON client sends it

    def forward(self, batch):
        return [len(blob.data) + sum(map(len, blob.more)) for blob in batch]


def test_a_base64_string_is_taken_where_the_input_type_has_bytes():
    """The schema says base64 string, and a JSON client's string reaches the worker as a msgpack
    str: msgspec's msgpack decoder wanted a bin (422), which a msgpack client may still send."""
    worker = BlobSize()
    worker.warm_up()
    items = [
        {"data": "AP8=", "more": ["YWI="]},
        {"data": b"\x00\xff", "more": [b"ab"]},
        {"data": "not base64!"},
        {"data": 7},
    ]
    with FakeProxy(worker) as proxy:
        as_json, as_msgpack, not_base64, wrong = proxy.infer(items)
    assert as_json == as_msgpack == Result("ok", 4)
    assert not_base64.status == "invalid" and "base64" in not_base64.message
    assert "$.data" in not_base64.message
    assert wrong.status == "invalid" and "Expected `bytes`, got `int`" in wrong.message


def test_a_json_object_s_string_keys_are_taken_where_the_input_type_has_number_keys():
    class Counts(corral.Worker):
        input_type = dict[int, str]

        def forward(self, batch):
            return [sorted(counts) for counts in batch]

    with FakeProxy(Counts()) as proxy:
        as_json, as_msgpack, wrong = proxy.infer([{"20": "b", "1": "a"}, {3: "c"}, {"x": "d"}])
    assert as_json == Result("ok", [1, 20]) and as_msgpack == Result("ok", [3])
    assert wrong.status == "invalid" and "int" in wrong.message


@pytest.mark.parametrize(
    "output_type, converted",
    [
        (Norm, False),
        (list[float], False),
        (dict[int, str], False),  # the proxy writes number keys as JSON strings itself
        (Annotated[datetime.datetime, msgspec.Meta(tz=False)], False),  # naive: a str already
        (datetime.date, False),
        (datetime.datetime, True),
        (bytes, True),
        (Stamp, True),
        (Any, True),  # whatever it holds
        (object, True),  # a custom type to msgspec: what its enc_hook makes of it
        (dict, True),
        (Optional[list[Stamp]], True),
    ],
)
def test_outputs_are_converted_only_where_msgpack_may_write_them_otherwise(output_type, converted):
    # The conversion (msgspec.to_builtins) builds every output again: not for types it cannot
    # change, such as the usual Struct of numbers and strings.
    assert _typing._may_differ(output_type) is converted


class BlobAndRaw(msgspec.Struct):
    data: bytes
    raw: msgspec.Raw  # only the one-pass decoder makes a Raw: a second try could take nothing


@pytest.mark.parametrize(
    "input_type, json_form",
    [
        (Point, False),
        (dict[str, float], False),
        (Blob, True),
        (dict[int, str], True),
        (BlobAndRaw, None),
    ],
)
def test_only_input_types_with_such_values_get_a_second_try(input_type, json_form):
    """Every type but one holding a Raw gets a second try (for a v2 row's tensors); only those
    with values refused in their JSON form get it for a payload without tensors."""

    class Typed(corral.Worker):
        def forward(self, batch):
            return batch

    Typed.input_type = input_type
    lenient = _typing.codec(Typed).lenient
    assert (None if lenient is None else lenient.json_form) is json_form


def test_a_longdouble_output_fails_its_item_with_a_reason():
    """numpy's longdouble is its own tolist(): msgspec called the hook again and again, and the
    item failed with a RecursionError."""
    np = pytest.importorskip("numpy")
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("longdouble is a float64 here")

    class Wide(corral.Worker):
        output_type = float

        def forward(self, batch):
            return [np.longdouble(x) for x in batch]

    with FakeProxy(Wide()) as proxy:
        (result,) = proxy.infer([1.5])
    assert result.status == "error"
    assert "cannot encode longdouble" in result.message, result.message
    assert "astype(numpy.float64)" in result.message, "what to do instead"


class Row(msgspec.Struct):
    values: list[float]
    labels: list[bytes] = []


class RowNorm(corral.Worker):
    input_type = Row

    def forward(self, batch):
        return [
            {"norm": sum(v * v for v in item.values) ** 0.5, "labels": item.labels}
            for item in batch
        ]


def test_an_open_inference_protocol_v2_row_is_taken_as_lists_by_a_typed_worker():
    """A v2 client's row arrives as tensor values (msgpack ext 1), which msgspec's typed decoder
    refuses where the type has lists: every v2 request to a typed worker was a 422."""
    rows = [
        {"values": tensor([3.0, 4.0], "FP32")},
        {"values": tensor([1.0], "FP64"), "labels": tensor([b"a", b"bc"], "BYTES")},
        {"values": tensor([b"x"], "BYTES")},  # no number: the type's own message
    ]
    with FakeProxy(RowNorm()) as proxy:
        five, one, wrong = proxy.infer(rows)
    assert five == Result("ok", value={"norm": 5.0, "labels": []})
    assert one == Result("ok", value={"norm": 1.0, "labels": [b"a", b"bc"]})
    assert wrong.status == "invalid" and "$.values[0]" in wrong.message


class Texts(msgspec.Struct):
    text: list[str]
    raw: list[bytes] = []


class Shout(corral.Worker):
    input_type = Texts

    def forward(self, batch):
        return [{"upper": [t.upper() for t in item.text], "raw": item.raw} for item in batch]


def test_a_v2_bytes_tensor_reaches_a_field_of_str_as_text_and_one_of_bytes_as_bytes():
    """A v2 client sends text as BYTES, its only string type: a typed worker's `list[str]`
    field refused it (422 "Expected `str`, got `bytes`") though native clients' text went in.
    A field of bytes keeps its elements as bytes, even where they are UTF-8."""
    rows = [
        {"text": tensor([b"hello", b"w\xc3\xb6rld"], "BYTES")},
        {"text": tensor([b"a"], "BYTES"), "raw": tensor([b"YQ==", b"\xff"], "BYTES")},
        {"text": tensor([b"\xff"], "BYTES")},  # no UTF-8: the first reading's message
    ]
    with FakeProxy(Shout()) as proxy:
        hello, raw, wrong = proxy.infer(rows)
    assert hello == Result("ok", value={"upper": ["HELLO", "WÖRLD"], "raw": []})
    assert raw == Result("ok", value={"upper": ["A"], "raw": [b"YQ==", b"\xff"]})
    assert wrong.status == "invalid"
    assert wrong.message == "Expected `str`, got `bytes` - at `$.text[0]`"


class Kinds(msgspec.Struct):
    kind: list[Literal["a", "b"]] = []
    at: list[datetime.datetime] = []
    id: list[uuid.UUID] = []


class Kinded(corral.Worker):
    input_type = Optional[Kinds]

    def forward(self, batch):
        return [[row.kind, [a.isoformat() for a in row.at], [str(i) for i in row.id]]
                for row in batch]  # fmt: skip


def test_a_v2_bytes_tensor_reaches_any_field_whose_json_form_is_text():
    """A Literal of strings, a datetime, a UUID: each is text in JSON, and a v2 client's text
    (BYTES) was refused there ("Expected `datetime`, got `bytes`"; 16 bytes of text would have
    been read as a UUID's raw bytes), in a type under a union (`Optional`) too."""
    at, id_ = b"2024-05-06T07:08:09+02:00", b"12345678-1234-5678-1234-567812345678"
    row = {"kind": tensor([b"a"], "BYTES"), "at": tensor([at], "BYTES"),
           "id": tensor([id_], "BYTES")}  # fmt: skip
    with FakeProxy(Kinded()) as proxy:
        (answer,) = proxy.infer([row])
    assert answer == Result("ok", value=[["a"], [at.decode()], [id_.decode()]]), answer


class Said(msgspec.Struct, tag="said"):
    text: list[str]


class Sent(msgspec.Struct, tag="sent"):
    text: list[bytes]
    n: list[int]


class Tagged(corral.Worker):
    input_type = Union[Said, Sent]

    def forward(self, batch):
        return [[type(row).__name__, row.text] for row in batch]


def test_a_v2_union_s_tag_is_text_and_a_field_its_members_disagree_on_comes_as_sent():
    # A tagged union's tag (a scalar BYTES) was refused ("Expected `str`, got `bytes` - at
    # `$.type`"): no v2 request reached such a worker. `text` is str in one member and bytes
    # in the other: as it came, or "aGk=" would have been base64-decoded for `Sent`.
    rows = [{"type": tensor(b"sent", "BYTES"), "text": tensor([b"aGk="], "BYTES"),
             "n": tensor([1], "INT64")}]  # fmt: skip
    with FakeProxy(Tagged()) as proxy:
        (sent,) = proxy.infer(rows)
    assert sent == Result("ok", value=["Sent", [b"aGk="]]), sent


def test_a_refused_payload_without_tensors_keeps_the_first_message():
    with FakeProxy(RowNorm()) as proxy:
        (refused,) = proxy.infer([{"values": "three"}])
    assert refused.status == "invalid"
    assert refused.message == "Expected `array`, got `str` - at `$.values`"
