"""The embeddings benchmark's MOSEC server: the same model and the same `embed` call as Corral's
worker (examples/embeddings/worker.py), one worker, max batch BENCH_MAX_BATCH, max wait 10 ms."""

import os
import sys
from pathlib import Path

from mosec import Server, Worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "embeddings"))
import worker as embeddings  # the example's model code, not a second copy


class Embed(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = embeddings.load_model()

    def forward(self, data):
        if isinstance(data, dict):  # MOSEC passes one item, not a list, when max batch is 1
            return {"embedding": embeddings.embed(self.model, [data["text"]])[0]}
        vectors = embeddings.embed(self.model, [item["text"] for item in data])
        return [{"embedding": vector} for vector in vectors]


if __name__ == "__main__":
    server = Server()
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "32"))
    server.append_worker(Embed, num=1, max_batch_size=max_batch, max_wait_time=10)
    server.run()
