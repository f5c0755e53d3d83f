"""A streaming worker written from PROTOCOL.md alone (frames by hand, no Worker class): the proxy
side of streams is tested against it, whatever the Python package does.

It declares `stream` and `cancel` (and `join` when STREAMER_JOIN is set, offering room for
STREAMER_JOIN jobs in all). Each job's item scripts its stream:
- `{"chunks": n}`: n chunks, one per step, each `"<tag>-<i>"` (tag: the item's `tag`, default
  "c"); `"size": k` pads each chunk to k characters; `"burst": k` sends k chunks a step, in
  one frame;
- `"gate": path`: after its first chunk, the job waits (other jobs go on) until that file exists;
  `"gate_first": path` waits before the first chunk;
- `"step_ms": k`: the worker waits k ms after each step that sent this job a chunk;
- `"fail_after": k`: after k chunks the job ends with an `error` result;
- `"die_after": k`: after k chunks the process exits at once;
- `"linger_ms": k`: a cancelled job is ended only k ms after its cancel (the worker sends nothing
  for it meanwhile), and its id then appended to STREAMER_ENDED;
- `"ack": status`: a cancelled job is answered with this status (no data) rather than `end`;
- `"bad_chunk_after": k`: after k chunks, a chunk whose data is not one msgpack value (a value
  and a byte after it), then the rest as usual;
- `"nan_after": k`: after k chunks, a chunk that is a NaN (well-formed msgpack that JSON cannot
  write), then the rest as usual (no gate holds the job before it);
- `"end_with_data": true`: the job ends with `end` carrying data (which `end` must not);
- `"break_once": path`: if that file does not exist yet, the worker creates it and answers the
  job twice in one `results` frame (a rule broken), `ok` "broken" each time; else as usual;
- `"pull_after_end": true` (with STREAMER_JOIN): right after the job's end, with nothing held,
  the worker offers room again (`pull`), as a join loop may;
- `"say_timeout": true`: the first chunk is the job's `timeout_ms` as the batch gave it.
With STREAMER_IDLE_FLOOD set, the worker sends signs of life (`chunks` with no chunk) without
pause while it holds no job, as a heartbeat thread with no sleep would.
Behind tests/workers/scripted.py in a pipeline, its `echo` is taken as the item. Cancelled job
ids are appended (hex) to STREAMER_CANCELS; joined job ids to STREAMER_JOINED.
"""

import os
import select
import socket
import struct
import sys
import time

import msgpack

from corral import _protocol as protocol

JOIN = int(os.environ.get("STREAMER_JOIN", "0"))
IDLE_FLOOD = bool(os.environ.get("STREAMER_IDLE_FLOOD"))


def log(variable, job_id):
    path = os.environ.get(variable)
    if path:
        with open(path, "a") as f:
            f.write(job_id.hex() + "\n")


class Frames:
    """Frames from the proxy, read without blocking while jobs are held."""

    def __init__(self, sock):
        self.sock, self.buf, self.closed = sock, bytearray(), False

    def poll(self, timeout):
        """Every complete frame that arrived, waiting up to `timeout` (None: until one does)."""
        while True:
            ready = select.select([self.sock], [], [], 0)[0]
            while ready:
                data = self.sock.recv(1 << 20)
                if not data:
                    # The frames before the end first (a `shutdown` read with the close).
                    self.closed = True
                    break
                self.buf += data
                ready = select.select([self.sock], [], [], 0)[0]
            frames = []
            while len(self.buf) >= 4:
                (length,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) < 4 + length:
                    break
                frames.append(protocol.decode_body(bytes(self.buf[4 : 4 + length])))
                del self.buf[: 4 + length]
            if frames:
                return frames
            if self.closed:
                raise EOFError
            if timeout == 0:
                return frames
            if not select.select([self.sock], [], [], timeout)[0] and timeout is not None:
                return []


class Job:
    def __init__(self, raw):
        self.id = raw["id"]
        item = msgpack.unpackb(raw["payload"], raw=False)
        # Behind the scripted worker in a pipeline, the item arrives as its echo.
        self.item = item["echo"] if isinstance(item, dict) and "echo" in item else item
        self.timeout_ms = raw["timeout_ms"]
        self.sent = 0
        self.cancelled_at = None

    def gated(self):
        if self.sent <= self.item.get("nan_after", -1):
            return False  # its NaN chunk goes before any gate holds it
        gate = self.item.get("gate_first") if self.sent == 0 else self.item.get("gate")
        return bool(gate) and not os.path.exists(gate)

    def next_chunk(self):
        if self.sent == 0 and self.item.get("say_timeout"):
            self.sent += 1
            return self.timeout_ms
        chunk = f"{self.item.get('tag', 'c')}-{self.sent}"
        self.sent += 1
        return chunk.ljust(self.item.get("size", 0), ".")


