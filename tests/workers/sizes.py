"""A worker for tests at real sizes: each item (raw bytes) is answered with its length and the
lengths of every item in its batch, so a test sees how many bytes each batch carried. With
SIZES_GATE set, its first batch waits until that file exists (the test creates it once the queue
is as it wants)."""

import os
import time

import corral


class Sizes(corral.Worker):
    gated = "SIZES_GATE" in os.environ

    def forward(self, batch):
        while self.gated and not os.path.exists(os.environ["SIZES_GATE"]):
            time.sleep(0.005)  # the test opens the gate once the queue is as it wants
        self.gated = False
        sizes = [len(item) for item in batch]
        return [{"size": size, "batch": sizes} for size in sizes]


if __name__ == "__main__":
    Sizes.run()
