"""The GPU run's Corral worker: the ResNet-50 of bench/gpu_model.py, one prediction per item.
Spawned with `--gpus 0`, it sees only that device (as cuda:0)."""

import corral
import gpu_model


class Gpu(corral.Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = gpu_model.Model()

    def forward(self, batch: list) -> list:
        return self.model.run(len(batch))


if __name__ == "__main__":
    Gpu.run()
