"""The worker's side of shared memory (PROTOCOL.md, "Shared memory"): the first frame read with
its descriptor, payloads given from the mapping, and a proxy that breaks the rules refused as a
protocol error, never a crash or a read outside the mapping."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import TypedDict

import msgpack
import msgspec
import pytest

import corral
from corral import _protocol as protocol
from corral import _shared_memory as shared_memory
from corral import _typing
from corral._errors import ProtocolError

SIZE = 1 << 16

pytestmark = pytest.mark.skipif(
    not hasattr(os, "memfd_create") or not shared_memory.features(),
    reason="memory files and descriptor passing (Linux)",
)


@pytest.fixture
def pair():
    proxy, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with proxy, worker:
        worker.settimeout(10)
        yield proxy, worker


def memory_file(content: bytes) -> int:
    fd = os.memfd_create("test-bodies")
    os.ftruncate(fd, SIZE)
    os.pwrite(fd, content, 0)
    return fd


def send_shm(proxy: socket.socket, size: int, fds: list[int]) -> None:
    frame = protocol.encode_frame({"type": "shm", "size": size})
    socket.send_fds(proxy, [frame], fds)


def test_the_shm_frame_gives_the_memory_and_payloads_point_into_it(pair):
    proxy, worker = pair
    body = msgpack.packb(b"a large body")
    fd = memory_file(b"\0" * 4096 + body)
    send_shm(proxy, SIZE, [fd])
    os.close(fd)
    memory, first = shared_memory.first_frame(worker)
    assert first is None and memory.size == SIZE
    batch = protocol.batch(
        [{**protocol.job(b"\1" * 16, 100, b""), "payload_at": [4096, len(body)]}]
    )
    shared_memory.resolve(batch, memory)
    (job,) = batch["jobs"]
    assert "payload_at" not in job and bytes(job["payload"]) == body
    assert msgpack.unpackb(job["payload"]) == b"a large body"


def test_size_0_means_no_memory(pair):
    proxy, worker = pair
    proxy.sendall(protocol.encode_frame({"type": "shm", "size": 0}))
    assert shared_memory.first_frame(worker) == (None, None)


def test_a_proxy_that_sends_no_shm_frame_has_its_first_frame_kept_for_the_reader(pair):
    proxy, worker = pair
    batch = protocol.batch([protocol.job(b"\1" * 16, 100, b"\x01")])
    proxy.sendall(protocol.encode_frame(batch))
    assert shared_memory.first_frame(worker) == (None, batch)


@pytest.mark.parametrize(
    "where",
    [[SIZE - 1, 2], [-1, 1], [0, -1], ["0", 1], [0], [0, 1, 2], "0,1", [0, 2**70]],
)
def test_payload_at_outside_the_memory_or_malformed_is_a_protocol_error(pair, where):
    proxy, worker = pair
    fd = memory_file(b"")
    send_shm(proxy, SIZE, [fd])
    os.close(fd)
    memory, _ = shared_memory.first_frame(worker)
    batch = protocol.batch([{**protocol.job(b"\1" * 16, 100, b""), "payload_at": where}])
    with pytest.raises(ProtocolError):
        shared_memory.resolve(batch, memory)


def test_payload_at_without_shared_memory_is_a_protocol_error():
    batch = protocol.batch([{**protocol.job(b"\1" * 16, 100, b""), "payload_at": [0, 1]}])
    with pytest.raises(ProtocolError, match="without shared memory"):
        shared_memory.resolve(batch, None)


def test_an_shm_frame_of_a_size_without_a_descriptor_is_a_protocol_error(pair):
    proxy, worker = pair
    proxy.sendall(protocol.encode_frame({"type": "shm", "size": SIZE}))
    with pytest.raises(ProtocolError, match="without a descriptor"):
        shared_memory.first_frame(worker)


@pytest.mark.parametrize("size", [-1, "big", None])
def test_an_shm_frame_with_a_bad_size_is_a_protocol_error(pair, size):
    proxy, worker = pair
    proxy.sendall(protocol.encode_frame({"type": "shm", "size": size}))
    with pytest.raises(ProtocolError, match="size"):
        shared_memory.first_frame(worker)


def test_descriptors_are_closed_once_mapped(pair):
    proxy, worker = pair
    fd = memory_file(b"")
    send_shm(proxy, SIZE, [fd])
    os.close(fd)
    before = set(os.listdir("/proc/self/fd"))
    memory, _ = shared_memory.first_frame(worker)
    assert memory is not None
    # The received descriptor is closed; Python's mmap keeps a duplicate of its own (before
    # 3.13's trackfd=False), so at most one more is open, and none after the mapping goes.
    assert len(set(os.listdir("/proc/self/fd")) - before) <= 1
    del memory
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_connection_closed_before_any_frame_is_the_end_not_an_error(pair):
    proxy, worker = pair
    proxy.close()
    assert shared_memory.first_frame(worker) == (None, None)


def test_a_connection_closed_inside_the_first_header_is_a_protocol_error(pair):
    proxy, worker = pair
    proxy.sendall(b"\x00\x00")
    proxy.close()
    with pytest.raises(ProtocolError, match="inside a frame header"):
        shared_memory.first_frame(worker)


def test_a_connection_closed_inside_the_first_body_is_a_protocol_error(pair):
    proxy, worker = pair
    proxy.sendall(protocol.encode_frame({"type": "shm", "size": 0})[:-2])
    proxy.close()
    with pytest.raises(ProtocolError, match="inside a frame"):
        shared_memory.first_frame(worker)


def test_a_first_frame_larger_than_a_socket_buffer_is_read_whole(pair):
    # An older proxy sends no shm frame: its first frame may be a batch of megabytes, which a
    # socket with a timeout hands over a buffer at a time.
    proxy, worker = pair
    batch = protocol.batch([protocol.job(b"\1" * 16, 100, msgpack.packb(b"x" * (4 << 20)))])
    frame = protocol.encode_frame(batch)
    sender = threading.Thread(target=proxy.sendall, args=(frame,))
    sender.start()
    _, first = shared_memory.first_frame(worker)
    sender.join()
    assert msgpack.unpackb(first["jobs"][0]["payload"]) == b"x" * (4 << 20)


def test_an_shm_frame_larger_than_the_memory_file_is_a_protocol_error(pair):
    proxy, worker = pair
    fd = memory_file(b"")
    send_shm(proxy, 4 * SIZE, [fd])  # the file holds SIZE bytes
    os.close(fd)
    with pytest.raises(ProtocolError, match="cannot map"):
        shared_memory.first_frame(worker)


class Plain(corral.Worker):
    def forward(self, batch):
        return batch


class TypedAny(Plain):
    input_type = dict


class TypedBytes(Plain):
    input_type = bytes


class Viewed(msgspec.Struct):
    data: memoryview


class TypedView(Plain):
    input_type = Viewed


def tensor_payload(data: bytes) -> bytes:
    tensor = msgpack.packb(["UINT8", [len(data)], data])
    return msgpack.packb({"t": msgpack.ExtType(1, tensor)})


@pytest.mark.parametrize(
    "worker, payload, value",
    [
        (Plain, tensor_payload, lambda item: bytes(item["t"])),
        (TypedAny, tensor_payload, lambda item: bytes(item["t"])),
        (Plain, msgpack.packb, bytes),
        (TypedBytes, msgpack.packb, bytes),
        (TypedView, lambda data: msgpack.packb({"data": data}), lambda item: bytes(item.data)),
    ],
)
def test_an_item_stays_valid_once_the_proxy_reuses_its_memory(worker, payload, value):
    # A job's bytes in shared memory are the proxy's again once it is answered; the item the
    # model got (and may keep) is a copy, whatever the worker's types.
    data = bytes(range(256)) * 800
    body = payload(data)
    fd = os.memfd_create("test-bodies")
    os.pwrite(fd, body, 0)
    memory = shared_memory.Memory(fd, len(body))
    item = _typing.codec(worker).decode(memory.at(0, len(body)))
    os.pwrite(fd, b"\xff" * len(body), 0)  # the slot, taken for another body
    os.close(fd)
    assert value(item) == data


class _Leaf(msgspec.Struct):
    raw: msgspec.Raw


class _Tree(msgspec.Struct):
    children: list[_Tree]
    label: str


class _ViewTree(msgspec.Struct):
    children: list[_ViewTree]
    data: memoryview | None = None


@dataclasses.dataclass
class _Record:
    data: memoryview


class _Typed(TypedDict):
    data: memoryview


@pytest.mark.parametrize(
    "input_type, views",
    [
        (bytes, False),
        (dict[str, list[int]], False),
        (_Tree, False),  # recursive, walked once
        (memoryview, True),
        (msgspec.Raw, True),
        (dict[str, _Leaf], True),  # a Raw two levels down
        (list[_Leaf] | None, True),
        (memoryview | None, True),
        (_ViewTree, True),  # recursive, with a view
        (_Record, True),
        (_Typed, True),
    ],
)
def test_a_payload_is_copied_first_only_for_input_types_that_may_hold_views(input_type, views):
    # msgspec leaves memoryview and Raw values pointing into the buffer it decodes: only then
    # must a payload that views shared memory be copied before decoding (Codec.views_payload).
    assert _typing._has_views(msgspec.inspect.type_info(input_type)) is views


@pytest.mark.parametrize("size", [2**64 - 1, 2**63, -1])
def test_a_shared_memory_size_mmap_cannot_take_is_a_protocol_error(size):
    # OverflowError from mmap once escaped, and took a worker started by hand down.
    fd = os.memfd_create("test-size")
    try:
        with pytest.raises(ProtocolError, match="cannot map"):
            shared_memory.Memory(fd, size)
    finally:
        os.close(fd)


def test_an_shm_descriptor_the_kernel_dropped_says_the_worker_has_none_free():
    """A worker with no file descriptor free gets the frame without its descriptor (the kernel
    sets MSG_CTRUNC): it said "came without a descriptor", blaming the proxy."""
    frame = protocol.encode_frame({"type": "shm", "size": 4096})

    class Full:
        """A socket whose process had no descriptor free as the shm frame came."""

        def __init__(self) -> None:
            self.left = frame

        def recvmsg(self, size, ancillary_size, flags):
            data, self.left = self.left[:size], self.left[size:]
            return data, [], socket.MSG_CTRUNC, None

        def recv_into(self, view):
            count = min(len(view), len(self.left))
            view[:count], self.left = self.left[:count], self.left[count:]
            return count

    with pytest.raises(ProtocolError, match=r"no file descriptor free \(raise its limit"):
        shared_memory.first_frame(Full())  # type: ignore[arg-type]
