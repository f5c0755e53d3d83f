"""What a worker that declares tensors is held to, beyond the values themselves (test_tensors):
a streamed chunk held to the declared outputs as a whole result is, a type written as an array
refused beside them where the class is defined, and a value that cannot be a tensor told in the
package's words, with numpy or without."""

from __future__ import annotations

import typing
from typing import Any, NamedTuple, Optional

import msgspec
import pytest

import corral
from corral import _tensors
from corral.testing import FakeProxy, Stream, tensor

X = corral.Tensor("X", "FP32", [2])
Y = corral.Tensor("Y", "FP32", [2])


class StreamsY(corral.Worker):
    """Streams each row's chunk given by ``chunk(row)``: one step, then the stream ends."""

    inputs = (X,)
    outputs = (Y,)

    @staticmethod
    def chunk(row: Any) -> Any:
        return {"Y": [1.0, 2.0]}

    def forward(self, rows):
        yield [self.chunk(row) for row in rows]


class LacksY(StreamsY):
    examples = ({"X": [1.0, 2.0]},)

    @staticmethod
    def chunk(row: Any) -> Any:
        return {"Z": 1}


class NoDict(StreamsY):
    @staticmethod
    def chunk(row: Any) -> Any:
        return [1.0, 2.0]


def test_a_streamed_chunk_is_held_to_the_declared_outputs_as_a_result_is():
    # README: a result that lacks a declared output, or is no dict, fails that item for every
    # client. A chunk had been checked against nothing: a native client's 200, and warm-up and
    # FakeProxy passed it.
    row = {"X": tensor([1.0, 2.0], "FP32")}
    with FakeProxy(StreamsY()) as proxy:
        ((good,),) = [s.chunks for s in proxy.stream([row])]
    assert getattr(good["Y"], "tolist", lambda: good["Y"])() == [1.0, 2.0]
    with FakeProxy(LacksY(), warm_up=False) as proxy:
        (lacking,) = proxy.stream([row])
    assert lacking == Stream([], "error", lacking.message)
    assert "output 'Y' is missing from the result ('Y' declared)" in lacking.message
    with FakeProxy(NoDict()) as proxy:
        (listed,) = proxy.stream([row])
    assert listed.status == "error" and "returns a dict from output name" in listed.message
    with pytest.raises(TypeError, match="output 'Y' is missing from the result"):
        LacksY().warm_up()


class NT(NamedTuple):
    Y: list


class Row(msgspec.Struct):
    Y: list


class ArrayRow(msgspec.Struct, array_like=True):
    Y: list


@pytest.mark.parametrize(
    ("declared", "shown"),
    [
        (NT, "NT"),
        (tuple[list], "tuple[list]"),
        (list[Row], "list["),
        (set[int], "set[int]"),
        (Optional[NT], "typing.Optional["),
        (typing.Annotated[NT, msgspec.Meta(title="row")], "typing.Annotated["),
        (Optional[ArrayRow], "typing.Optional["),
    ],
)
def test_a_type_written_as_an_array_is_refused_beside_declared_tensors(declared, shown):
    # Accepted, every request failed: a 500 for each result (no map of the outputs), a 422
    # "Expected `array`, got `object`" for each v2 row (a map of the inputs).
    with pytest.raises(TypeError, match=r"output_type .* is written as an array: .* outputs") as e:

        class Answers(corral.Worker):
            outputs = (Y,)
            output_type = declared

            def forward(self, batch):
                return batch

    assert f"Answers.output_type {shown}" in str(e.value)
    with pytest.raises(TypeError, match=r"input_type .* is written as an array: .* inputs"):

        class Takes(corral.Worker):
            inputs = (X,)
            input_type = declared

            def forward(self, batch):
                return batch


def test_a_type_that_may_be_a_map_or_declares_no_tensors_is_left_alone():
    for declared in (Row, typing.Union[NT, Row], dict[str, Any], Any, Optional[Row]):

        class Answers(corral.Worker):
            outputs = (Y,)
            output_type = declared

            def forward(self, batch):
                return batch

    class Untensored(corral.Worker):  # no tensors: an array is any worker's to answer
        output_type = NT
        input_type = tuple[list]

        def forward(self, batch):
            return batch


@pytest.fixture
def real_np():
    return pytest.importorskip("numpy")


def test_a_ragged_native_row_and_output_are_told_in_the_package_s_words(real_np):
    # numpy's own ("setting an array element with a sequence. The requested array has an
    # inhomogeneous shape after 1 dimensions...") had reached the client.
    class Ragged(corral.Worker):
        inputs = (corral.Tensor("X", "INT8", [-1, 2]),)
        outputs = (corral.Tensor("Y", "INT8", [-1, 2]),)

        def forward(self, rows):
            return [{"Y": [[1, 2], [3]]} for _ in rows]

    with FakeProxy(Ragged()) as proxy:
        (refused,) = proxy.infer([{"X": [[1, 2], [3]]}])
        (failed,) = proxy.infer([{"X": [[1, 2]]}])
    words = "nested lists are not rectangular (lists of unequal lengths"
    assert refused.status == "invalid" and words in refused.message, refused
    assert failed.status == "error" and words in failed.message, failed
    for result in (refused, failed):
        assert "inhomogeneous" not in result.message and "sequence" not in result.message


@pytest.mark.parametrize("numpy", ["numpy", "lists"])
def test_a_finite_value_past_fp16_s_range_is_told_alike_with_numpy_and_without(numpy, monkeypatch):
    # Without numpy it had been struct's "float too large to pack with e format".
    if numpy == "numpy":
        pytest.importorskip("numpy")
    else:
        monkeypatch.setattr(_tensors, "numpy", lambda: None)
    for datatype, value in (("FP16", [70000.0]), ("FP32", [1e300])):
        with pytest.raises(ValueError, match=rf"^a finite value is past {datatype}'s range$"):
            _tensors.encode(value, datatype)
    with pytest.raises(ValueError, match=r"nested lists are not rectangular \(lists of unequal"):
        _tensors.encode([[1, 2], [3]], "INT8")
