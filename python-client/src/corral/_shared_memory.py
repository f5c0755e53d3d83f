"""Payloads read from shared memory instead of the socket (the protocol's ``shm`` feature).

A worker that declares ``shm`` in its hello gets, as the proxy's first frame, ``shm``: the size
of the proxy's shared memory and, passed along with the frame's first bytes (``SCM_RIGHTS``), a
read-only descriptor of it (size 0 and no descriptor when the proxy shares none). A job of a
later batch may then carry ``payload_at: [offset, length]`` and an empty ``payload``: its
payload is those bytes of the mapping. :func:`resolve` gives such a job a ``memoryview`` of them
as its ``payload``, so that the rest of the package reads it like a payload from the frame; the
one copy is the item's own (``_typing.Codec.decode``), as for large frames.

Why: a 10 MB body over the socket was copied into it by the proxy and out of it here, in turns
of a socket buffer; from shared memory it is copied once, into the item (PROTOCOL.md, "Shared
memory"). The bytes stay put until the job's result is sent (or the connection ends), and a
job's result is sent after its item was decoded, so the view is not read once the proxy may
reuse the memory.

Lives here: :func:`features`, :func:`first_frame` (the one read that can receive a
descriptor), :class:`Memory` and :func:`resolve`.
"""

from __future__ import annotations

import array
import mmap
import os
import socket
import sys
from typing import Any

from corral import _protocol as protocol
from corral._errors import ProtocolError


def features() -> list[str]:
    """``["shm"]`` where this platform can receive a descriptor over the socket and map it."""
    supported = hasattr(socket, "CMSG_SPACE") and hasattr(socket.socket, "recvmsg")
    return ["shm"] if supported else []


class Memory:
    """The proxy's shared memory, mapped read-only."""

    def __init__(self, fd: int, size: int) -> None:
        # Python's mmap keeps a duplicate of the descriptor for its own `size()` and `resize()`,
        # which are not used here: from 3.13 it need not (`trackfd`), and the worker holds no
        # descriptor of the memory once `first_frame` closes the one it got. Before 3.13 that
        # duplicate lives as long as the mapping: one per connection, closed with it.
        untracked: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}
        try:
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, **untracked)
        # ValueError: a size past the end of the file; OverflowError: past what mmap takes.
        except (OSError, ValueError, OverflowError) as e:
            raise ProtocolError(f"cannot map the {size}-byte shared memory: {e}") from e
        self._view = memoryview(self._map)
        self.size = size

    def at(self, offset: Any, length: Any) -> memoryview:
        """The bytes at ``offset``; a protocol error where they are not all in the memory."""
        if not (
            isinstance(offset, int)
            and isinstance(length, int)
            and 0 <= offset
            and 0 <= length
            and offset + length <= self.size
        ):
            raise ProtocolError(
                f"payload_at {[offset, length]} is not within the {self.size}-byte shared memory"
            )
        return self._view[offset : offset + length]


def first_frame(sock: socket.socket) -> tuple[Memory | None, dict[str, Any] | None]:
    """Reads the proxy's first frame after a hello that declared ``shm``, with ``recvmsg``: the
    only read that receives a descriptor. Returns the memory from a ``shm`` frame (None when the
    proxy shares none), or, from a proxy that sends no ``shm`` frame (an older one, or the test
    double), None and the frame it sent instead, for the reader to take first. Every descriptor
    received is closed by the time it returns or raises (a mapping keeps its memory)."""
    fds = array.array("i")
    # Not inherited by the model's own subprocesses in the moment before it is closed (and why
    # this is recvmsg by hand: socket.recv_fds ignores its flags).
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    truncated = False  # the kernel dropped a descriptor: this process had no number free
    try:
        header = b""
        while len(header) < protocol.HEADER_BYTES:
            data, ancillary, got_flags, _addr = sock.recvmsg(
                protocol.HEADER_BYTES - len(header), socket.CMSG_SPACE(fds.itemsize), flags
            )
            truncated |= bool(got_flags & getattr(socket, "MSG_CTRUNC", 0))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % fds.itemsize
                    fds.frombytes(payload[:usable])
            if not data:
                if not header:
                    return None, None  # closed before a frame: the reader sees the same
                break  # closed inside the header: frame_length says so
            header += data
        body = bytearray(protocol.frame_length(header))
        view, got = memoryview(body), 0
        while got < len(body):  # one recv may return less (a signal, a socket with a timeout)
            received = sock.recv_into(view[got:])
            if not received:
                raise ProtocolError("connection closed inside a frame")
            got += received
        message = protocol.decode_body(bytes(body))
        if message["type"] != "shm":
            return None, message
        size = message.get("size")
        if not isinstance(size, int) or size < 0:
            raise ProtocolError("a shm frame needs a size (an integer)")
        if size == 0:
            return None, None
        if not fds and truncated:
            raise ProtocolError(
                "the shared memory's descriptor was dropped on its way in: this process has "
                "no file descriptor free (raise its limit, ulimit -n, or close what it holds)"
            )
        if not fds:
            raise ProtocolError("a shm frame of a size came without a descriptor")
        return Memory(fds[0], size), None
    finally:
        for fd in fds:  # the mapping keeps the memory (see `Memory` for mmap's own duplicate)
            os.close(fd)


def resolve(message: dict[str, Any], memory: Memory | None) -> None:
    """Gives each job of a ``batch`` that has ``payload_at`` its payload from the memory."""
    if message.get("type") != "batch" or not isinstance(message.get("jobs"), list):
        return
    for job in message["jobs"]:
        if not isinstance(job, dict) or "payload_at" not in job:
            continue
        where = job.pop("payload_at")
        if memory is None:
            raise ProtocolError("payload_at without shared memory (no shm frame)")
        if not isinstance(where, (list, tuple)) or len(where) != 2:
            raise ProtocolError("payload_at must be [offset, length]")
        job["payload"] = memory.at(where[0], where[1])
