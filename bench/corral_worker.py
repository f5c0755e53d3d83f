"""The benchmark's Corral worker: the workload named by BENCH_WORKLOAD."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corral  # noqa: E402
import workloads  # noqa: E402

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "echo")


class Bench(corral.Worker):
    def forward(self, batch: list) -> list:
        return workloads.run(WORKLOAD, batch)


if __name__ == "__main__":
    Bench.run()
