"""A v2 (Open Inference Protocol) worker for the tests: it declares FP32, INT64 and BYTES inputs
and outputs, and answers each row with the sum and a scaling of `X`, `TEXT` upper-cased, and
`BATCH` = [the number of this batch, its size], so that a test sees from the answers which rows
shared a batch. A row whose TEXT is `reject` is rejected (422). With TENSORS_GATE set, every
batch waits until that file exists, so that a test can let jobs queue up first."""

import os
import time

import numpy as np

import corral


class Tensors(corral.Worker):
    inputs = (
        corral.Tensor("X", "FP32", [3]),
        corral.Tensor("N", "INT64", [1]),
        corral.Tensor("TEXT", "BYTES", [1]),
    )
    outputs = (
        corral.Tensor("SUM", "FP32", [1]),
        corral.Tensor("SCALED", "FP32", [3]),
        corral.Tensor("UPPER", "BYTES", [1]),
        corral.Tensor("BATCH", "INT64", [2]),
    )
    batches = 0

    def preprocess(self, row):
        if bytes(row["TEXT"][0]) == b"reject":
            raise corral.ValidationError("this row is rejected")
        return row

    def forward(self, rows):
        gate = os.environ.get("TENSORS_GATE")
        while gate and not os.path.exists(gate):
            time.sleep(0.005)  # the test opens the gate once enough jobs are queued
        self.batches += 1
        return [
            {
                "SUM": np.array([row["X"].sum()], dtype=np.float32),
                "SCALED": row["X"] * row["N"][0],
                "UPPER": np.array([bytes(row["TEXT"][0]).upper()], dtype=object),
                "BATCH": np.array([self.batches, len(rows)]),
            }
            for row in rows
        ]


if __name__ == "__main__":
    Tensors.run()
