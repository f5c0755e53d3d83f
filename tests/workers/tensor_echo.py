"""A v2 worker for tests at real sizes: one FP32 input of any length per row, answered with the
row doubled, as the declared FP32 output. TENSOR_ECHO_DATATYPE names another datatype for both
(FP16: what the proxy packs from JSON numbers, seen exactly)."""

import os

import corral

DATATYPE = os.environ.get("TENSOR_ECHO_DATATYPE", "FP32")


class Double(corral.Worker):
    inputs = (corral.Tensor("X", DATATYPE, [-1]),)
    outputs = (corral.Tensor("Y", DATATYPE, [-1]),)

    def forward(self, rows):
        return [{"Y": row["X"] * 2} for row in rows]


if __name__ == "__main__":
    Double.run()
