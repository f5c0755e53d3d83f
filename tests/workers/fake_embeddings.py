"""The embeddings example's worker (examples/embeddings/worker.py) as written, with a stand-in for
its model, so that its request handling is tested where torch is not installed: each text's
"embedding" is [its length, the size of the batch it was computed in]."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "embeddings"))
import worker as example


class FakeModel:
    """What the example calls of a SentenceTransformer: `encode`, giving one row per text."""

    def encode(self, texts, **_options):
        return np.array([[float(len(text)), float(len(texts))] for text in texts])


class FakeEmbed(example.Embed):
    def __init__(self) -> None:
        self.model = FakeModel()


if __name__ == "__main__":
    FakeEmbed.run()
