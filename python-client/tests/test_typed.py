"""Typed workers: requests validated by msgspec straight from msgpack, 422 with the path of the
bad field for that item alone, and the schemas sent in the hello."""

from __future__ import annotations

import json

import msgspec

import corral
from corral.testing import FakeProxy, Result


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


def test_an_input_type_msgspec_cannot_decode_fails_before_the_hello():
    """It once said hello (ready), then died at every batch and was restarted for ever."""

    class A(msgspec.Struct):
        x: int

    class B(msgspec.Struct):
        y: int

    class Untagged(corral.Worker):
        input_type = A | B

        def forward(self, batch):
            return batch

    import socket

    import pytest

    proxy, worker = socket.socketpair()
    with proxy, worker:
        with pytest.raises(TypeError, match="Struct"):
            Untagged().serve(worker)
        proxy.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing was said: no hello went out
            proxy.recv(1)
