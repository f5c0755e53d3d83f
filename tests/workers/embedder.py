"""An embedding-shaped test worker: each batch takes 50 ms and every item's answer is 1024 floats
(about 9 KiB of msgpack), so a full batch's results frame is larger than a Unix socket's buffer,
as is a full batch of ~8 KB texts sent ahead. That is the shape that once jammed the connection
for good at default settings (issue #15).

If EMBEDDER_GATE names a file, every batch but the first (which teaches the proxy what a batch
costs) waits until it exists: the test creates it once it has seen a batch sent ahead."""

import os
import time

import corral

DIMENSIONS = 1024


class Embedder(corral.Worker):
    batches = 0

    def forward(self, batch):
        self.batches += 1
        gate = os.environ.get("EMBEDDER_GATE")
        while gate and self.batches > 1 and not os.path.exists(gate):
            time.sleep(0.005)  # polling for the file the test creates
        time.sleep(0.05)
        return [[len(text) / (i + 1) for i in range(DIMENSIONS)] for text in batch]


if __name__ == "__main__":
    Embedder.run()
