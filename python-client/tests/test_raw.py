"""Raw bytes: a job of a request that was neither JSON nor msgpack is an item of ``bytes`` with its
media type in ``content_type`` / ``content_types``; outputs that are bytes name theirs with
``output_content_type``. Against the fake proxy over a real socket pair."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import msgpack
import pytest

import corral
from corral import _protocol as protocol
from corral._errors import ProtocolError
from corral.testing import FakeProxy, Result, Stream, _payload

VECTORS = Path(__file__).resolve().parents[2] / "worker-protocol" / "vectors"

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


class Seen(corral.Worker):
    """Records what each hook saw; answers each raw item with its bytes reversed (bytes) and
    every other item with a description (not bytes)."""

    output_content_type = "image/png"

    def __init__(self):
        self.preprocessed = []  # (item, content_type) per item
        self.forwarded = []  # content_types per batch
        self.postprocessed = []  # content_type per output

    def preprocess(self, item):
        self.preprocessed.append((item, self.content_type))
        return item

    def forward(self, batch):
        self.forwarded.append(list(self.content_types))
        return [
            item[::-1] if named is not None else {"kind": type(item).__name__}
            for item, named in zip(batch, self.content_types)
        ]

    def postprocess(self, output):
        self.postprocessed.append(self.content_type)
        return output


def test_a_raw_item_is_bytes_with_its_media_type_in_every_hook():
    worker = Seen()
    with FakeProxy(worker) as proxy:
        results = proxy.infer([PNG, {"x": 1}, b"\x00\x01"], content_type=["image/png", None, "a/b"])
    assert worker.preprocessed == [(PNG, "image/png"), ({"x": 1}, None), (b"\x00\x01", "a/b")]
    assert worker.forwarded == [["image/png", None, "a/b"]]
    assert worker.postprocessed == ["image/png", None, "a/b"]
    assert results == [
        Result("ok", PNG[::-1], content_type="image/png"),
        Result("ok", {"kind": "dict"}),  # not bytes: no content type
        Result("ok", b"\x01\x00", content_type="image/png"),
    ]
    assert worker.content_type is None  # nothing left over between batches


def test_the_media_type_is_passed_as_sent_parameters_included():
    worker = Seen()
    with FakeProxy(worker) as proxy:
        proxy.infer([b"x"], content_type="text/plain; charset=latin-1")
    assert worker.preprocessed == [(b"x", "text/plain; charset=latin-1")]


class Plain(corral.Worker):
    """No output_content_type: bytes go back without one."""

    def forward(self, batch):
        return [bytes(item) for item in batch]


def test_bytes_without_output_content_type_name_no_type():
    with FakeProxy(Plain()) as proxy:
        (result,) = proxy.infer([PNG], content_type="image/png")
    assert result == Result("ok", PNG, content_type=None)


class BytesOrPoint(corral.Worker):
    input_type = Union[bytes, dict[str, float]]  # (3.9: no `|` between types at run time)

    def forward(self, batch):
        return [len(item) for item in batch]


class PointOnly(corral.Worker):
    input_type = dict[str, float]

    def forward(self, batch):
        return [len(item) for item in batch]


def test_a_typed_worker_gets_bytes_where_its_type_takes_them():
    with FakeProxy(BytesOrPoint()) as proxy:
        results = proxy.infer([PNG, {"x": 1.0}], content_type=["image/png", None])
    assert [r.value for r in results] == [len(PNG), 1]
    with FakeProxy(PointOnly()) as proxy:
        raw, point = proxy.infer([PNG, {"x": 1.0}], content_type=["image/png", None])
    assert raw.status == "invalid" and "bytes" in raw.message
    assert point == Result("ok", 1)


@pytest.mark.parametrize(
    ("named", "said"),
    [
        *[(named, "must be a media type") for named in [42, "image png", "png", "image/pngé"]],
        # Well formed, and too long: told by its length, not as no media type.
        ("image/" + "p" * 1100, "is 1106 bytes, longer than the 1024 a media type may have"),
    ],
)
def test_an_output_content_type_the_proxy_would_refuse_fails_where_the_class_is_defined(
    named, said
):
    """The proxy answers every bytes output under such a name 500 `bad_output`; FakeProxy once
    passed it, so a worker's own tests did not see it."""
    with pytest.raises(TypeError, match=f"output_content_type {said}"):

        class Misnamed(corral.Worker):
            output_content_type = named

            def forward(self, batch):
                return batch


