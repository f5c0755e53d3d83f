"""Stage `prepare` of the pipeline example: turn a scanned digit into the model's input.

A request is a grey-scale scan, `{"image": [8 rows of 8 grey levels]}`, 0 (black ink) to 255
(white paper), as a scanner or a phone camera gives it. This stage validates it (wrong shape or
range: 422, and the model stage never sees it), inverts and rescales it to the digits data set's
0 (white) to 16 (black), and flattens it row by row into `{"pixels": [64 values]}`: the input of
stage `classify` (examples/digits/worker.py). Per-item work, so this stage does not batch; two
workers do it in parallel.
"""

from typing import Annotated

import msgspec

import corral

Grey = Annotated[int, msgspec.Meta(ge=0, le=255)]
Row = Annotated[list[Grey], msgspec.Meta(min_length=8, max_length=8)]


class Scan(msgspec.Struct, forbid_unknown_fields=True):
    """An 8x8 scan, row by row: grey levels from 0 (black) to 255 (white)."""

    image: Annotated[list[Row], msgspec.Meta(min_length=8, max_length=8)]


class Pixels(msgspec.Struct):
    """The digits model's input: 64 values from 0 (white) to 16 (black)."""

    pixels: list[float]


class Prepare(corral.Worker):
    stage = "prepare"
    input_type = Scan
    output_type = Pixels
    examples = ({"image": [[255] * 8] * 8},)

    def preprocess(self, scan: Scan) -> Pixels:
        return Pixels([round((255 - grey) * 16 / 255, 2) for row in scan.image for grey in row])

    def forward(self, batch: list[Pixels]) -> list[Pixels]:
        return batch


if __name__ == "__main__":
    Prepare.run()
