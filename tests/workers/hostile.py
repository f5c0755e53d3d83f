"""A worker for the robustness tests: hooks that raise what Python allows, and large outputs.

An item is a JSON object:
- `{"surrogate": true}`: preprocess raises a ValueError whose message holds a lone surrogate
  (an `os.fsdecode`d file name with a byte that is not UTF-8);
- `{"base": true}`: forward raises a BaseException subclass (not Exception);
- `{"out_bytes": n, "sleep_ms": m}`: forward sleeps m ms for the batch and answers n bytes;
- anything else is echoed.
Every other answer is `{"pid": pid, "echo": item}` (plus `"out"` for `out_bytes`), so tests can
tell that the same process served them.
"""

import os
import time

import corral


class Abort(BaseException):
    """What a library might raise to unwind: not an Exception."""


class Hostile(corral.Worker):
    def preprocess(self, item):
        if isinstance(item, dict) and item.get("surrogate"):
            raise ValueError("cannot open " + os.fsdecode(b"photo-\xff.jpg"))
        return item

    def forward(self, batch):
        if any(isinstance(item, dict) and item.get("base") for item in batch):
            raise Abort("unwound")
        sleep_ms = max((i.get("sleep_ms", 0) for i in batch if isinstance(i, dict)), default=0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        return [self._answer(item) for item in batch]

    @staticmethod
    def _answer(item):
        answer = {"pid": os.getpid(), "echo": item}
        if isinstance(item, dict) and "out_bytes" in item:
            answer["echo"] = {k: v for k, v in item.items() if k != "pad"}
            answer["out"] = "o" * item["out_bytes"]
        return answer


if __name__ == "__main__":
    Hostile.run()
