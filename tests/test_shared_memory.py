"""Large raw bodies through shared memory (PROTOCOL.md, "Shared memory"): a worker that declares
`shm` gets the proxy's memory file, read-only, with its first frame, and a raw body of 64 KiB and
more as `payload_at` into it instead of in the batch frame. Workers that do not ask, a proxy
that shares none and a memory too full for a body all fall back to the frame, and every body
comes back as it was sent.

The first tests script the worker by hand (raw frames, `recvmsg`), to see exactly what the
proxy sends; the last ones run the Python package's own worker under load.
"""

from __future__ import annotations

import array
import fcntl
import json
import mmap
import os
import random
import socket
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest

from conftest import ECHO
from corral import _protocol as protocol

RAW = {"content-type": "application/octet-stream", "accept": "application/octet-stream"}
LARGE = 100_000  # over the 64 KiB from which a raw body goes to shared memory
SHARED_BYTES = 4 * 1024 * 1024


class ShmWorker:
    """A worker that declares `shm` and reads the proxy's first frame with `recvmsg`."""

    def __init__(self, path, features=("shm",), inputs=None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        hello = protocol.hello(
            "default", os.getpid(), "shm-test", features=list(features), inputs=inputs
        )
        self.sock.sendall(protocol.encode_frame(hello))
        self.stream = None
        self.fds: list[int] = []

    def first(self):
        """The first frame, and the descriptors that came with it."""
        fds = array.array("i")
        header = b""
        while len(header) < 4:
            data, ancillary, _, _ = self.sock.recvmsg(4 - len(header), socket.CMSG_SPACE(16))
            assert data, "closed before the first frame"
            header += data
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        self.fds = list(fds)
        length = int.from_bytes(header, "big")
        self.stream = self.sock.makefile("rb")
        return protocol.decode_body(self.stream.read(length)), self.fds

    def receive(self):
        return protocol.read_frame(self.stream)

    def send(self, message) -> None:
        self.sock.sendall(protocol.encode_frame(message))

    def close(self) -> None:
        """Close the connection (again: a no-op)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.stream:
            self.stream.close()
        self.sock.close()


def v2_header(rows: int, row_bytes: int) -> bytes:
    """The JSON header of a binary v2 request of one UINT8 input, `rows` rows of `row_bytes`."""
    data = {"binary_data_size": rows * row_bytes}
    inputs = [
        {"name": "INPUT0", "datatype": "UINT8", "shape": [rows, row_bytes], "parameters": data}
    ]
    return json.dumps({"inputs": inputs}).encode()


def in_place_row_end(header: bytes) -> int:
    """Where a one-row binary v2 request's row ends when it lies in place in the memory's first
    slot: after the JSON header, the room left for the row's head, and the data."""
    head_room = 256  # v2::request::HEAD_ROOM
    return len(header) + head_room + LARGE


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as executor:
        yield executor


def post_raw(proxy, body: bytes):
    return proxy.client.post("/infer", content=body, headers=RAW)


def test_a_large_raw_body_reaches_a_worker_that_asks_through_shared_memory(corral_factory, pool):
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", "--max-wait-ms=0", worker=None)
    worker = ShmWorker(proxy.socket)
    try:
        shm, fds = worker.first()
        assert shm == {"type": "shm", "size": SHARED_BYTES}
        assert len(fds) == 1
        # Read-only: the worker cannot write into the proxy's memory.
        assert fcntl.fcntl(fds[0], fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(PermissionError):
            mmap.mmap(fds[0], SHARED_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
        # Nor by reopening it read-write: the file is sealed against writes and resizing.
        try:
            writable = os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
        except PermissionError:
            pass
        else:
            try:
                with pytest.raises(PermissionError):
                    os.pwrite(writable, b"x", 0)
                with pytest.raises(PermissionError):
                    os.ftruncate(writable, 0)
                with pytest.raises(PermissionError):
                    mmap.mmap(writable, SHARED_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
            finally:
                os.close(writable)
        memory = mmap.mmap(fds[0], SHARED_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        proxy.wait_for_log(r"worker connected")

        large, small = os.urandom(LARGE), os.urandom(1000)
        cases = [(large, True, False), (small, False, False)]
        # A chunked body (no Content-Length) is kept as it comes and copied once its length is
        # known: into the memory as well when it is large enough.
        cases += [(large, True, True), (small, False, True)]
        for body, shared, chunked in cases:
            content = iter([body[: len(body) // 3], body[len(body) // 3 :]]) if chunked else body
            answer = pool.submit(proxy.client.post, "/infer", content=content, headers=RAW)
            (job,) = worker.receive()["jobs"]
            if shared:
                offset, length = job["payload_at"]
                assert job["payload"] == b"" and length == LARGE + 5
                payload = memory[offset : offset + length]
            else:
                assert "payload_at" not in job, "a small body travels in its frame"
                payload = job["payload"]
            assert payload == b"\xc6" + len(body).to_bytes(4, "big") + body
            worker.send(protocol.results([protocol.ok(job["id"], payload)]))
            response = answer.result(timeout=30)
            assert response.status_code == 200 and response.content == body
        memory.close()
    finally:
        worker.close()


def test_msgpack_bodies_and_v2_rows_reach_it_through_shared_memory_too(corral_factory, pool):
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", "--max-wait-ms=0", worker=None)
    inputs = [{"name": "INPUT0", "datatype": "UINT8", "shape": [-1]}]
    worker = ShmWorker(proxy.socket, inputs=inputs)
    try:
        _, fds = worker.first()
        memory = mmap.mmap(fds[0], SHARED_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        proxy.wait_for_log(r"worker connected")

        # A msgpack body is its payload as it came, read where it lies.
        value = {"blob": os.urandom(LARGE)}
        body = msgpack.packb(value)
        headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
        answer = pool.submit(proxy.client.post, "/infer", content=body, headers=headers)
        (job,) = worker.receive()["jobs"]
        offset, length = job["payload_at"]
        assert memory[offset : offset + length] == body
        worker.send(protocol.results([protocol.ok(job["id"], msgpack.packb(len(body)))]))
        assert msgpack.unpackb(answer.result(timeout=30).content) == len(body)

        # A binary v2 row is read from the memory too: its msgpack head and its data.
        proxy.wait_until(lambda: proxy.metric("corral_shared_memory_used_bytes") == 0)
        data = os.urandom(LARGE)
        header = v2_header(rows=1, row_bytes=LARGE)
        answer = pool.submit(
            proxy.client.post,
            "/v2/models/default/infer",
            content=header + data,
            headers={"inference-header-content-length": str(len(header))},
        )
        (job,) = worker.receive()["jobs"]
        offset, length = job["payload_at"]
        # A request of one row lies in one piece of its body (its head written into room left
        # after the JSON header), which took the memory's first slot: no second copy was made
        # to gather it (a gathered row would lie in a slot after the body's).
        assert offset + length == in_place_row_end(header)
        row = msgpack.unpackb(memory[offset : offset + length])
        datatype, shape, elements = msgpack.unpackb(row["INPUT0"].data)
        assert (datatype, shape, elements) == ("UINT8", [LARGE], data)
        worker.send(protocol.results([protocol.ok(job["id"], msgpack.packb({"OUTPUT0": 7}))]))
        response = answer.result(timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [7]

        # Two rows: each is gathered, head and data, into a piece of the memory of its own.
        proxy.wait_until(lambda: proxy.metric("corral_shared_memory_used_bytes") == 0)
        header = v2_header(rows=2, row_bytes=LARGE)
        answer = pool.submit(
            proxy.client.post,
            "/v2/models/default/infer",
            content=header + data + data,
            headers={"inference-header-content-length": str(len(header))},
        )
        jobs = worker.receive()["jobs"]
        assert len(jobs) == 2
        for job in jobs:
            offset, length = job["payload_at"]
            elements = msgpack.unpackb(
                msgpack.unpackb(memory[offset : offset + length])["INPUT0"].data
            )[2]
            assert elements == data
        worker.send(
            protocol.results([protocol.ok(j["id"], msgpack.packb({"OUTPUT0": 7})) for j in jobs])
        )
        assert answer.result(timeout=30).json()["outputs"][0]["data"] == [7, 7]

        # A chunked body (no length to reserve a slot by) goes to the memory once its length is
        # known, with the same room after its header: its one row lies in place as well.
        proxy.wait_until(lambda: proxy.metric("corral_shared_memory_used_bytes") == 0)
        header = v2_header(rows=1, row_bytes=LARGE)
        answer = pool.submit(
            proxy.client.post,
            "/v2/models/default/infer",
            content=iter([header, data]),
            headers={"inference-header-content-length": str(len(header))},
        )
        (job,) = worker.receive()["jobs"]
        offset, length = job["payload_at"]
        assert offset + length == in_place_row_end(header)
        row = msgpack.unpackb(memory[offset : offset + length])
        assert msgpack.unpackb(row["INPUT0"].data)[2] == data
        worker.send(protocol.results([protocol.ok(job["id"], msgpack.packb({"OUTPUT0": 7}))]))
        assert answer.result(timeout=30).json()["outputs"][0]["data"] == [7]
        memory.close()
    finally:
        worker.close()


def echoed_in_its_frame(proxy, worker: ShmWorker, pool) -> None:
    """A large raw body reaches `worker` in its batch frame (no `payload_at`), and comes back."""
    body = os.urandom(LARGE)
    answer = pool.submit(post_raw, proxy, body)
    message = worker.receive()
    assert message["type"] == "batch", "a batch, and no shm frame before it"
    (job,) = message["jobs"]
    assert "payload_at" not in job and job["payload"][5:] == body
    worker.send(protocol.results([protocol.ok(job["id"], job["payload"])]))
    assert answer.result(timeout=30).content == body


def test_a_worker_that_does_not_ask_gets_large_bodies_in_its_frames(corral_factory, pool):
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", "--max-wait-ms=0", worker=None)
    worker = ShmWorker(proxy.socket, features=())
    try:
        proxy.wait_for_log(r"worker connected")
        worker.stream = worker.sock.makefile("rb")  # no shm frame to read first: none is sent
        echoed_in_its_frame(proxy, worker, pool)
    finally:
        worker.close()


def test_a_streaming_worker_gets_the_memory_but_its_payloads_in_frames(corral_factory, pool):
    # Its jobs may be answered (a slow client) while it still holds them: a slot freed then could
    # be taken again before it read it, so its payloads always travel in the frame.
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", "--max-wait-ms=0", worker=None)
    worker = ShmWorker(proxy.socket, features=("stream", "shm"))
    try:
        shm, fds = worker.first()
        assert shm == {"type": "shm", "size": SHARED_BYTES} and len(fds) == 1
        proxy.wait_for_log(r"worker connected")
        echoed_in_its_frame(proxy, worker, pool)
    finally:
        worker.close()


@pytest.mark.parametrize(
    "size",
    [
        "0",
        # More than the address space: the memory cannot be made, which is logged, not fatal.
        str(2**64 - 1),
        # Less than the smallest body it takes (64 KiB): none could use it, so none is made
        # (the log had said large bodies went through it, and each one counted it full).
        "4095",
    ],
)
def test_a_proxy_without_shared_memory_says_so_and_sends_bodies_in_frames(
    corral_factory, pool, size
):
    proxy = corral_factory(f"--shared-memory-bytes={size}", "--max-wait-ms=0", worker=None)
    worker = ShmWorker(proxy.socket)
    try:
        shm, fds = worker.first()
        assert shm == {"type": "shm", "size": 0} and fds == []
        proxy.wait_for_log(r"worker connected")
        echoed_in_its_frame(proxy, worker, pool)
        if size == "4095":
            proxy.wait_for_log(r"less than the 64 KiB the smallest shared body takes")
    finally:
        worker.close()


def test_a_body_its_client_abandons_gives_its_slot_back(corral_factory):
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", worker=None)
    host, port = proxy.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    try:
        head = (
            "POST /infer HTTP/1.1\r\nhost: corral\r\n"
            "content-type: application/octet-stream\r\ncontent-length: 1000000\r\n\r\n"
        )
        client.sendall(head.encode() + os.urandom(200_000))
        # Its whole declared length is held from the first bytes on...
        proxy.wait_until(
            lambda: proxy.metric("corral_shared_memory_used_bytes") >= 1_000_000,
            what="the body's slot",
        )
    finally:
        client.close()  # ...and given back when the client goes, the body unfinished.
    proxy.wait_until(
        lambda: proxy.metric("corral_shared_memory_used_bytes") == 0, what="the slot given back"
    )
    assert proxy.metric("corral_shared_memory_full_total") == 0


def test_a_worker_that_dies_holding_a_shared_body_leaves_it_whole_for_the_retry(
    corral_factory, pool
):
    proxy = corral_factory(f"--shared-memory-bytes={SHARED_BYTES}", "--max-wait-ms=0", worker=None)
    first = ShmWorker(proxy.socket)
    second = None
    try:
        first.first()
        proxy.wait_for_log(r"worker connected")
        body = os.urandom(LARGE)
        answer = pool.submit(post_raw, proxy, body)
        (job,) = first.receive()["jobs"]
        assert "payload_at" in job
        second = ShmWorker(proxy.socket)
        _, fds = second.first()
        proxy.wait_for_log(r"worker connected", count=2)
        first.close()  # gone with the job: the proxy retries it on the other worker
        (retried,) = second.receive()["jobs"]
        offset, length = retried["payload_at"]
        with mmap.mmap(fds[0], SHARED_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
            payload = m[offset : offset + length]
        assert payload == b"\xc6" + len(body).to_bytes(4, "big") + body
        second.send(protocol.results([protocol.ok(retried["id"], payload)]))
        assert answer.result(timeout=30).content == body
        proxy.wait_until(
            lambda: proxy.metric("corral_shared_memory_used_bytes") == 0, what="memory given back"
        )
    finally:
        first.close()
        if second:
            second.close()


@pytest.mark.parametrize(
    "shared_bytes",
    [
        SHARED_BYTES,
        # Room for about two bodies at once: the rest find it full and go in frames.
        600 * 1024,
    ],
)
def test_many_large_bodies_at_once_each_come_back_as_sent(corral_factory, pool, shared_bytes):
    proxy = corral_factory(
        f"--shared-memory-bytes={shared_bytes}", "--max-batch-size=4", worker=ECHO
    )
    # The package's worker maps the proxy's memory file (once it has read the shm frame).
    proxy.wait_for_log(r"worker connected")
    (pid,) = proxy.worker_pids()

    def mapped() -> bool:
        with open(f"/proc/{pid}/maps") as maps:
            return "corral-bodies" in maps.read()

    proxy.wait_until(mapped, what="the worker's mapping")
    rng = random.Random(7)
    bodies = [rng.randbytes(rng.choice([70_000, 150_000, 300_000, 2000])) for _ in range(80)]
    responses = list(pool.map(lambda body: post_raw(proxy, body), bodies))
    for body, response in zip(bodies, responses):
        assert response.status_code == 200, response.text
        assert response.content == body
    # Every slot is given back once its job is done.
    proxy.wait_until(
        lambda: proxy.metric("corral_shared_memory_used_bytes") == 0, what="memory given back"
    )
    full = proxy.metric("corral_shared_memory_full_total")
    if shared_bytes < SHARED_BYTES:
        assert full > 0, "some bodies found the small memory full"
    # A body as large as the whole memory fits again.
    whole = rng.randbytes(shared_bytes - 5)
    response = post_raw(proxy, whole)
    assert response.status_code == 200 and response.content == whole
    assert proxy.metric("corral_shared_memory_full_total") == full


@pytest.mark.parametrize("chunked", [False, True], ids=["with length", "chunked"])
def test_64_clients_of_multi_mib_bodies_each_get_their_own_back(corral_factory, chunked):
    # 64 clients of 2 MiB at once through the package's worker: 128 MiB in flight, with room in
    # the memory for 16 bodies, so that bodies in shared memory and bodies that found it full
    # (and went over the socket, in frames far past its buffer) share batches. Chunked bodies
    # (64 KiB pieces) take a slot once complete, on the same terms.
    proxy = corral_factory(
        f"--shared-memory-bytes={32 * 1024 * 1024}", "--timeout-ms=120000", worker=ECHO
    )
    proxy.wait_for_log(r"worker connected")
    bodies = [random.Random(i).randbytes(2 * 1024 * 1024) for i in range(64)]

    def send(body: bytes):
        if not chunked:
            return post_raw(proxy, body)
        pieces = iter([body[at : at + 65536] for at in range(0, len(body), 65536)])
        return proxy.client.post("/infer", content=pieces, headers=RAW)

    with ThreadPoolExecutor(64) as clients:
        responses = list(clients.map(send, bodies))
    for body, response in zip(bodies, responses):
        assert response.status_code == 200, response.text
        assert response.content == body
    assert proxy.metric("corral_shared_memory_full_total") > 0, "some went over the socket"
    proxy.wait_until(
        lambda: proxy.metric("corral_shared_memory_used_bytes") == 0, what="memory given back"
    )
