"""A worker that stops reading in the middle of its first batch frame, and never answers.

It speaks the protocol by hand (corral's frame helpers only): hello, then it reads the first
batch's length and a few bytes of its body, prints "stalled" and blocks until it is killed. A
batch larger than the socket buffers therefore stays half written on the proxy's side: the proxy
must still declare the worker hung, and still be able to stop.

With STALLING_EXIT=1 it exits there instead, leaving the rest of the frame unread: the proxy then
reads a connection reset, which is a worker that died (not one that broke the protocol).
"""

import os
import socket
import threading

from corral import _protocol as protocol

path = os.environ.get("CORRAL_SOCKET", "corral.sock")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(path)
sock.sendall(protocol.encode_frame(protocol.hello("default", os.getpid(), "stalling")))
sock.recv(4, socket.MSG_WAITALL)  # the batch frame's length
sock.recv(1024)
print("stalled", flush=True)
if os.environ.get("STALLING_EXIT"):
    os._exit(3)
threading.Event().wait()  # never set: this worker reads nothing more
