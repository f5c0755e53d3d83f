"""Arithmetic stages for the pipeline tests, chosen by the first argument:

- ``scale``: x * 2; anything but a number is rejected (422);
- ``shift``: x + 3; fails its whole batch (500) on a value over a million, and holds a batch
  with the value -2 (from scale's -1) until the file ARITH_GATE exists, to outlast a deadline;
- ``where``: answers the stage it serves and the cores it may run on (for CPU pinning).
"""

import os
import sys
import time

import corral


def number(item):
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        raise corral.ValidationError(f"expected a number, got {type(item).__name__}")
    return item


class Scale(corral.Worker):
    stage = "scale"

    def preprocess(self, item):
        return number(item)

    def forward(self, batch: list) -> list:
        return [x * 2 for x in batch]


class Shift(corral.Worker):
    stage = "shift"

    def forward(self, batch: list) -> list:
        if any(x > 1_000_000 for x in batch):
            raise RuntimeError("shift takes values up to a million")
        if -2 in batch:
            # A slow model call, until the test creates the file; the proxy answers 408 without
            # waiting for it.
            while not os.path.exists(os.environ["ARITH_GATE"]):
                time.sleep(0.005)
        return [x + 3 for x in batch]


class Where(corral.Worker):
    def forward(self, batch: list) -> list:
        cores = sorted(os.sched_getaffinity(0))
        return [{"stage": self.stage, "cores": cores, "pid": os.getpid()} for _ in batch]


class Grow(corral.Worker):
    """Answers each n with n bytes: an output as large as a test asks."""

    def forward(self, batch: list) -> list:
        return [b"x" * n for n in batch]


if __name__ == "__main__":
    {"scale": Scale, "shift": Shift, "where": Where, "grow": Grow}[sys.argv[1]].run()
