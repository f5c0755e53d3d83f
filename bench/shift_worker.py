"""The cost-shift benchmark's model: a batch sleeps (base + per item × size) × a factor read from
a file before each batch, so the benchmark can make the model slower and faster again while it
runs (another process on its GPU, a slower path). Sleeping costs no CPU: the load is time."""

import os
import time

import corral

BASE = float(os.environ.get("SHIFT_BASE_MS", "180")) / 1000
PER_ITEM = float(os.environ.get("SHIFT_PER_ITEM_MS", "5")) / 1000
FACTOR_FILE = os.environ["SHIFT_FACTOR_FILE"]


def factor() -> float:
    try:
        with open(FACTOR_FILE) as f:
            return float(f.read().strip() or 1)
    except (OSError, ValueError):
        return 1.0


class Shifting(corral.Worker):
    def forward(self, batch: list) -> list:
        time.sleep((BASE + PER_ITEM * len(batch)) * factor())
        return batch


if __name__ == "__main__":
    Shifting.run()
