"""A worker for the traffic-control tests: it holds any batch that carries `{"hold": true}` until
the file GATED_GATE exists (the test opens it once the queue is as it wants), and appends every
batch it runs to GATED_LOG as one JSON line: the items' `id`s in batch order. Each item is
answered `{"id": ..., "batch": n}` (the n-th batch this worker ran).

GATED_WEIGHT_RULE, if set, is declared as the worker's weight rule (`corral.Worker.weight`)."""

import json
import os
import time

import corral


class Gated(corral.Worker):
    weight = os.environ.get("GATED_WEIGHT_RULE")
    batches = 0

    def forward(self, batch):
        if any(isinstance(item, dict) and item.get("hold") for item in batch):
            gate = os.environ["GATED_GATE"]
            while not os.path.exists(gate):
                time.sleep(0.005)  # the test opens the gate once the queue is as it wants
        self.batches += 1
        ids = [item.get("id") if isinstance(item, dict) else None for item in batch]
        with open(os.environ["GATED_LOG"], "a") as log:
            log.write(json.dumps(ids) + "\n")
        return [{"id": id_, "batch": self.batches} for id_ in ids]


if __name__ == "__main__":
    Gated.run()
