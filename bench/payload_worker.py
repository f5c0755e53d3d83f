"""The large-payload benchmark's Corral worker (bench/payload.py): it answers each request's size
in bytes (or, with BENCH_PAYLOAD_LOGIC=echo, the request itself), whichever way it came:

- raw bytes (`POST /infer`, `Content-Type: application/octet-stream`): the item is `bytes`;
- Open Inference Protocol v2 binary tensors (`POST /v2/models/default/infer`): the item is a row,
  `{"INPUT0": numpy uint8 array}`, answered `{"OUTPUT0": ...}`;
- JSON (a list of numbers, for contrast): the item is the list, its size its length.

bench/mosec_payload.py does the same in MOSEC.
"""

from __future__ import annotations

import os

import corral

ECHO = os.environ.get("BENCH_PAYLOAD_LOGIC", "size") == "echo"


class Payload(corral.Worker):
    inputs = (corral.Tensor("INPUT0", "UINT8", [-1]),)
    outputs = (
        corral.Tensor("OUTPUT0", "UINT8", [-1]) if ECHO else corral.Tensor("OUTPUT0", "INT64", [1]),
    )
    # An echoed raw body goes back as raw bytes to a client that accepts them.
    output_content_type = "application/octet-stream"

    def forward(self, batch: list) -> list:
        return [answer(item) for item in batch]


def answer(item):
    if isinstance(item, dict):  # a v2 row
        row = item["INPUT0"]
        return {"OUTPUT0": row if ECHO else [len(row)]}
    return item if ECHO else len(item)


if __name__ == "__main__":
    Payload.run()
