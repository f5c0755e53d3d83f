"""The GPU run's Corral worker: the ResNet-50 of bench/gpu_model.py, one prediction per item.
Spawned with `--gpus 0`, it sees only that device (as cuda:0).

With BENCH_GAPS=1 it logs, every 500 batches, how long `forward` took and how long passed
between one `forward` returning and the next starting (the serving overhead the GPU waits
through), each as median / mean / p99, the mean batch size, and the time Python's garbage
collector ran per batch: where the gap to the in-process limit goes. BENCH_GC (`freeze`: the
objects made while loading, the model's among them, frozen out of every collection; `off`: no
collection while serving) lets bench/gpu_probe.py measure what the collector costs."""

import gc
import os
import statistics
import sys
import time

import corral
import gpu_model
from gpu import spread


class Gpu(corral.Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = gpu_model.Model()
        self.gaps = os.environ.get("BENCH_GAPS") == "1"
        self.samples: list[tuple[float, float, int]] = []
        self.last_end: float | None = None  # no gap before the first batch
        self.gc_seconds = 0.0
        self.gc_started = 0.0
        if self.gaps:
            gc.callbacks.append(self._collecting)
        mode = os.environ.get("BENCH_GC", "")
        if mode == "freeze":
            gc.collect()
            gc.freeze()
        elif mode == "off":
            gc.disable()

    def _collecting(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_started = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self.gc_started

    def forward(self, batch: list) -> list:
        start = time.perf_counter()
        out = self.model.run(len(batch))
        if self.gaps:
            end = time.perf_counter()
            if self.last_end is not None:
                self.samples.append((end - start, start - self.last_end, len(batch)))
            self.last_end = end
            if len(self.samples) == 500:
                self._report()
        return out

    def _report(self) -> None:
        run, gap, size = (list(column) for column in zip(*self.samples))
        print(
            f"gaps: forward {spread(run)}, between batches {spread(gap)} (median / mean / p99),"
            f" batch {statistics.fmean(size):.1f} mean, gc {self.gc_seconds / 500 * 1e3:.3f} "
            f"ms per batch",
            file=sys.stderr,
            flush=True,
        )
        self.samples.clear()
        self.gc_seconds = 0.0


if __name__ == "__main__":
    Gpu.run()