def test_an_output_content_type_with_parameters_is_a_media_type():
    class Text(corral.Worker):
        output_content_type = "text/plain; charset=utf-8"

        def forward(self, batch):
            return [b"hi" for _ in batch]

    with FakeProxy(Text()) as proxy:
        [answer] = proxy.infer([1])
    assert answer == Result("ok", b"hi", content_type="text/plain; charset=utf-8")


@pytest.mark.parametrize("media_type", ["text/plain ; charset=utf-8", "a/b;x=\ty"])
def test_a_media_type_the_proxy_takes_is_one_for_the_package_too(media_type):
    # A space before `;` and a tab among the parameters: the proxy takes both
    # (`format::media_type`), and a class naming them was a TypeError where it was defined.
    assert protocol.is_media_type(media_type)


@pytest.mark.parametrize("media_type", ["*/*", "image/*", "*/png"])
def test_a_range_of_media_types_is_no_output_s_type_for_the_package_as_for_the_proxy(media_type):
    # The proxy fails such an output 500 bad_output: a response names one type. A request may
    # send one (the proxy serves it), and FakeProxy takes it.
    assert protocol.is_range(media_type)
    with pytest.raises(TypeError, match="not a range"):

        class Ranged(corral.Worker):
            output_content_type = media_type

    for named in ("a/b; x=*", "application/vnd.a*b", "image/png*"):
        assert not protocol.is_range(named)
    with FakeProxy(Seen()) as proxy:
        assert proxy.infer([b"abc"], content_type=media_type)[0].status == "ok"


def test_a_content_type_that_is_not_a_string_is_a_protocol_error():
    with FakeProxy(Seen()) as proxy:
        payload = msgpack.packb(b"x")
        bad = {"id": b"\x01" * 16, "timeout_ms": 1000, "payload": payload, "content_type": 7}
        proxy.send(protocol.batch([bad]))
        assert proxy.receive() is None  # the worker hung up
    assert isinstance(proxy.worker_error, corral.ProtocolError)
    assert "content_type" in str(proxy.worker_error)


class Kinds(corral.Worker):
    """Streams, per item, its length and then its media type (as postprocess saw it)."""

    def forward(self, items):
        yield [len(item) for item in items]
        yield [named or "none" for named in self.content_types]

    def postprocess(self, chunk):
        return [chunk, self.content_type]


def test_a_streaming_forward_sees_content_types_aligned_with_its_positions():
    with FakeProxy(Kinds()) as proxy:
        streams = proxy.stream([PNG, [1, 2], b"ab"], content_type=["image/png", None, "a/b"])
    assert streams == [
        Stream([[len(PNG), "image/png"], ["image/png", "image/png"]], "end"),
        Stream([[2, None], ["none", None]], "end"),
        Stream([[2, "a/b"], ["a/b", "a/b"]], "end"),
    ]


class Thumb(corral.Worker):
    """A raw PNG in, its first bytes out; warmed up on a raw example."""

    output_content_type = "image/png"
    examples = (PNG,)

    def __init__(self):
        self.forwarded = []

    def forward(self, images):
        self.forwarded.append(list(self.content_types))
        return [image[:8] for image in images]


def test_examples_run_as_bytes_with_no_content_type():
    worker = Thumb()
    worker.warm_up()
    assert worker.forwarded == [[None]]
    with FakeProxy(worker) as proxy:
        (result,) = proxy.infer([PNG], content_type="image/png")
    assert result == Result("ok", PNG[:8], content_type="image/png")
    assert worker.forwarded[-1] == ["image/png"]


