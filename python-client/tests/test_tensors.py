"""Open Inference Protocol v2 tensors: declarations in the hello, tensor values (msgpack ext type 1)
decoded to numpy arrays (or nested lists without numpy) for ``forward``, malformed ones answered
422 alone, and declared outputs encoded as tensor values of their declared datatypes."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import struct
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, NewType, Optional, TypedDict, TypeVar, Union

import msgpack
import msgspec
import pytest

import corral
from corral import _protocol as protocol
from corral import _tensors
from corral.testing import FakeProxy, Result, tensor

VECTORS = Path(__file__).resolve().parents[2] / "worker-protocol" / "vectors"

# One row of shape [2, 3] per datatype, each with its extremes, every value exact in its type.
ROWS: dict[str, list[list[Any]]] = {
    "BOOL": [[True, False, True], [False, False, True]],
    "UINT8": [[0, 255, 7], [1, 2, 3]],
    "UINT16": [[0, 65535, 7], [1, 2, 3]],
    "UINT32": [[0, 2**32 - 1, 7], [1, 2, 3]],
    "UINT64": [[0, 2**64 - 1, 7], [1, 2, 3]],
    "INT8": [[-128, 127, 0], [1, -2, 3]],
    "INT16": [[-(2**15), 2**15 - 1, 0], [1, -2, 3]],
    "INT32": [[-(2**31), 2**31 - 1, 0], [1, -2, 3]],
    "INT64": [[-(2**63), 2**63 - 1, 0], [1, -2, 3]],
    "FP16": [[0.5, -2.0, 65504.0], [0.0, 1.0, -0.25]],
    "FP32": [[1.5, -0.25, 2.0**100], [0.0, 1.0, -3.0]],
    "FP64": [[0.1, -1e300, 2.5], [0.0, 1.0, -3.0]],
    "BYTES": [[b"", b"a", b"\x00\xff"], [b"xyz", b"", b"\xc3\xa9"]],
}


@pytest.fixture(params=["numpy", "lists"])
def np(request, monkeypatch):
    """numpy as ``forward`` sees it: the module, or None where the package finds no numpy (its
    lazy import made to fail)."""
    if request.param == "numpy":
        return pytest.importorskip("numpy")
    monkeypatch.setattr(_tensors, "numpy", lambda: None)
    return None


@pytest.fixture
def real_np():
    return pytest.importorskip("numpy")


def plain(value: Any) -> Any:
    """A decoded tensor as nested Python lists, whichever way it was decoded."""
    return value.tolist() if hasattr(value, "tolist") else value


def ext(datatype: Any, shape: Any, data: Any) -> msgpack.ExtType:
    """A tensor value written by hand, to be as wrong as a test needs."""
    return msgpack.ExtType(1, msgpack.packb([datatype, shape, data]))


def echo(datatype: str, shape: list[int]) -> corral.Worker:
    """A worker that declares IN and OUT of ``datatype`` and answers each row with itself, keeping
    what ``forward`` got in ``seen``."""

    class Echo(corral.Worker):
        inputs = (corral.Tensor("IN", datatype, shape),)
        outputs = (corral.Tensor("OUT", datatype, shape),)
        seen: list[Any]

        def forward(self, batch):
            self.seen = [row["IN"] for row in batch]
            return [{"OUT": row["IN"]} for row in batch]

    return Echo()


def raw_results(proxy: FakeProxy, items: list[Any]) -> list[dict[str, Any]]:
    """The worker's results for ``items`` as sent, in order (their data still msgpack)."""
    jobs = [protocol.job(uuid.uuid4().bytes, 5000, msgpack.packb(item)) for item in items]
    proxy.send(protocol.batch(jobs))
    answer = proxy.receive()
    by_id = {r["id"]: r for r in answer["results"]}
    return [by_id[job["id"]] for job in jobs]


def tensor_of(result: dict[str, Any], name: str) -> list[Any]:
    """``[datatype, shape, bin]`` of one output of an ok result, read without the package."""
    value = msgpack.unpackb(result["data"], raw=False)[name]
    assert isinstance(value, msgpack.ExtType) and value.code == 1
    return msgpack.unpackb(value.data, raw=False)


# -- declarations and the hello ---------------------------------------------------------------


def test_a_declaration_is_frozen_and_gives_the_hello_dict():
    t = corral.Tensor("INPUT0", "FP32", [3, -1])
    assert t.shape == (3, -1)
    assert t.spec() == {"name": "INPUT0", "datatype": "FP32", "shape": [3, -1]}
    assert list(t.spec()) == ["name", "datatype", "shape"]
    with pytest.raises(AttributeError):
        t.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("X", "FP8", [1]), "unknown datatype 'FP8'"),
        (("X", "fp32", [1]), "unknown datatype"),
        (("X", "FP32", [-2]), "int from -1 to 2"),
        (("X", "FP32", [True]), "int from -1 to 2"),
        (("X", "FP32", [1.0]), "int from -1 to 2"),
        # No hello carries it: the proxy reads an i64 (the worker was refused at every restart).
        (("X", "FP32", [2**63]), "int from -1 to 2"),
        (("X", "FP32", [2**64]), "int from -1 to 2"),
        (("X", "FP32", "3"), "sequence of ints"),
        (("", "FP32", [1]), "non-empty str"),
    ],
)
def test_a_bad_declaration_is_refused_with_its_reason(args, words):
    with pytest.raises(ValueError, match=words):
        corral.Tensor(*args)


def test_duplicate_names_fail_where_the_class_is_defined():
    with pytest.raises(ValueError, match=r"Twice\.inputs declares 'A' more than once"):

        class Twice(corral.Worker):
            inputs = (corral.Tensor("A", "FP32", [1]), corral.Tensor("A", "INT8", [1]))

    with pytest.raises(TypeError, match=r"Loose\.outputs must hold corral\.Tensor, not dict"):

        class Loose(corral.Worker):
            outputs = ({"name": "A", "datatype": "FP32", "shape": [1]},)

    with pytest.raises(TypeError, match=r"One\.outputs must be a tuple of corral\.Tensor"):

        class One(corral.Worker):
            outputs = corral.Tensor("A", "FP32", [1])


class Simple(corral.Worker):
    inputs = (corral.Tensor("INPUT0", "FP32", [3]), corral.Tensor("TEXT", "BYTES", [-1]))
    outputs = (corral.Tensor("OUTPUT0", "INT64", [2, 2]),)

    def forward(self, batch):
        return batch


