"""What a worker that declares tensors is held to, beyond the values themselves (test_tensors):
a streamed chunk not held to them (it may carry part), a type written as an array refused beside
them where the class is defined, and a value that cannot be a tensor told in the
package's words, with numpy or without."""

from __future__ import annotations

import typing
from typing import Any, NamedTuple, Optional

import msgspec
import pytest

import corral
from corral import _tensors
from corral.testing import FakeProxy, tensor

X = corral.Tensor("X", "FP32", [2])
Y = corral.Tensor("Y", "FP32", [2])


class Partial(corral.Worker):
    """Streams each row's text first, and its log-probabilities with the last chunk."""

    inputs = (X,)
    outputs = (corral.Tensor("text", "BYTES", [-1]), corral.Tensor("logprobs", "FP32", [-1]))
    examples = ({"X": [1.0, 2.0]},)

    def forward(self, rows):
        yield [{"text": [b"a"]} for _ in rows]
        yield [{"text": [b"b"], "logprobs": [-0.5, -0.25]} for _ in rows]


def test_a_streamed_chunk_may_carry_part_of_the_declared_outputs():
    # A chunk is no result: held to the declared outputs as one (a reviewer caught it), a
    # token stream whose log-probabilities come last failed warm-up and never served.
    row = {"X": tensor([1.0, 2.0], "FP32")}
    with FakeProxy(Partial()) as proxy:
        (stream,) = proxy.stream([row])
    assert stream.status == "end" and len(stream.chunks) == 2, stream
    assert "logprobs" not in stream.chunks[0] and "logprobs" in stream.chunks[1]


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
    # An integer too: without numpy, struct's "int too large to convert" for 70000.
    for datatype, value in (("FP16", [70000.0]), ("FP32", [1e300]), ("FP16", [70000])):
        with pytest.raises(ValueError, match=rf"^a finite value is past {datatype}'s range$"):
            _tensors.encode(value, datatype)
    with pytest.raises(ValueError, match=r"nested lists are not rectangular \(lists of unequal"):
        _tensors.encode([[1, 2], [3]], "INT8")
