"""A deterministic embedding worker for the OpenAI protocol tests: each text becomes 8 floats
derived from its SHA-256, so a test can compute the expected vector itself. Every vector's last
element is the size of the batch it was computed in (exact in float32), so tests can see inputs
share a batch. A text starting with "reject" is refused (422) in preprocess. The text
"not finite" is answered with NaN and infinities, "past float32" with [1e39, 0.5] (finite, but
not as a float32), "tenths" with [0.1, 0.2, 1/3] (not exact in float32), and "raw bytes" with
the float32 bytes of a vector (a worker's mistake: an embedding is a list of numbers).

With EMBED_TENSORS set it declares tensors, as a worker serving v2 clients too would: its input
`TEXT` (`BYTES`, one element a row) and its output `EMBEDDING` (`FP32`, 8 a row), beside a
`TOKENS` output (`INT64`) that the OpenAI answer must not take for the embedding. EMBED_INPUTS
names another datatype for `TEXT` (a model no string can be sent to)."""

import hashlib
import os
import struct

import numpy as np

import corral

DIMENSIONS = 8


def vector(text: str, batch_size: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    # Multiples of 1/256 below 1: exact in float32, so float and base64 answers compare equal.
    return [digest[i] / 256 for i in range(DIMENSIONS - 1)] + [float(batch_size)]


class Embed(corral.Worker):
    if os.environ.get("EMBED_TENSORS"):
        inputs = (corral.Tensor("TEXT", os.environ.get("EMBED_INPUTS") or "BYTES", [1]),)
        outputs = (
            corral.Tensor("TOKENS", "INT64", [1]),
            corral.Tensor("EMBEDDING", "FP32", [DIMENSIONS]),
        )

    def preprocess(self, item):
        if isinstance(item, dict):
            item = bytes(item["TEXT"][0]).decode()
        if item.startswith("reject"):
            raise corral.ValidationError(f"cannot embed {item!r}")
        return item

    def forward(self, batch):
        answers = [answer(text, len(batch)) for text in batch]
        if not self.outputs:
            return answers
        return [
            {"TOKENS": [len(text.split())], "EMBEDDING": np.array(vector, np.float32)}
            for text, vector in zip(batch, answers)
        ]


def answer(text: str, batch_size: int):
    if text == "not finite":
        return [float("nan"), float("inf"), float("-inf"), 0.5]
    if text == "past float32":
        return [1e39, 0.5]
    if text == "tenths":
        return [0.1, 0.2, 1 / 3]
    if text == "raw bytes":
        return struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    return vector(text, batch_size)


if __name__ == "__main__":
    Embed.run()