def test_the_hello_carries_the_declarations_as_the_golden_frame_does():
    with FakeProxy(Simple()) as proxy:
        hello = dict(proxy.hello, pid=4244)  # the golden frame's pid; the order is kept
    # The golden frame predates shared memory, which a plain worker declares where it can.
    assert hello.pop("features") == ["shm"]
    golden = (VECTORS / "hello_tensors.bin").read_bytes()
    assert protocol.encode_frame(hello) == golden


def test_a_worker_without_tensors_says_nothing_of_them():
    class Plain(corral.Worker):
        def forward(self, batch):
            return batch

    with FakeProxy(Plain()) as proxy:
        assert "inputs" not in proxy.hello and "outputs" not in proxy.hello


# -- decoding and encoding, every datatype ----------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(_tensors.DATATYPES))
def test_every_datatype_goes_through_forward_and_back(np, datatype):
    worker = echo(datatype, [2, 3])
    with FakeProxy(worker) as proxy:
        (got,) = proxy.infer([{"IN": tensor(ROWS[datatype], datatype)}])
    (seen,) = worker.seen
    if np is None:
        assert seen == ROWS[datatype]  # nested lists of plain Python values
    else:
        expected = object if datatype == "BYTES" else _tensors.DATATYPES[datatype].numpy
        assert isinstance(seen, np.ndarray) and seen.dtype == np.dtype(expected)
        assert seen.shape == (2, 3) and seen.tolist() == ROWS[datatype]
    assert got.status == "ok" and plain(got.value["OUT"]) == ROWS[datatype]


def test_examples_reach_forward_as_a_v2_client_s_rows_do(real_np):
    """Warm-up packed an example's values plain: a row declared FP32 came to forward as a list,
    and a worker written for v2 (``row["IN"].sum()``) failed its warm-up and never served."""

    class Summing(corral.Worker):
        inputs = (corral.Tensor("IN", "FP32", [3]),)
        outputs = (corral.Tensor("OUT", "FP32", [1]),)
        examples = (
            {"IN": real_np.array([1.0, 2.0, 3.0], real_np.float32)},
            {"IN": [1, 2, 3]},
            {"IN": tensor([1.0, 2.0, 3.0], "FP32")},  # made as the proxy would: kept as it is
        )

        def forward(self, rows):
            assert all(isinstance(row["IN"], real_np.ndarray) for row in rows)
            return [{"OUT": real_np.array([row["IN"].sum()])} for row in rows]

    Summing().warm_up()
    with FakeProxy(Summing()) as proxy:
        (got,) = proxy.infer([{"IN": tensor([1.0, 2.0, 4.0], "FP32")}])
    assert got.status == "ok" and plain(got.value["OUT"]) == [7.0]

    class Misfit(Summing):
        examples = ({"IN": [1, 2]},)

    with pytest.raises(ValueError, match="input 'IN' cannot be a tensor of FP32"):
        Misfit().warm_up()

    class Missing(Summing):
        examples = ({"OTHER": [1, 2, 3]},)

    with pytest.raises(ValueError, match="the example has no input 'IN'"):
        Missing().warm_up()

    # A typed worker's examples go through msgspec, which wrote a msgpack ExtType as an array:
    # its tensor values reached forward as [1, b"..."], and a Struct's field failed to decode.
    class Row(msgspec.Struct):
        IN: Any

    class Typed(Summing):
        input_type = Row

        def forward(self, rows):
            assert all(isinstance(row.IN, real_np.ndarray) for row in rows)
            return [{"OUT": real_np.array([row.IN.sum()])} for row in rows]

    Typed().warm_up()


def test_numeric_rows_are_read_only_views_of_the_message(real_np):
    worker = echo("FP32", [3])
    with FakeProxy(worker) as proxy:
        proxy.infer([{"IN": tensor([1.0, 2.0, 3.0], "FP32")}])
    (seen,) = worker.seen
    assert not seen.flags.writeable and not seen.flags.owndata  # no copy was made
    with pytest.raises(ValueError, match="read-only"):
        seen[0] = 5.0


def test_fp16_is_ieee_half_on_the_wire(np):
    values = [1.0, -2.5, 65504.0, 2.0**-24]  # the largest half, the smallest subnormal
    data = tensor(values, "FP16").data
    assert msgpack.unpackb(data) == ["FP16", [4], struct.pack("<4e", *values)]
    assert plain(_tensors.decode(data)) == values


def test_bool_is_one_byte_each_and_other_bytes_are_refused(np):
    data = tensor([True, False, True], "BOOL").data
    assert msgpack.unpackb(data) == ["BOOL", [3], b"\x01\x00\x01"]
    with pytest.raises(corral.ValidationError, match="0 or 1"):
        _tensors.decode(ext("BOOL", [2], b"\x01\x02").data)


@pytest.mark.parametrize(
    ("elements", "wire"),
    [
        ([], b""),
        ([b""], b"\x00\x00\x00\x00"),
        (["é", b"ab", ""], b"\x02\x00\x00\x00\xc3\xa9\x02\x00\x00\x00ab\x00\x00\x00\x00"),
    ],
)
def test_bytes_elements_are_length_prefixed_and_str_is_utf8(np, elements, wire):
    data = tensor(elements, "BYTES").data
    assert msgpack.unpackb(data) == ["BYTES", [len(elements)], wire]
    as_bytes = [e.encode() if isinstance(e, str) else e for e in elements]
    assert plain(_tensors.decode(data)) == as_bytes


@pytest.mark.parametrize(
    ("datatype", "value", "shape", "decoded"),
    [
        ("INT32", 5, [], 5),
        ("BYTES", "one", [], b"one"),
        ("FP64", [[], []], [2, 0], [[], []]),
        ("FP32", [[[1.0], [2.0]]], [1, 2, 1], [[[1.0], [2.0]]]),
    ],
)
def test_scalars_and_empty_rows_keep_their_shape(np, datatype, value, shape, decoded):
    data = tensor(value, datatype).data
    assert msgpack.unpackb(data)[1] == shape
    assert plain(_tensors.decode(data)) == decoded


