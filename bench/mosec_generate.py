"""The streaming benchmark's MOSEC server: the generation model of examples/generate/ behind
MOSEC's own Server-Sent Events, one worker, max batch 32, max wait 10 ms (as Corral's).

MOSEC streams from an `SSEWorker`: `send_stream_event(text, index)` sends one event for one batch
position (each call waits until the previous event is on MOSEC's socket), and the streams end when
`forward` returns. So a batch runs until its longest item is done: the batch cannot be joined,
and an item that finished early stays open until then. Events carry the character as JSON, as
Corral's chunks do; `forward`'s return value (the whole text per item) is not streamed.
"""

import json
import os
import sys
from pathlib import Path

from mosec import Server
from mosec.worker import SSEWorker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "generate"))
from model import Model, corpus  # the example's model, not a second copy


class Generate(SSEWorker):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model.train(corpus())
        self.seed = 0

    def forward(self, data: list) -> list:
        seeds = []
        for item in data:
            seeds.append(item.get("seed", self.seed))
            self.seed += 1
        state = self.model.start([item["prompt"] for item in data], seeds)
        rows = list(range(len(data)))  # rows[r]: the batch position of the model's row r
        left = [int(item.get("max_tokens", 64)) for item in data]
        texts = [""] * len(data)
        while rows:
            finished = []
            for r, (position, char) in enumerate(zip(rows, self.model.step(state))):
                self.send_stream_event(json.dumps(char), index=position)
                texts[position] += char
                left[position] -= 1
                if left[position] == 0:
                    finished.append(r)
            self.model.remove(state, finished)  # stop computing what is done
            rows = [position for r, position in enumerate(rows) if r not in finished]
        return texts


if __name__ == "__main__":
    server = Server()
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "32"))
    server.append_worker(Generate, num=1, max_batch_size=max_batch, max_wait_time=10)
    server.run()
