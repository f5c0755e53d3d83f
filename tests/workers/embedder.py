"""An embedding-shaped test worker: each batch takes 50 ms and every item's answer is 1024 floats
(about 9 KiB of msgpack), so a full batch's results frame is larger than a Unix socket's buffer,
as is a full batch of ~8 KB texts sent ahead. That is the shape that once jammed the connection
for good at default settings (issue #15)."""

import time

import corral

DIMENSIONS = 1024


class Embedder(corral.Worker):
    def forward(self, batch):
        time.sleep(0.05)
        return [[len(text) / (i + 1) for i in range(DIMENSIONS)] for text in batch]


if __name__ == "__main__":
    Embedder.run()
