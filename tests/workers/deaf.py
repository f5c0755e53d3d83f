"""A worker that says hello, then shuts the reading side of its socket and waits to be killed.

Every frame the proxy writes to it fails at once (EPIPE): no batch ever reaches it. Such a batch
must cost its jobs nothing, not even with `--retries 0`.
"""

import os
import socket
import threading

from corral import _protocol as protocol

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ.get("CORRAL_SOCKET", "corral.sock"))
sock.sendall(protocol.encode_frame(protocol.hello("default", os.getpid(), "deaf")))
sock.shutdown(socket.SHUT_RD)
print("deaf", flush=True)
threading.Event().wait()  # never set: killed by the test
