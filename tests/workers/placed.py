"""A worker that records where it was placed: at start it writes its environment's placement
variables (CUDA_VISIBLE_DEVICES, CORRAL_GPU, CORRAL_WORKER_INDEX, and every name listed in
PLACED_VARS) and the cores it may run on ("cores", Linux) as JSON to PLACED_DIR/<pid>.json,
then echoes."""

import json
import os

import corral

NAMES = ["CUDA_VISIBLE_DEVICES", "CORRAL_GPU", "CORRAL_WORKER_INDEX"]
NAMES += [n for n in os.environ.get("PLACED_VARS", "").split(",") if n]


class Placed(corral.Worker):
    def forward(self, batch):
        return batch


if __name__ == "__main__":
    record = {name: os.environ.get(name) for name in NAMES}
    if hasattr(os, "sched_getaffinity"):
        record["cores"] = sorted(os.sched_getaffinity(0))
    path = os.path.join(os.environ["PLACED_DIR"], f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # whole, or not there yet
    Placed.run()
