"""Small PyTorch architectures exported with random weights: building blocks of the public
CNNs (ResNet, MobileNetV2/V3, EfficientNet, ConvNeXt, SqueezeNet), a ViT patch embedding
and a 2-layer TransformerEncoder. Each must match onnxruntime through TF and the float32
TFLite, with no TRANSPOSE beyond the ONNX graph's own Transpose nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from harness import check_model, count_tflite_ops

torch = pytest.importorskip("torch")
nn = torch.nn


class ResNetBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(32))
        self.down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.body(x) + self.down(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MobileNetV2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.block = nn.Sequential(
            nn.Conv2d(16, 64, 1), nn.BatchNorm2d(64), nn.ReLU6(),
            nn.Conv2d(64, 64, 3, 1, 1, groups=64), nn.BatchNorm2d(64), nn.ReLU6(),
            nn.Conv2d(64, 16, 1), nn.BatchNorm2d(16),
        )
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(16, 10))

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(x.mean([2, 3]))


class SqueezeExcite(nn.Module):
    def __init__(self, c, gate):
        super().__init__()
        self.fc1, self.fc2, self.gate = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1), gate

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(torch.relu(self.fc1(s))))


class MobileNetV3Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 5, 2, 2, groups=16), nn.BatchNorm2d(16),
                                nn.Hardswish())
        self.se = SqueezeExcite(16, nn.Hardsigmoid())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.se(self.dw(self.stem(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class EfficientNetBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16),
                                nn.SiLU())
        self.se = SqueezeExcite(16, nn.Sigmoid())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.se(self.dw(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ConvNeXtBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 4, 4)
        self.dw = nn.Conv2d(32, 32, 7, padding=3, groups=32)
        self.norm = nn.LayerNorm(32, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(32, 128), nn.Linear(128, 32)
        self.gamma = nn.Parameter(torch.rand(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y)))) * self.gamma
        x = x + y.permute(0, 3, 1, 2)
        return self.head(x.mean([-2, -1]))


class SqueezeNetFire(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, ceil_mode=True))
        self.squeeze = nn.Conv2d(32, 8, 1)
        self.e1, self.e3 = nn.Conv2d(8, 16, 1), nn.Conv2d(8, 16, 3, padding=1)
        self.classifier = nn.Conv2d(32, 10, 1)

    def forward(self, x):
        s = torch.relu(self.squeeze(self.stem(x)))
        x = torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)
        x = nn.functional.adaptive_avg_pool2d(torch.relu(self.classifier(x)), 1)
        return torch.flatten(x, 1)


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 48, 8, 8)
        self.norm = nn.LayerNorm(48)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


def encoder():
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


CASES = {
    "resnet_block": (ResNetBlock, (2, 3, 64, 64)),
    "mobilenet_v2_block": (MobileNetV2Block, (2, 3, 48, 48)),
    "mobilenet_v3_block": (MobileNetV3Block, (2, 3, 48, 48)),
    "efficientnet_block": (EfficientNetBlock, (2, 3, 48, 48)),
    "convnext_block": (ConvNeXtBlock, (2, 3, 64, 64)),
    "squeezenet_fire": (SqueezeNetFire, (2, 3, 63, 63)),
    "vit_patch_embed": (PatchEmbed, (2, 3, 64, 64)),
    "transformer_encoder": (encoder, (2, 10, 32)),
}


def export(name, tmp_path_factory) -> tuple[onnx.ModelProto, dict]:
    factory, shape = CASES[name]
    torch.manual_seed(0)
    module = factory().eval()
    for m in module.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(*shape)
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    # Not under no_grad: that would send TransformerEncoder down its fused fast path, which
    # the exporter cannot express.
    torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    return onnx.load(str(path)), {"x": x.numpy().astype(np.float32)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_torch_model(name, tmp_path_factory):
    model, feeds = export(name, tmp_path_factory)
    converted = check_model(model, feeds)
    onnx_transposes = sum(n.op_type == "Transpose" for n in model.graph.node)
    tflite_transposes = count_tflite_ops(converted.tflite).get("TRANSPOSE", 0)
    if name == "transformer_encoder":
        assert tflite_transposes <= onnx_transposes
    else:
        assert tflite_transposes == 0
