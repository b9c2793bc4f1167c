"""Export torchvision architectures with random weights (no download) to ONNX.

Needs torch + torchvision (e.g. `pip install torch==2.14.1 torchvision==0.29.1` in a separate
venv). Usage:

    python benchmarks/export_torchvision.py OUT_DIR [resnet18 mobilenet_v2 ...]
"""

from __future__ import annotations

import inspect
import os

import torch
import torchvision

DEFAULT = [
    "resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1",
    "convnext_tiny",
]


# Random weights give near-constant scores: thresholds of 0 keep the post-processing busy.
_DETECTOR_THRESHOLDS = {
    "fasterrcnn": {"box_score_thresh": 0.0}, "maskrcnn": {"box_score_thresh": 0.0},
    "keypointrcnn": {"box_score_thresh": 0.0}, "retinanet": {"score_thresh": 0.0},
    "fcos": {"score_thresh": 0.0}, "ssd300": {"score_thresh": 0.0},
    "ssdlite320": {"score_thresh": 0.0},
}


# Video models trained on 112x112 clips; the others (s3d, mvit, swin3d) need 224x224.
_SMALL_CLIPS = {"r3d_18", "mc3_18", "r2plus1d_18"}


def export(name: str, out_dir: str, size: int = 224) -> str:
    torch.manual_seed(0)
    families = (torchvision.models, torchvision.models.segmentation, torchvision.models.video,
                torchvision.models.detection)
    factory = next(getattr(f, name) for f in families if hasattr(f, name))
    takes = inspect.signature(factory).parameters  # segmenters: no backbone weights either
    kwargs = {"weights_backbone": None} if "weights_backbone" in takes else {}
    detector = hasattr(torchvision.models.detection, name)
    if detector:  # keep every candidate box, as trained weights would give NMS real work
        kwargs.update(_DETECTOR_THRESHOLDS.get(name.split("_")[0], {}))
    model = factory(weights=None, **kwargs).eval()
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    path = os.path.join(out_dir, f"{name}.onnx")
    # Not under no_grad: that sends attention layers down a fused fast path
    # (aten::_native_multi_head_attention) that the exporter cannot express.
    outputs = ["boxes", "labels", "scores"] if detector else ["logits"]
    shape = (1, 3, size, size)
    if hasattr(torchvision.models.video, name):  # (N, C, T, H, W) clips of 16 frames
        shape = (1, 3, 16, *(2 * (112 if name in _SMALL_CLIPS else size,)))
    torch.onnx.export(model, (torch.randn(*shape),), path, dynamo=False,
                      opset_version=17, input_names=["input"], output_names=outputs)
    return path


if __name__ == "__main__":
    from export_main import run

    run(__doc__, export, DEFAULT)
