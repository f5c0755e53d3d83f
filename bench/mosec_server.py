"""The benchmark's MOSEC server: the same workload, one worker (BENCH_WORKERS), max batch 32
(BENCH_MAX_BATCH), max wait 10 ms."""

import os

from mosec import Server, Worker

import workloads

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "echo")


class Bench(Worker):
    def forward(self, data: list) -> list:
        return workloads.run(WORKLOAD, data)


if __name__ == "__main__":
    server = Server()
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "32"))
    workers = int(os.environ.get("BENCH_WORKERS", "1"))
    server.append_worker(Bench, num=workers, max_batch_size=max_batch, max_wait_time=10)
    server.run()
