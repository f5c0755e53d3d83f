"""A worker whose behaviour each request scripts, for the end-to-end tests.

An item is a JSON object; what it holds decides what happens to it:
- `{"invalid": "why"}`: preprocess raises ValidationError (422 for this item alone);
- `{"raise": "why"}`: forward raises (500 for the whole batch);
- `{"exit": true}`: the process dies in forward (the proxy must answer the batch 500);
- `{"stop": "why"}`: forward calls `sys.exit("why")`, as a library giving up may (the worker
  stops, and Corral restarts it);
- `{"disconnect": true}`: forward closes the worker's connection and never returns (a process
  that lives on without its connection: the proxy must kill and restart it);
- `{"sleep_ms": n}`: forward sleeps n ms before answering (a model that costs that much);
- `{"hold": path}`: forward holds the batch until the file `path` exists (the test creates it
  once it has seen what it waits for: a 408, a full queue, a worker killed);
- `{"repeat": text, "times": n}`: echoed as `text` n times over (a large answer from a small
  request);
- anything else is echoed.
Every answer is `{"echo": item, "batch_size": n, "pid": pid, "timeout_ms": ms}`, so tests can
see batches form and the remaining time the worker was told.
If SCRIPTED_LOG names a file, every item received is appended to it as one JSON line
(`{"pid": ..., "item": ...}`), so tests can check what reached which worker (and what never did).
With SCRIPTED_THREAD set, the worker starts a thread that is not a daemon and never ends (a
metrics pusher, a weights watcher), which keeps the interpreter from exiting by itself. With
SCRIPTED_COLD set, its warm-up fails (its one example raises in forward); with SCRIPTED_BROKEN
set, its `__init__` raises FileNotFoundError naming that value (a model whose weights are not
there).
"""

import json
import os
import socket
import sys
import threading
import time

import corral
from corral import _serve


class Scripted(corral.Worker):
    if os.environ.get("SCRIPTED_COLD"):
        examples = [{"raise": "cold"}]

    def __init__(self):
        if os.environ.get("SCRIPTED_BROKEN"):
            raise FileNotFoundError(os.environ["SCRIPTED_BROKEN"])
        if os.environ.get("SCRIPTED_THREAD"):
            threading.Thread(target=threading.Event().wait, name="watcher").start()

    def preprocess(self, item):
        log = os.environ.get("SCRIPTED_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "item": item}) + "\n")
        if isinstance(item, dict) and "invalid" in item:
            raise corral.ValidationError(item["invalid"])
        return item

    def forward(self, batch):
        for item in batch:
            if not isinstance(item, dict):
                continue
            if "raise" in item:
                raise RuntimeError(item["raise"])
            if item.get("exit"):
                os._exit(3)
            if "stop" in item:
                sys.exit(item["stop"])
            if item.get("disconnect"):
                _serve._connection.shutdown(socket.SHUT_RDWR)
                threading.Event().wait()
        for item in batch:
            if isinstance(item, dict) and "hold" in item:
                while not os.path.exists(item["hold"]):
                    time.sleep(0.005)  # polling for the file the test creates
        sleep_ms = max((i.get("sleep_ms", 0) for i in batch if isinstance(i, dict)), default=0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        now = time.monotonic()
        return [
            {
                "echo": repeated(item),
                "batch_size": len(batch),
                "pid": os.getpid(),
                "timeout_ms": round((deadline - now) * 1000),
            }
            for item, deadline in zip(batch, self.deadlines)
        ]


def repeated(item):
    """The item as echoed: a `repeat` request's text, `times` over."""
    if isinstance(item, dict) and "repeat" in item:
        return item["repeat"] * item["times"]
    return item


if __name__ == "__main__":
    Scripted.run()
