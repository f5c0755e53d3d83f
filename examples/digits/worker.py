"""Digits: a real classifier behind Corral, the model `make run` serves.

At start the worker trains a logistic regression on scikit-learn's bundled digits data set
(1,797 images of 8x8 pixels, values 0-16; about a second, nothing downloaded), then answers each
batch with one batched `predict_proba`. Requests are typed: exactly 64 pixel values between 0 and
16, anything else is a 422 naming the bad field. Answers carry the label and the ten class
probabilities.

    curl -s localhost:8000/infer -H 'content-type: application/json' -d @examples/digits/sample.json
"""

import os

# One BLAS thread per worker process: Corral runs several workers, and oversubscribed BLAS
# threads only slow each other down. Set before numpy is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from typing import Annotated

import msgspec
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

import corral

Pixel = Annotated[float, msgspec.Meta(ge=0, le=16)]


class Image(msgspec.Struct, forbid_unknown_fields=True):
    """An 8x8 grey-scale digit, row by row: 64 values from 0 (white) to 16 (black)."""

    pixels: Annotated[list[Pixel], msgspec.Meta(min_length=64, max_length=64)]


class Prediction(msgspec.Struct):
    """The most likely digit and the probability of each of 0-9."""

    label: int
    probabilities: list[float]


class Digits(corral.Worker):
    input_type = Image
    output_type = Prediction
    examples = ({"pixels": [0.0] * 64},)

    def __init__(self) -> None:
        digits = load_digits()
        self.model = LogisticRegression(max_iter=5000).fit(digits.data, digits.target)

    def forward(self, batch: list[Image]) -> list[Prediction]:
        probabilities = self.model.predict_proba(np.array([image.pixels for image in batch]))
        return [
            Prediction(label=int(p.argmax()), probabilities=[round(float(v), 6) for v in p])
            for p in probabilities
        ]


if __name__ == "__main__":
    Digits.run()
