"""The GPU run's Corral worker: the ResNet-50 of bench/gpu_model.py, one prediction per item.
Spawned with `--gpus 0`, it sees only that device (as cuda:0).

With BENCH_GAPS=1 it logs, every 500 batches, the median time `forward` took, the median time
between one `forward` returning and the next starting (the serving overhead the GPU waits
through), and the median batch size: where the gap to the in-process limit goes."""

import os
import statistics
import sys
import time

import corral
import gpu_model


class Gpu(corral.Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = gpu_model.Model()
        self.gaps = os.environ.get("BENCH_GAPS") == "1"
        self.samples: list[tuple[float, float, int]] = []
        self.last_end: float | None = None  # no gap before the first batch

    def forward(self, batch: list) -> list:
        start = time.perf_counter()
        out = self.model.run(len(batch))
        if self.gaps:
            end = time.perf_counter()
            if self.last_end is not None:
                self.samples.append((end - start, start - self.last_end, len(batch)))
            self.last_end = end
            if len(self.samples) == 500:
                run, gap, size = zip(*self.samples)
                print(
                    f"gaps: forward {statistics.median(run) * 1e3:.2f} ms, between batches "
                    f"{statistics.median(gap) * 1e3:.2f} ms, batch {statistics.median(size):.0f}",
                    file=sys.stderr,
                    flush=True,
                )
                self.samples.clear()
        return out


if __name__ == "__main__":
    Gpu.run()
