"""The benchmark's MOSEC server: the same workload, one worker, max batch 32, max wait 10 ms."""

import os

from mosec import Server, Worker

import workloads

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "echo")


class Bench(Worker):
    def forward(self, data: list) -> list:
        return workloads.run(WORKLOAD, data)


if __name__ == "__main__":
    server = Server()
    server.append_worker(Bench, num=1, max_batch_size=32, max_wait_time=10)
    server.run()
