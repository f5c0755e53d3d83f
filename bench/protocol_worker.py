"""The worker of bench/protocol_paths.py, as fast as a Python worker gets, so that the proxy's
share shows: for stage `v2`, an Open Inference Protocol v2 echo of one declared FP32 tensor; for
stage `embed`, a fixed 384-float vector per input (OpenAI embeddings)."""

import os

import corral

VECTOR = [((i * 37) % 101) / 101.0 - 0.5 for i in range(384)]


class Echo(corral.Worker):
    inputs = (corral.Tensor("INPUT0", "FP32", [-1]),)
    outputs = (corral.Tensor("OUTPUT0", "FP32", [-1]),)

    def forward(self, batch):
        return [{"OUTPUT0": row["INPUT0"]} for row in batch]


class Embed(corral.Worker):
    def forward(self, batch):
        return [VECTOR for _ in batch]


if __name__ == "__main__":
    (Embed if os.environ.get("CORRAL_STAGE") == "embed" else Echo).run()
