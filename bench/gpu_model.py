"""The GPU run's model, shared by the in-process limit, the Corral worker and the MOSEC worker:
torchvision's ResNet-50 from its definition (random weights: the real architecture's cost, no
download), fp16 on cuda:0. A batch of n items is n images made on the GPU (see bench/gpu.py)."""

from __future__ import annotations

import torch
import torchvision


class Model:
    def __init__(self) -> None:
        self.device = torch.device("cuda:0")
        net = torchvision.models.resnet50(weights=None)
        self.net = net.to(self.device).half().eval().to(memory_format=torch.channels_last)

    @torch.inference_mode()
    def run(self, n: int) -> list[int]:
        images = torch.randn(n, 3, 224, 224, device=self.device, dtype=torch.half)
        images = images.to(memory_format=torch.channels_last)
        return self.net(images).argmax(dim=1).tolist()
