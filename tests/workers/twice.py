"""A plain worker that declared `cancel`, written from PROTOCOL.md, for a pipeline that lists its
stage twice (the request comes back under the same job id).

A job whose payload has no `step` is answered at once with `{"step": 1}`. The first job of step 1
it holds, writes TWICE_HOLDING, and waits for the proxy's next frame: a `cancel` naming it is
answered `error` ("cancelled"), a batch (another request's, sent ahead) lets it answer
`{"step": 2}` and go on. Every later job is answered at once.
"""

import os
import socket

import msgpack

from corral import _protocol as protocol

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ.get("CORRAL_SOCKET", "corral.sock"))
stream = sock.makefile("rb")
stage = os.environ.get("CORRAL_STAGE", "default")
hello = {**protocol.hello(stage, os.getpid(), "twice"), "features": ["cancel"]}
sock.sendall(protocol.encode_frame(hello))
held_once = False
pending = []  # frames read while holding, answered after
while pending or (frame := protocol.read_frame(stream)) is not None:
    if pending:
        frame = pending.pop(0)
    if frame["type"] == "cancel":
        continue  # for a job already answered: nothing to do
    if frame["type"] != "batch":
        break
    answers = []
    for job in frame["jobs"]:
        step = msgpack.unpackb(job["payload"]).get("step", 0)
        if step == 1 and not held_once:
            held_once = True
            open(os.environ["TWICE_HOLDING"], "w").close()
            following = protocol.read_frame(stream)
            if following is None:
                raise SystemExit(0)
            if following["type"] == "cancel" and job["id"] in following["ids"]:
                answers.append(protocol.error(job["id"], "cancelled"))
                continue
            pending.append(following)
        answers.append(protocol.ok(job["id"], msgpack.packb({"step": step + 1})))
    sock.sendall(protocol.encode_frame(protocol.results(answers)))
