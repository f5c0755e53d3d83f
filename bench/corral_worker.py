"""The benchmark's Corral worker: the workload named by BENCH_WORKLOAD."""

import os

import corral
import workloads

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "echo")


class Bench(corral.Worker):
    def forward(self, batch: list) -> list:
        return workloads.run(WORKLOAD, batch)


if __name__ == "__main__":
    Bench.run()
