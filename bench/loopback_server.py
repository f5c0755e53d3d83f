"""The loopback limit of the large-payload benchmark (bench/payload.py): an HTTP/1.1 server that
does nothing with a request but read its body and answer its size (or, with --echo, the body
itself). Measured with the same load generator and the same bodies as Corral and MOSEC, it is
what moving those bytes over loopback TCP costs on this machine, with no serving layer at all.

It is as lean as Python gets: a thread per connection (the socket calls release the GIL), the
body read with `recv_into` straight into a buffer kept per connection (the kernel's copy is the
only one), keep-alive, Content-Length bodies only, no parsing beyond the header that gives the
length.
"""

from __future__ import annotations

import argparse
import socket
import threading


def serve(conn: socket.socket, echo: bool) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(1 << 16)
    pending = b""  # bytes read past the end of the last request's head
    with conn:
        while True:
            while b"\r\n\r\n" not in pending:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                pending += chunk
            head, _, pending = pending.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buffer) < length:
                buffer = bytearray(length)
            view = memoryview(buffer)
            got = min(len(pending), length)
            view[:got] = pending[:got]
            pending = pending[got:]
            while got < length:
                n = conn.recv_into(view[got:length])
                if n == 0:
                    return
                got += n
            if echo:
                body, media_type = view[:length], b"application/octet-stream"
            else:
                body, media_type = str(length).encode(), b"application/json"
            head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
                media_type,
                len(body),
            )
            conn.sendall(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:  # no copy of a large body to prepend the head
                conn.sendall(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--echo", action="store_true", help="answer the body, not its size")
    args = parser.parse_args()
    listener = socket.create_server(("127.0.0.1", args.port), backlog=256)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, args.echo), daemon=True).start()


if __name__ == "__main__":
    main()
