"""A plain (non-streaming) worker that declared `cancel`, written from PROTOCOL.md: it holds each
batch until the proxy cancels its jobs (or PATIENT_GATE exists), appends every cancelled job id
(hex) to PATIENT_CANCELS, then answers the batch."""

import os
import socket

import msgpack

from corral import _protocol as protocol

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ.get("CORRAL_SOCKET", "corral.sock"))
stream = sock.makefile("rb")
hello = {**protocol.hello("default", os.getpid(), "patient"), "features": ["cancel"]}
sock.sendall(protocol.encode_frame(hello))
while (frame := protocol.read_frame(stream)) is not None:
    if frame["type"] != "batch":
        break
    waiting = {job["id"] for job in frame["jobs"]}
    while waiting:
        message = protocol.read_frame(stream)
        if message is None or message["type"] != "cancel":
            raise SystemExit(0)
        for job_id in message["ids"]:
            with open(os.environ["PATIENT_CANCELS"], "a") as f:
                f.write(job_id.hex() + "\n")
            waiting.discard(job_id)
    results = [protocol.ok(job["id"], msgpack.packb("late")) for job in frame["jobs"]]
    sock.sendall(protocol.encode_frame(protocol.results(results)))
