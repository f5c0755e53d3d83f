"""Typed: a worker that declares its request and response types with msgspec.

Each request is validated as a `Vector` straight from msgpack (a wrong type, a missing field or an
unknown field answers 422 with the path of the bad field, and only for that request), the answer is
a `Norm`, and both types appear in Corral's `GET /openapi.json`.

    curl -s localhost:8000/infer -H 'content-type: application/json' -d '{"values": [3, 4]}'
    # {"norm":5.0,"size":2}
"""

from typing import Annotated

import msgspec

import corral

# Bounded so that a sum of 1024 squares stays a finite float (and NaN is refused).
Component = Annotated[float, msgspec.Meta(ge=-1e150, le=1e150)]


class Vector(msgspec.Struct, forbid_unknown_fields=True):
    """A vector of at most 1024 numbers, each within ±1e150."""

    values: Annotated[list[Component], msgspec.Meta(max_length=1024)]


class Norm(msgspec.Struct):
    """The Euclidean norm of a vector, and its size."""

    norm: float
    size: int


class VectorNorm(corral.Worker):
    input_type = Vector
    output_type = Norm
    examples = ({"values": [3.0, 4.0]},)

    def forward(self, batch: list[Vector]) -> list[Norm]:
        return [
            Norm(norm=sum(v * v for v in vec.values) ** 0.5, size=len(vec.values)) for vec in batch
        ]


if __name__ == "__main__":
    VectorNorm.run()
