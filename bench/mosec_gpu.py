"""The GPU run's MOSEC server: the same ResNet-50, BENCH_WORKERS workers (default 1), max batch
BENCH_MAX_BATCH, max wait 5 ms (as Corral's)."""

import os

from mosec import Server, Worker

import gpu_model


class Gpu(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = gpu_model.Model()

    def forward(self, data: list) -> list:
        return self.model.run(len(data))


if __name__ == "__main__":
    server = Server()
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "32"))
    workers = int(os.environ.get("BENCH_WORKERS", "1"))
    server.append_worker(Gpu, num=workers, max_batch_size=max_batch, max_wait_time=5)
    server.run()