def main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ.get("CORRAL_SOCKET", "corral.sock"))
    frames = Frames(sock)
    features = ["stream", "cancel"] + (["join"] if JOIN else [])
    stage = os.environ.get("CORRAL_STAGE", "default")
    hello = {**protocol.hello(stage, os.getpid(), "streamer"), "features": features}
    sock.sendall(protocol.encode_frame(hello))
    held = {}
    offered = 0

    def receive(frame):
        nonlocal offered
        kind = frame["type"]
        if kind == "batch":
            # A batch uses up the offer it answers (PROTOCOL.md): room freed later is offered
            # anew, though it may be the same number.
            offered = 0
            for raw in frame["jobs"]:
                if held:
                    log("STREAMER_JOINED", raw["id"])
                held[raw["id"]] = Job(raw)
        elif kind == "cancel":
            ended = []
            for job_id in frame["ids"]:
                log("STREAMER_CANCELS", job_id)
                job = held.get(job_id)
                if job is not None and "linger_ms" in job.item:
                    job.cancelled_at = time.monotonic()
                elif (cancelled := held.pop(job_id, None)) is not None:
                    ended.append({"id": job_id, "status": cancelled.item.get("ack", "end")})
            if ended:
                sock.sendall(protocol.encode_frame(protocol.results(ended)))
        elif kind in ("shutdown", "reject"):
            sys.exit(0)

    while True:
        if not held:
            # Idle: an offer of room ended with the last job (the next batch may come in the
            # same poll as the frames that follow it, and was never offered room to join).
            offered = 0
        # Idle: block for a batch. Busy: take what arrived without blocking.
        try:
            if not held and IDLE_FLOOD:
                sock.sendall(protocol.encode_frame({"type": "chunks", "chunks": []}) * 64)
                arrived = frames.poll(0)
            else:
                arrived = frames.poll(None if not held else 0)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return
        for frame in arrived:
            receive(frame)
        if not held:
            continue
        if JOIN and len(held) < JOIN and offered != JOIN - len(held):
            offered = JOIN - len(held)
            sock.sendall(protocol.encode_frame({"type": "pull", "max": offered}))
        chunks, results = [], []
        for job in list(held.values()):
            if job.cancelled_at is not None:
                if time.monotonic() - job.cancelled_at >= job.item["linger_ms"] / 1000:
                    results.append({"id": job.id, "status": "end"})
                    log("STREAMER_ENDED", job.id)
                continue
            if job.gated():
                continue
            item = job.item
            if "die_after" in item and job.sent >= item["die_after"]:
                os._exit(3)
            once = item.get("break_once")
            if once and not os.path.exists(once):
                open(once, "w").close()
                broken = protocol.ok(job.id, msgpack.packb("broken"))
                results += [broken, broken]
            elif "fail_after" in item and job.sent >= item["fail_after"]:
                results.append(protocol.error(job.id, "RuntimeError: scripted failure"))
            elif job.sent >= item.get("chunks", 1):
                end = {"id": job.id, "status": "end"}
                if item.get("end_with_data"):
                    end["data"] = msgpack.packb("lost")
                results.append(end)
            elif job.sent == item.get("nan_after"):
                chunks.append({"id": job.id, "data": msgpack.packb(float("nan"))})
                job.sent += 1
            elif job.sent == item.get("bad_chunk_after"):
                data = msgpack.packb(job.next_chunk()) + b"\x01"
                chunks.append({"id": job.id, "data": data})
            else:
                for _ in range(min(item.get("burst", 1), item.get("chunks", 1) - job.sent)):
                    chunks.append({"id": job.id, "data": msgpack.packb(job.next_chunk())})
        if chunks:
            sock.sendall(protocol.encode_frame({"type": "chunks", "chunks": chunks}))
            step_ms = max(job.item.get("step_ms", 0) for job in held.values())
            until = time.monotonic() + step_ms / 1000
            while (left := until - time.monotonic()) > 0:  # a model step's time
                for frame in frames.poll(left):  # a cancel arriving meanwhile is taken in
                    receive(frame)
        # A cancel taken in during the step's wait has ended its job already: answering it
        # again would be a result repeated (a rule broken that no item asked for).
        results = [result for result in results if result["id"] in held]
        if results:
            pull = any(held[r["id"]].item.get("pull_after_end") for r in results)
            for result in results:
                held.pop(result["id"], None)
            sock.sendall(protocol.encode_frame(protocol.results(results)))
            if pull and not held:
                sock.sendall(protocol.encode_frame({"type": "pull", "max": JOIN}))
        if not chunks and not results:
            # Only gated or lingering jobs: wait for a frame, or look at them again shortly.
            try:
                for frame in frames.poll(0.01):
                    receive(frame)
            except EOFError:
                return


if __name__ == "__main__":
    main()
