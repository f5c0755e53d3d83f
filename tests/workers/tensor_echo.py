"""A v2 worker for tests at real sizes: one FP32 input of any length per row, answered with the
row doubled, as the declared FP32 output."""

import corral


class Double(corral.Worker):
    inputs = (corral.Tensor("X", "FP32", [-1]),)
    outputs = (corral.Tensor("Y", "FP32", [-1]),)

    def forward(self, rows):
        return [{"Y": row["X"] * 2} for row in rows]


if __name__ == "__main__":
    Double.run()
