"""Regenerate tests/data/mobilenet_block.onnx, the small model the README converts.

A MobileNetV2-style network (conv-BN-ReLU6 stem, inverted residual with a depthwise conv,
global pooling, linear head) with seeded random weights, exported by PyTorch.

    python tests/data/make_example.py
"""

import os

import torch
from torch import nn


class MobileNetBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.block = nn.Sequential(
            nn.Conv2d(16, 64, 1), nn.BatchNorm2d(64), nn.ReLU6(),
            nn.Conv2d(64, 64, 3, 1, 1, groups=64), nn.BatchNorm2d(64), nn.ReLU6(),
            nn.Conv2d(64, 16, 1), nn.BatchNorm2d(16),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = MobileNetBlock().eval()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mobilenet_block.onnx")
    torch.onnx.export(
        model, (torch.randn(1, 3, 64, 64),), path, dynamo=False, opset_version=17,
        input_names=["image"], output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
    )
    print("wrote", path, os.path.getsize(path), "bytes")
