"""The model logic both servers run in the benchmark, so that only the serving layer differs.

- echo: returns its inputs;
- cost: burns CPU for 2 ms + 0.2 ms per item (a model whose batch overhead is worth amortizing);
- cost_sleep: the same duration spent sleeping (a model that waits on an accelerator);
- slow: burns 500 ms of CPU per item (the load-shedding seed's model, served with batch size 1).

At max batch 32 a cost batch takes 8.4 ms, so one worker's ceiling is 32 / 8.4 ms ≈ 3,810 req/s.
"""

from __future__ import annotations

import time

OVERHEAD_S = 0.002
PER_ITEM_S = 0.0002
CEILING_RPS = 32 / (OVERHEAD_S + 32 * PER_ITEM_S)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(workload: str, batch: list) -> list:
    cost = OVERHEAD_S + PER_ITEM_S * len(batch)
    if workload == "slow":
        _busy(0.5 * len(batch))
    elif workload == "cost":
        _busy(cost)
    elif workload == "cost_sleep":
        time.sleep(cost)
    elif workload != "echo":
        raise ValueError(f"unknown workload {workload!r}")
    return batch