def test_rows_of_any_length_where_the_declaration_says_minus_one(np):
    worker = echo("FP32", [-1, 2])
    short, long = [[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    with FakeProxy(worker) as proxy:
        got = proxy.infer([{"IN": tensor(short, "FP32")}, {"IN": tensor(long, "FP32")}])
    assert [plain(s) for s in worker.seen] == [short, long]
    assert [plain(r.value["OUT"]) for r in got] == [short, long]


def test_an_empty_row_of_too_many_empty_lists_is_refused_without_numpy(monkeypatch):
    monkeypatch.setattr(_tensors, "numpy", lambda: None)
    with pytest.raises(corral.ValidationError, match="too many empty rows"):
        _tensors.decode(ext("FP32", [1 << 20, 0], b"").data)
    assert _tensors.decode(ext("FP32", [2, 0, 3], b"").data) == [[], []]


# -- malformed tensor values --------------------------------------------------------------------

LENGTH = struct.Struct("<I").pack

MALFORMED = {
    "unknown datatype": (ext("FP8", [1], b"\x00"), "unknown tensor datatype 'FP8'"),
    "too few bytes": (ext("FP32", [3], b"\x00" * 8), "8 bytes does not fit FP32 of shape [3]"),
    "too many bytes": (ext("INT16", [1], b"\x00" * 3), "does not fit INT16"),
    "bytes length past the end": (ext("BYTES", [1], LENGTH(5) + b"abc"), "runs past"),
    "bytes left over": (ext("BYTES", [1], LENGTH(1) + b"a" + b"zz"), "goes on past"),
    "bytes elements missing": (
        ext("BYTES", [3], LENGTH(4) + b"abcd" + LENGTH(0)),
        "ends before its 3 BYTES elements",
    ),
    "more elements than bytes": (ext("BYTES", [2], LENGTH(0)), "cannot hold 2 BYTES"),
    "bool of 2": (ext("BOOL", [2], b"\x01\x02"), "0 or 1"),
    "negative dimension": (ext("FP32", [-1], b""), "Expected `int` >= 0 - at `$[1][0]`"),
    "float dimension": (
        ext("FP32", [1.0], b"\x00" * 4),
        "Expected `int`, got `float` - at `$[1][0]`",
    ),
    "two parts": (
        msgpack.ExtType(1, msgpack.packb(["FP32", [1]])),
        "Expected `array` of length 3, got 2",
    ),
    "data as str": (ext("FP32", [1], "abcd"), "Expected `bytes`, got `str` - at `$[2]`"),
    "datatype as int": (ext(3, [1], b"\x00"), "Expected `str`, got `int` - at `$[0]`"),
    "not an array": (msgpack.ExtType(1, msgpack.packb({"a": 1})), "Expected `array`, got `object`"),
    "shape not an array": (ext("FP32", 1, b"\x00" * 4), "Expected `array`, got `int` - at `$[1]`"),
    "bytes after it": (
        msgpack.ExtType(1, msgpack.packb(["UINT8", [1], b"\x07"]) + b"\xc0"),
        "trailing characters",
    ),
    "cut short": (msgpack.ExtType(1, msgpack.packb(["UINT8", [4], b"abcd"])[:-2]), "truncated"),
    "empty": (msgpack.ExtType(1, b""), "truncated"),
    "datatype not UTF-8": (
        msgpack.ExtType(1, b"\x93\xa2\xff\xfe\x91\x01\xc4\x00"),
        "a tensor value's datatype is not valid UTF-8",
    ),
    "too many dimensions": (
        ext("FP32", [1] * 65, b"\x00" * 4),
        "Expected `array` of length <= 64 - at `$[1]`",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_tensor_value_is_422_and_its_batch_mate_goes_on(np, case):
    bad, words = MALFORMED[case]
    worker = echo("UINT8", [-1])
    with FakeProxy(worker) as proxy:
        wrong, fine = proxy.infer([{"IN": bad}, {"IN": tensor([1, 2], "UINT8")}])
    assert wrong.status == "invalid" and words in wrong.message
    assert fine.status == "ok" and plain(fine.value["OUT"]) == [1, 2]


def test_other_ext_types_reach_forward_as_msgpack_gives_them():
    class Codes(corral.Worker):
        def forward(self, batch):
            return [[type(x).__name__, x.code, x.data] for x in batch]

    with FakeProxy(Codes()) as proxy:
        got = proxy.infer([msgpack.ExtType(5, b"x"), msgpack.ExtType(127, b"")])
    assert got == [Result("ok", ["ExtType", 5, b"x"]), Result("ok", ["ExtType", 127, b""])]


# -- typed workers (msgspec) --------------------------------------------------------------------


class Pair(msgspec.Struct):
    INPUT0: Any  # a tensor arrives as an array (or lists): msgspec cannot type it further
    scale: float = 1.0


class Scaled(corral.Worker):
    input_type = Pair
    inputs = (corral.Tensor("INPUT0", "FP32", [3]),)
    outputs = (corral.Tensor("OUTPUT0", "FP64", [3]),)

    def forward(self, batch):
        return [{"OUTPUT0": [x * p.scale for x in p.INPUT0]} for p in batch]


def test_a_typed_worker_decodes_tensor_fields_and_encodes_declared_outputs(np):
    with FakeProxy(Scaled()) as proxy:
        item = {"INPUT0": tensor([1.0, 2.0, 3.0], "FP32"), "scale": 2.0}
        (result,) = raw_results(proxy, [item])
        wrong, fine = proxy.infer([{"INPUT0": ext("FP32", [3], b""), "scale": 1.0}, item])
    assert tensor_of(result, "OUTPUT0") == ["FP64", [3], struct.pack("<3d", 2.0, 4.0, 6.0)]
    assert wrong.status == "invalid" and "does not fit FP32" in wrong.message
    assert plain(fine.value["OUTPUT0"]) == [2.0, 4.0, 6.0]


def test_a_typed_worker_s_rows_are_views_too(real_np):
    class Keep(Scaled):
        def forward(self, batch):
            self.seen = [p.INPUT0 for p in batch]
            return [{"OUTPUT0": p.INPUT0} for p in batch]

    worker = Keep()
    with FakeProxy(worker) as proxy:
        proxy.infer([{"INPUT0": tensor([1.0, 2.0, 3.0], "FP32")}])
    (seen,) = worker.seen
    assert seen.dtype == real_np.float32 and not seen.flags.writeable


def test_a_native_client_s_row_reaches_forward_as_a_v2_client_s_does(real_np):
    """A native request (plain lists, as sent) to a worker that declares inputs reached its
    ``forward`` as lists: the README's own v2 example answered ``{"INPUT0": [1, 2, 3]}`` with
    a 500 (``'list' object has no attribute 'sum'``), and a wrong shape with the same 500."""

    class Summing(corral.Worker):
        inputs = (corral.Tensor("IN", "FP32", [3]), corral.Tensor("TEXT", "BYTES", [-1]))

        def forward(self, rows):
            return [self.answer(row) for row in rows]

        @staticmethod
        def answer(row):
            if isinstance(row, dict) and isinstance(row.get("IN"), real_np.ndarray):
                assert row["IN"].dtype == real_np.float32
                return {"SUM": float(row["IN"].sum()), "TEXT": list(row["TEXT"])}
            return {"as_sent": repr(row)}

    with FakeProxy(Summing()) as proxy:
        results = proxy.infer(
            [
                {"IN": [1, 2, 3], "TEXT": ["a", "b"]},
                {"IN": tensor([1.0, 2.0, 4.0], "FP32"), "TEXT": tensor([b"c"], "BYTES")},
                # A native client's own tensor of another datatype: made FP32, exactly.
                {"IN": tensor([1, 2, 4], "INT8"), "TEXT": []},
                {"IN": [1, 2], "TEXT": []},
                {"IN": tensor([1.0, 2.0, 3.0, 4.0], "FP32"), "TEXT": []},
                {"IN": [1, 2, 3], "TEXT": [1]},
                # Some inputs named, one not (a key mistyped): this item's 422.
                {"IN": [1, 2, 3]},
                # No input named: as sent, for whatever reads it.
                {"text": "hello"},
                [1, 2, 3],
                b"\x89PNG",
            ]
        )
    good, tensors, other, shape, tensor_shape, number, missing, named_none, listed, raw = results
    assert good.status == "ok" and good.value == {"SUM": 6.0, "TEXT": [b"a", b"b"]}
    assert tensors.status == "ok" and tensors.value == {"SUM": 7.0, "TEXT": [b"c"]}
    assert other.status == "ok" and other.value == {"SUM": 7.0, "TEXT": []}
    for refused in (shape, tensor_shape):
        assert refused.status == "invalid" and "input 'IN'" in refused.message, refused
        assert "where [3] is declared" in refused.message
    assert number.status == "invalid" and "must be bytes or str, not int" in number.message
    assert missing.status == "invalid"
    assert missing.message == "no input 'TEXT': the model takes 'IN', 'TEXT'"
    assert named_none.value == {"as_sent": "{'text': 'hello'}"}
    assert listed.value == {"as_sent": "[1, 2, 3]"}
    assert raw.value == {"as_sent": "b'\\x89PNG'"}

    class Decoding(Summing):
        """Its own preprocess reads what is no tensor (an image as base64 text, say)."""

        def preprocess(self, row):
            if isinstance(row["IN"], str):
                size = float(len(base64.b64decode(row["IN"])))
                return {"IN": real_np.array([size] * 3, real_np.float32), "TEXT": []}
            return row

    with FakeProxy(Decoding()) as proxy:
        text, row = proxy.infer([{"IN": "aGVsbG8=", "TEXT": []}, {"IN": [1, 2, 3], "TEXT": []}])
    assert text.status == "ok" and text.value == {"SUM": 15.0, "TEXT": []}
    assert row.status == "ok" and row.value == {"SUM": 6.0, "TEXT": []}

    # Warm-up reads its examples as serving reads the same requests: the base64 row warms up,
    # an example's own tensor of another datatype reaches forward made FP32 (as int8, it had
    # passed warm-up and been float32 when served), and one of another shape fails (it had
    # passed, and was a 422 when served).
    class Warmed(Decoding):
        examples = (
            {"IN": "aGVsbG8=", "TEXT": []},
            {"IN": None, "TEXT": []},  # a TypeError converting it: as sent too
            {"IN": tensor([1, 2, 4], "INT8"), "TEXT": []},
        )

    Warmed().warm_up()

    class Misshapen(Summing):
        examples = ({"IN": tensor([1.0, 2.0, 3.0, 4.0], "FP32"), "TEXT": []},)

    with pytest.raises(corral.ValidationError, match="where \\[3\\] is declared"):
        Misshapen().warm_up()


def test_a_native_row_nested_past_numpy_s_dimensions_is_the_item_s_422(real_np):
    # numpy's RuntimeError (32 dimensions at most) had been a 500 for the item.
    class Texts(corral.Worker):
        inputs = (corral.Tensor("T", "BYTES", [-1]),)

        def forward(self, rows):
            return [len(row["T"]) for row in rows]

    deep: Any = ["a"]
    for _ in range(33):
        deep = [deep]
    with FakeProxy(Texts()) as proxy:
        bad, good = proxy.infer([{"T": deep}, {"T": ["a", "b"]}])
    assert bad.status == "invalid" and "input 'T'" in bad.message, bad
    assert good.status == "ok" and good.value == 2


def test_an_any_field_gets_its_array_whatever_its_sibling_fields(real_np):
    """A row whose tensors a typed field takes as lists (``list[float]``) is decoded on a
    second try that turns tensors into lists: its ``Any`` field got a list there, an array
    beside fields that take tensors as they come. The README promises ``Any`` fields arrays."""

    class Row(msgspec.Struct):
        RAW: Any
        V: list[float]

    class Mixed(corral.Worker):
        inputs = (corral.Tensor("RAW", "FP32", [2]), corral.Tensor("V", "FP32", [2]))
        input_type = Row

        def forward(self, rows):
            self.seen = rows
            return [row.RAW.sum() + sum(row.V) for row in rows]

    worker = Mixed()
    with FakeProxy(worker) as proxy:
        row = {"RAW": tensor([1.0, 2.0], "FP32"), "V": tensor([3.0, 4.0], "FP32")}
        (result,) = proxy.infer([row])
    assert result.value == 10.0
    (seen,) = worker.seen
    assert isinstance(seen.RAW, real_np.ndarray) and seen.RAW.dtype == real_np.float32
    assert seen.V == [3.0, 4.0]


def test_an_any_field_is_never_taken_for_another_input_equal_to_it(real_np):
    """A scalar tensor's value is a cached small int: found by the id of its value, another
    input equal to it (a plain 5 beside a tensor 5) was taken for the tensor."""

    class Row(msgspec.Struct):
        A: Any
        N: int
        V: list[float]

    class Seen(corral.Worker):
        input_type = Row

        def forward(self, rows):
            self.seen = rows
            return [0 for _ in rows]

    worker = Seen()
    with FakeProxy(worker) as proxy:
        row = {"A": 5, "N": tensor(5, "INT64"), "V": tensor([1.0, 2.0], "FP32")}
        assert proxy.infer([row])[0].status == "ok"
    (seen,) = worker.seen
    assert (type(seen.A), seen.A, seen.N, seen.V) == (int, 5, 5, [1.0, 2.0])


# -- encoding outputs ---------------------------------------------------------------------------


class Classify(corral.Worker):
    outputs = (corral.Tensor("PROBS", "FP32", [3]), corral.Tensor("LABEL", "BYTES", []))

    def forward(self, batch):
        return batch  # each item already is the output under test


def test_declared_outputs_are_tensor_values_of_the_declared_datatype(real_np):
    class Float64(Classify):
        def forward(self, batch):
            return [dict(item, PROBS=real_np.array(item["PROBS"])) for item in batch]

    probs = [0.25, 0.5, 1 / 3]  # float64 in forward; declared FP32
    with FakeProxy(Float64()) as proxy:
        (result,) = raw_results(proxy, [{"PROBS": probs, "LABEL": "cat", "extra": [1, 2]}])
    as_fp32 = real_np.array(probs, dtype="<f4").tobytes()
    assert tensor_of(result, "PROBS") == ["FP32", [3], as_fp32]
    assert tensor_of(result, "LABEL") == ["BYTES", [], LENGTH(3) + b"cat"]
    assert msgpack.unpackb(result["data"])["extra"] == [1, 2]  # not declared: plain msgpack


def test_declared_outputs_without_numpy_are_packed_the_same(real_np, monkeypatch):
    monkeypatch.setattr(_tensors, "numpy", lambda: None)
    with FakeProxy(Classify()) as proxy:
        (result,) = raw_results(proxy, [{"PROBS": [0.25, 0.5, 0.125], "LABEL": b"dog"}])
    expected = real_np.array([0.25, 0.5, 0.125], dtype="<f4").tobytes()
    assert tensor_of(result, "PROBS") == ["FP32", [3], expected]
    assert tensor_of(result, "LABEL") == ["BYTES", [], LENGTH(3) + b"dog"]


def test_a_big_endian_array_goes_out_little_endian(real_np):
    values = real_np.arange(4, dtype=">i4")
    data = _tensors.encode(values, "INT32")
    assert msgpack.unpackb(data) == ["INT32", [4], struct.pack("<4i", 0, 1, 2, 3)]


def test_a_large_output_is_encoded_whole(real_np):
    big = real_np.arange(1 << 20, dtype=real_np.float64).reshape(1024, 1024)
    data = _tensors.encode(big, "FP32")
    datatype, shape, raw = msgpack.unpackb(data)
    assert (datatype, shape) == ("FP32", [1024, 1024])
    assert raw == big.astype("<f4").tobytes()


@pytest.mark.parametrize(
    ("probs", "words"),
    [
        ("high", "output 'PROBS' cannot be a tensor of FP32"),
        (None, "output 'PROBS' is None"),
        ([[1.0], [2.0, 3.0]], "output 'PROBS' cannot be a tensor of FP32"),
    ],
)
def test_an_output_that_cannot_be_its_datatype_fails_alone(np, probs, words):
    with FakeProxy(Classify()) as proxy:
        bad, good = proxy.infer(
            [{"PROBS": probs, "LABEL": "a"}, {"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}]
        )
    assert bad.status == "error" and words in bad.message
    assert good.status == "ok" and plain(good.value["PROBS"]) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("probs", [[1.0, 2.0], [[1.0, 2.0, 3.0]], 1.0])
def test_an_output_of_another_shape_than_declared_fails_alone(np, probs):
    # A v2 client is answered 500 for it: the worker's tests here had passed.
    with FakeProxy(Classify()) as proxy:
        bad, good = proxy.infer(
            [{"PROBS": probs, "LABEL": "a"}, {"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}]
        )
    assert bad.status == "error" and "where [3] is declared" in bad.message, bad
    assert good.status == "ok"


def test_any_length_is_declared_with_minus_one():
    class Any(corral.Worker):
        outputs = (corral.Tensor("V", "INT32", [-1, 2]),)

        def forward(self, batch):
            return batch

    with FakeProxy(Any()) as proxy:
        results = proxy.infer([{"V": [[1, 2]] * n} for n in (1, 5)] + [{"V": [[1, 2, 3]]}])
    assert [r.status for r in results] == ["ok", "ok", "error"]


def test_an_object_array_of_numbers_is_the_numbers_it_holds(real_np):
    objects = real_np.array([1, 2, 3], dtype=object)
    assert _tensors.encode(objects, "INT32") == _tensors.encode([1, 2, 3], "INT32")
    assert _tensors.encode(objects, "FP32") == _tensors.encode([1.0, 2.0, 3.0], "FP32")
    for refused in (["a", 1], [None, 1], [[1], [2, 3]]):
        with pytest.raises(ValueError, match=r"holds numbers, not objects \(None, strings"):
            _tensors.encode(real_np.array(refused, dtype=object), "INT32")
    # Named by kind, as a client says it: a native row's `{"X": "abc"}` had read `<U3`.
    with pytest.raises(ValueError, match=r"FP32 holds numbers, not strings \(numpy dtype <U3\)"):
        _tensors.encode("abc", "FP32")
    with pytest.raises(ValueError, match=r"^a value does not fit in INT64$"):
        _tensors.encode([2**63, 1], "INT64")


def test_integers_past_64_bits_are_past_an_integer_datatype_and_numbers_for_a_float_one(real_np):
    # numpy keeps them as objects: they had been told "not values of numpy dtype object".
    for value, datatype in (([2**64], "UINT64"), ([-(2**63) - 1], "INT64"), ([2**70], "INT32")):
        with pytest.raises(ValueError, match=f"a value does not fit in {datatype}"):
            _tensors.encode(value, datatype)
    assert _tensors.encode([2**70, 1.5], "FP64") == _tensors.encode([2.0**70, 1.5], "FP64")
    assert _tensors.encode([True, 2**70], "FP64") == _tensors.encode([1.0, 2.0**70], "FP64")
    with pytest.raises(ValueError, match="a value does not fit in INT64"):
        _tensors.encode([True, 2**70], "INT64")
    assert _tensors.encode([2**70], "FP32") == _tensors.encode([2.0**70], "FP32")
    with pytest.raises(ValueError, match="a finite value is past FP64's range"):
        _tensors.encode([10**400], "FP64")
    with pytest.raises(ValueError, match="a finite value is past FP16's range"):
        _tensors.encode([2**70], "FP16")


def test_a_bytes_output_of_numbers_fails(np):
    with FakeProxy(Classify()) as proxy:
        (bad,) = proxy.infer([{"LABEL": [1, 2]}])
    assert bad.status == "error" and "must be bytes or str, not int" in bad.message


def test_without_declared_outputs_arrays_are_plain_lists_as_before(real_np):
    class Arange(corral.Worker):
        def forward(self, batch):
            return [{"OUT": real_np.arange(n)} for n in batch]

    with FakeProxy(Arange()) as proxy:
        (result,) = raw_results(proxy, [3])
    assert msgpack.unpackb(result["data"]) == {"OUT": [0, 1, 2]}


def test_a_result_that_is_no_dict_or_lacks_an_output_fails_alone():
    # As a v2 (or KServe v1) client is answered 500 for it: it had passed here, and warm-up.
    with FakeProxy(Classify()) as proxy:
        no_dict, lacking, whole = proxy.infer(
            [[1, 2], {"PROBS": [1.0, 0.0, 0.0]}, {"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}]
        )
    assert no_dict.status == "error" and "returns a dict from output name" in no_dict.message
    assert lacking.status == "error"
    assert "output 'LABEL' is missing from the result" in lacking.message
    assert whole.status == "ok"

    class Lacking(Classify):
        examples = ({"PROBS": [1.0, 0.0, 0.0]},)

    with pytest.raises(TypeError, match="output 'LABEL' is missing"):
        Lacking().warm_up()


def test_the_testing_helper_refuses_an_unknown_datatype():
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        tensor([1.0], "FLOAT")


def test_importing_the_package_does_not_import_numpy():
    # numpy is optional and slow to import: only the first tensor value pays for it.
    code = "import sys, corral, corral.testing; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(("value", "datatype"), [([300], "UINT8"), ([-1], "UINT32")])
def test_a_value_out_of_its_datatype_s_range_is_refused(np, value, datatype):
    with pytest.raises((ValueError, OverflowError)):
        _tensors.encode(value, datatype)


def test_a_bytes_element_s_length_counts_bytes_whatever_the_buffer_s_items(np):
    wide = memoryview(b"abcd").cast("H")  # two items of two bytes
    data = _tensors.encode([wide, bytearray(b"x")], "BYTES")
    assert msgpack.unpackb(data) == ["BYTES", [2], LENGTH(4) + b"abcd" + LENGTH(1) + b"x"]


@pytest.mark.parametrize(
    "value, datatype",
    [
        ([1.7, -2.9], "INT64"),
        ([300, -1], "UINT8"),
        (1e10, "INT32"),
        ([float("nan")], "INT64"),
        ([2], "BOOL"),
    ],
)
def test_declared_outputs_never_change_a_value(value, datatype):
    np = pytest.importorskip("numpy")
    for given in (value, np.asarray(value)):
        with pytest.raises(ValueError):
            _tensors.encode(given, datatype)
    assert _tensors.encode([1.0, 2.0], "INT32") == _tensors.encode([1, 2], "INT32")


def test_a_nan_for_an_integer_datatype_is_refused_in_the_package_s_words_scalar_or_not():
    # A scalar NaN was numpy's own "cannot convert float NaN to integer"; a list of them the
    # package's words.
    pytest.importorskip("numpy")
    for value in (float("nan"), [float("nan")]):
        with pytest.raises(ValueError, match=r"would change as INT8 \(fractions, range or NaN\)"):
            tensor(value, "INT8")


def test_whole_floats_become_integers_with_numpy_or_without(np):
    """Without numpy, struct refused every float as an integer: 2.0 was an error there and
    the integer 2 with numpy. Now both take whole floats and refuse the rest alike."""
    assert _tensors.encode([[1.0, -2.0]], "INT64") == _tensors.encode([[1, -2]], "INT64")
    assert _tensors.encode(3.0, "UINT8") == _tensors.encode(3, "UINT8")
    for changed in ([1.5], [float("nan")], [float("inf")], [256.0]):
        with pytest.raises(ValueError):
            _tensors.encode(changed, "UINT8")


@pytest.mark.parametrize(
    "value, datatype",
    [
        (["False"], "BOOL"),  # numpy: True; struct: True
        ([0.5], "BOOL"),
        (["1.5"], "FP32"),
        ([1.0, None], "FP32"),  # numpy: NaN
        ([Decimal("2.75")], "INT32"),  # numpy: 2
        ([1 + 5j, 2], "FP32"),  # numpy: the imaginary part dropped
        ([b"1"], "INT8"),
    ],
)
def test_only_numbers_become_numeric_tensors(np, value, datatype):
    """Whatever the source (with numpy or without): never a value the worker did not return."""
    with pytest.raises((ValueError, TypeError)):
        _tensors.encode(value, datatype)
    if np is not None:
        with pytest.raises((ValueError, TypeError)):
            _tensors.encode(np.asarray(value, dtype=object), datatype)


@pytest.mark.parametrize(
    "value, dtype, datatype",
    [
        ([-1], "int64", "UINT64"),  # a round trip would see -1 again
        ([2**63], "uint64", "INT64"),
        ([-1], "int32", "UINT32"),
        ([200], "uint8", "INT8"),
        ([-1], "int8", "UINT8"),
        ([1e6], "float64", "FP16"),  # finite, past FP16's range: numpy makes it infinite
        ([1e39], "float64", "FP32"),
        ([float("inf"), 1e300], "float64", "FP32"),  # an infinity given excuses no other
        ([float("nan"), 1e40], "float64", "FP16"),
    ],
)
def test_an_array_is_never_wrapped_into_its_declared_datatype(value, dtype, datatype):
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError):
        _tensors.encode(np.asarray(value, dtype=dtype), datatype)


def test_a_longdouble_past_fp64_s_range_fails_its_item_alone(real_np):
    # numpy flags the cast that makes it infinite, as for FP16 and FP32 (numpy >= 1.24).
    if real_np.dtype(real_np.longdouble).itemsize <= 8:
        pytest.skip("longdouble is a float64 here")

    class Wide(corral.Worker):
        outputs = (corral.Tensor("Y", "FP64", [2]),)

        def forward(self, batch):
            return [{"Y": real_np.array([real_np.longdouble(x), 1])} for x in batch]

    with FakeProxy(Wide()) as proxy:
        past, fine = proxy.infer(["1e400", "1.5"])
    assert past.status == "error" and "past FP64's range" in past.message
    assert fine.status == "ok" and fine.value["Y"].tolist() == [1.5, 1.0]


def test_arrays_that_fit_their_declared_datatype_go_as_they_are():
    np = pytest.importorskip("numpy")
    for value, dtype, datatype in [
        ([0, 2**63 - 1], "uint64", "INT64"),
        ([0, 255], "int64", "UINT8"),
        ([-128, 127], "int32", "INT8"),
        ([65504.0], "float64", "FP16"),
        ([float("inf"), float("nan")], "float64", "FP32"),  # given, not made by the cast
    ]:
        assert _tensors.encode(np.asarray(value, dtype=dtype), datatype)


def returning(result_type: type) -> corral.Worker:
    """A ``Classify`` worker whose ``output_type`` is ``result_type``, each item made one."""

    class Typed(Classify):
        output_type = result_type

        def forward(self, batch):
            return [result_type(**item) for item in batch]

    return Typed()


def test_a_struct_result_s_other_fields_go_as_msgspec_writes_them(np):
    # Made a map by hand, a Struct's unset field failed every result ("cannot encode
    # UnsetType"), a dataclass's field(init=False) was an AttributeError, fields left out as
    # defaults went out, and a tagged Struct lost its tag.
    import dataclasses

    import msgspec

    class Out(msgspec.Struct, omit_defaults=True, tag="out"):
        PROBS: list
        LABEL: str
        note: str | None = None
        later: Any = msgspec.UNSET

    @dataclasses.dataclass
    class Pair:
        PROBS: list
        LABEL: str
        seen: int = dataclasses.field(init=False)

    item = {"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}
    for worker, keys in (
        (returning(Out), {"type", "PROBS", "LABEL"}),
        (returning(Pair), {"PROBS", "LABEL"}),
    ):
        with FakeProxy(worker) as proxy:
            (raw,) = raw_results(proxy, [item])
        assert raw["status"] == "ok", raw
        assert set(msgpack.unpackb(raw["data"])) == keys, worker
        assert tensor_of(raw, "PROBS")[:2] == ["FP32", [3]]


def test_an_output_type_whose_fields_are_the_outputs_is_a_whole_result(np):
    # A typed worker's Struct (or dataclass) is encoded as the map of its fields: it served v2
    # and KServe v1 clients, and the check of a result's outputs must not refuse it.
    import dataclasses

    import msgspec

    class Out(msgspec.Struct):
        PROBS: list
        LABEL: str

    @dataclasses.dataclass
    class Pair:
        PROBS: list
        LABEL: str

    item = {"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}
    for worker in (returning(Out), returning(Pair)):
        with FakeProxy(worker) as proxy:
            (result,) = proxy.infer([item])
            # Held to the declarations as a dict is: a Struct went out as it was, ok here and
            # for a native client, and a 500 from the proxy for every v2 client.
            (short,) = proxy.infer([{"PROBS": [1.0, 0.0], "LABEL": "b"}])
            (raw,) = raw_results(proxy, [item])
        assert result.status == "ok", result
        # As tensors, as a dict's outputs come back: BYTES as bytes.
        assert plain(result.value["PROBS"]) == [1.0, 0.0, 0.0]
        assert plain(result.value["LABEL"]) == b"b"
        assert short.status == "error" and "output 'PROBS'" in short.message, short
        assert "shape [2]" in short.message, short
        as_fp32 = struct.pack("<3f", 1.0, 0.0, 0.0)
        assert tensor_of(raw, "PROBS") == ["FP32", [3], as_fp32], worker


def test_a_struct_result_s_post_init_is_not_run_again_on_its_tensors(np):
    # The copy that holds the outputs as tensors had been made by `msgspec.structs.replace`,
    # which ran `__post_init__` again on the tensor values: one that checked its fields failed
    # every result ("PROBS must be a list").
    import msgspec

    made = []

    class Checked(msgspec.Struct, frozen=True):
        PROBS: list
        LABEL: str

        def __post_init__(self):
            made.append(self.LABEL)
            if not isinstance(self.PROBS, list):
                raise ValueError("PROBS must be a list")

    with FakeProxy(returning(Checked)) as proxy:
        (result,) = proxy.infer([{"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}])
    assert result.status == "ok", result
    assert plain(result.value["PROBS"]) == [1.0, 0.0, 0.0]
    assert made == ["b"]  # made once, by forward

    # A frozen type whose own `__copy__` returns itself, returned as a constant: changed in
    # place, its second result failed ("PROBS cannot be a tensor": it was one already).
    class Constant(msgspec.Struct, frozen=True):
        PROBS: list
        LABEL: str

        def __copy__(self):
            return self

    same = Constant([1.0, 0.0, 0.0], "b")

    class Always(Classify):
        output_type = Constant

        def forward(self, batch):
            return [same for _ in batch]

    with FakeProxy(Always()) as proxy:
        results = proxy.infer(["a"]) + proxy.infer(["b"])
    assert [r.status for r in results] == ["ok", "ok"], results
    assert same.PROBS == [1.0, 0.0, 0.0]


def test_a_struct_result_with_a_declared_output_unset_is_missing_it(np):
    # Left out of its map, it passed warm-up and FakeProxy and was a 500 for every v2 client.
    import msgspec

    class Partial(msgspec.Struct):
        PROBS: Any = msgspec.UNSET
        LABEL: str = "b"

    class Unset(Classify):
        output_type = Partial
        examples = ({},)

        def forward(self, batch):
            return [Partial() for _ in batch]

    with pytest.raises(TypeError, match="output 'PROBS' is missing from the result"):
        Unset().warm_up()

    class Unwarmed(Unset):
        examples = ()

    with FakeProxy(Unwarmed()) as proxy:
        (result,) = proxy.infer([{}])
    assert result.status == "error" and "output 'PROBS' is missing" in result.message, result

    # A dataclass's field never set alike.
    import dataclasses

    @dataclasses.dataclass
    class Later:
        LABEL: str = "b"
        PROBS: Any = dataclasses.field(init=False)

    class Unassigned(Classify):
        output_type = Later
        examples = ({},)

        def forward(self, batch):
            return [Later() for _ in batch]

    with pytest.raises(TypeError, match="output 'PROBS' is missing from the result"):
        Unassigned().warm_up()


def test_an_array_like_output_type_is_refused_beside_declared_outputs():
    # Written as an array, its results were ok natively and in FakeProxy, and a 500 for every
    # v2 and KServe v1 client, which read a result as a map of the outputs.
    import msgspec

    class Row(msgspec.Struct, array_like=True):
        PROBS: list
        LABEL: str

    with pytest.raises(TypeError, match=r"output_type Row is array_like.*drop array_like=True"):

        class Declared(Classify):
            output_type = Row

    # An input_type alike: every v2 row, a map of the inputs, was a 422 blaming the client.
    class Args(msgspec.Struct, array_like=True):
        X: list

    with pytest.raises(TypeError, match=r"input_type Args is array_like: .* declares inputs"):

        class Reads(Classify):
            inputs = (corral.Tensor("X", "FP32", [3]),)
            input_type = Args

    # Returned where no output_type says so, the result's check names what it is.
    class Untyped(Classify):
        output_type = Any

        def forward(self, batch):
            return [Row(**item) for item in batch]

    with FakeProxy(Untyped()) as proxy:
        (result,) = proxy.infer([{"PROBS": [1.0, 0.0, 0.0], "LABEL": "b"}])
    assert result.status == "error", result
    assert "not Row, an array_like Struct (written as an array)" in result.message, result


class Scores(msgspec.Struct):
    PROBS: list
    LABEL: str


class ScoresRow(msgspec.Struct, array_like=True):
    PROBS: list
    LABEL: str


class Mood(enum.Enum):
    GOOD = "good"


class ScoresDict(TypedDict):
    PROBS: list
    LABEL: str


@dataclasses.dataclass
class ScoresData:
    PROBS: list
    LABEL: str


Item = TypeVar("Item")


class Generic_(msgspec.Struct, Generic[Item]):
    PROBS: list[Item]
    LABEL: str


class Custom:
    """A class of the worker's own, which msgspec writes only through the package's hook."""


class Label(str):
    pass


def _refusal(side: str, declared: Any) -> str | None:
    """The TypeError's message where a Classify subclass declares ``declared`` as its ``side``
    (``input_type`` beside declared inputs), or None where the class is accepted."""
    attributes: dict[str, Any] = {side: declared}
    if side == "input_type":
        attributes["inputs"] = (corral.Tensor("X", "FP32", [3]),)
    try:
        type("Declares", (Classify,), attributes)
    except TypeError as error:
        return str(error)
    return None


def test_a_type_never_written_as_a_map_is_refused_beside_declared_tensors():
    # Accepted, every request failed: `output_type = float`, a 500 for each result (no map of
    # the outputs); `input_type = str`, a 422 "Expected `str`, got `object`" for each v2 row (a
    # map of the inputs), blaming the client.
    # (Union[str, bytes]: msgspec will not describe it whole, more than one str-like type.)
    never = (
        str,
        float,
        int,
        bool,
        bytes,
        Optional[int],
        Literal["a", "b"],
        Mood,
        Union[str, bytes],
    )
    for declared in (*never, datetime.datetime, Decimal, Union[int, list[int]]):
        for side, does in (("output_type", "answers"), ("input_type", "takes")):
            message = _refusal(side, declared)
            assert message is not None, (side, declared)
            assert "is never written as a map: a worker that declares" in message, message
            assert f"{does} a map of them (a msgspec.Struct, a dataclass" in message, message
    assert "Declares.output_type float is never" in str(_refusal("output_type", float))
    # Whatever may be a map is left alone, alone or beside a scalar in a union.
    for declared in (
        Scores,
        ScoresDict,
        ScoresData,
        dict[str, Any],
        Any,
        object,
        msgspec.Raw,
        Union[Scores, str],
        Union[int, dict[str, Any]],
        Optional[Annotated[Scores, msgspec.Meta(title="scores")]],
        NewType("Scored", dict),
        Generic_[float],
    ):
        for side in ("output_type", "input_type"):
            assert _refusal(side, declared) is None, (side, declared)
    # An output of a class of one's own may be written as a map by the hook (a str subclass is
    # one to msgspec); a NewType of int is an int.
    assert _refusal("output_type", Custom) is None
    # (Decoded, it is refused apart: msgspec takes one str-like type in a union.)
    assert _refusal("output_type", Union[str, bytes, dict[str, Any]]) is None
    assert _refusal("output_type", Label) is None
    assert "is never written as a map" in str(_refusal("output_type", NewType("Count", int)))


def test_an_array_like_struct_annotated_inside_a_union_is_refused_beside_declared_tensors():
    # The metadata sits inside the union, around its member: unwrapped only at the top, it hid
    # the array_like Struct, and every v2 result was a 500 (every v2 row a 422).
    declared = Optional[Annotated[ScoresRow, msgspec.Meta(title="row")]]
    for side in ("output_type", "input_type"):
        message = _refusal(side, declared)
        assert message is not None, side
        assert f"{side} typing.Optional[" in message, message
        assert "is written as an array: a worker that declares" in message, message


def test_struct_results_at_users_sizes_come_back_whole(real_np):
    # 64 results of 16,384 FP32 values, each made a tensor from a Struct's field in a copy: a
    # results frame of 4 MiB, far past a socket buffer, every value back as sent.
    import msgspec

    class Out(msgspec.Struct):
        Y: Any
        id: int

    class Wide(corral.Worker):
        outputs = (corral.Tensor("Y", "FP32", [-1]),)
        output_type = Out

        def forward(self, batch):
            return [Out(Y=real_np.full(16_384, item, dtype="<f8"), id=item) for item in batch]

    with FakeProxy(Wide()) as proxy:
        results = proxy.infer(list(range(64)))
    assert [r.status for r in results] == ["ok"] * 64
    for item, result in enumerate(results):
        assert result.value["id"] == item
        assert result.value["Y"].dtype == real_np.float32 and result.value["Y"].shape == (16_384,)
        assert (result.value["Y"] == item).all()
