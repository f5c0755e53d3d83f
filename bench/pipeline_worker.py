"""The pipeline benchmark's workers, chosen by the first argument:

- ``prepare``: per-item CPU work (PREPARE_S of busy CPU per item, like decoding an image);
- ``model``: a batched model on an accelerator (2 ms + 0.2 ms per item, spent waiting, not
  computing, as a process waiting on a GPU does);
- ``both``: the same work in one process — prepare each item, then run the model on the batch.
"""

import sys

import corral
import workloads

PREPARE_S = 0.001


def prepare(item):
    workloads._busy(PREPARE_S)
    return item


class Prepare(corral.Worker):
    stage = "prepare"

    def forward(self, batch: list) -> list:
        return [prepare(item) for item in batch]


class Model(corral.Worker):
    stage = "model"

    def forward(self, batch: list) -> list:
        return workloads.run("cost_sleep", batch)


class Both(corral.Worker):
    def forward(self, batch: list) -> list:
        return workloads.run("cost_sleep", [prepare(item) for item in batch])


if __name__ == "__main__":
    {"prepare": Prepare, "model": Model, "both": Both}[sys.argv[1]].run()