def test_fake_proxy_sends_raw_bytes_as_the_proxy_does():
    # The proxy's own frame (the golden vector): the body in one bin32, whatever its length.
    golden = protocol.decode_body((VECTORS / "batch_raw.bin").read_bytes()[4:])["jobs"][0]
    assert _payload(b"\x89PNG", "image/png") == golden["payload"]
    assert msgpack.unpackb(golden["payload"]) == b"\x89PNG"


def large_batch(payload, **extra) -> bytes:
    """A batch frame body over the size from which payloads are read as views."""
    job = {"id": b"j" * 16, "timeout_ms": 1000, "payload": payload, **extra}
    return msgpack.packb({"type": "batch", "jobs": [job, job]}, use_bin_type=True)


def test_a_large_batchs_payloads_are_views_into_its_frame_not_copies():
    body = _payload(PNG * 4000, "image/png")  # 192 KB raw, behind its bin32 header
    frame = large_batch(
        body, content_type="image/png", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    )
    message = protocol.decode_body(frame)
    assert message == msgpack.unpackb(frame), "the same message as the plain reading"
    for job in message["jobs"]:
        assert isinstance(job["payload"], memoryview) and job["payload"].obj is frame
        assert "tracestate" not in job, "a key the job did not carry is not there"
    # The item is the body's bytes, as from a copied payload.
    item = corral._typing.codec(Seen).decode(message["jobs"][0]["payload"])
    assert type(item) is bytes and item == PNG * 4000


def test_a_large_batch_mixing_shared_memory_and_inline_jobs_is_read_without_copies():
    # The proxy's memory full: one job's body in shared memory (payload_at), the next in the
    # frame. Both stay on the view reading, payload_at kept for the worker to resolve.
    inline = {"id": b"b" * 16, "timeout_ms": 1000, "payload": b"x" * 100_000}
    shared = {"id": b"a" * 16, "timeout_ms": 1000, "payload": b"", "payload_at": [0, 5]}
    frame = msgpack.packb({"type": "batch", "jobs": [shared, inline]}, use_bin_type=True)
    message = protocol.decode_body(frame)
    assert message == msgpack.unpackb(frame), "the same message as the plain reading"
    assert message["jobs"][0]["payload_at"] == [0, 5]
    assert all(isinstance(job["payload"], memoryview) for job in message["jobs"])
    assert message["jobs"][1]["payload"].obj is frame


def test_a_large_batch_the_view_reading_refuses_is_read_as_before():
    # A payload that is not a bin, a key the protocol does not have, a value of another type:
    # the plain reading decodes each as it did, keeping what it finds for the checks downstream.
    for frame in [
        large_batch("x" * 100_000),
        large_batch(b"x" * 100_000, future_key=1),
        large_batch(b"x" * 100_000, content_type=7),
    ]:
        message = protocol.decode_body(frame)
        assert message == msgpack.unpackb(frame, raw=False)
        assert not isinstance(message["jobs"][0]["payload"], memoryview)


def test_a_large_batch_with_bad_utf8_is_a_protocol_error_as_before():
    frame = large_batch(b"x" * 100_000, content_type="image/png")
    broken = frame.replace(b"image/png", b"image/p\xffg")
    with pytest.raises(ProtocolError):
        protocol.decode_body(broken)


def test_payloads_are_views_only_from_a_frame_of_64_kib():
    small = msgpack.packb(
        {"type": "batch", "jobs": [{"id": b"j" * 16, "timeout_ms": 1, "payload": b"x" * 1000}]}
    )
    assert type(protocol.decode_body(small)["jobs"][0]["payload"]) is bytes


def test_a_typed_workers_items_do_not_keep_the_frame_alive():
    class Typed(corral.Worker):
        input_type = bytes

        def forward(self, batch):
            return batch

    frame = large_batch(_payload(b"y" * 100_000, "application/octet-stream"))
    view = protocol.decode_body(frame)["jobs"][0]["payload"]
    item = corral._typing.codec(Typed).decode(view)
    assert item == b"y" * 100_000 and type(item) is bytes
