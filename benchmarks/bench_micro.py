"""--target micro on small architectures made for microcontrollers: does each full-integer
file run on TFLite Micro, how close are its outputs to ai-edge-litert's, how large are its
tensor arena and flatbuffer, how close is it to the float32 model, and how long does the
conversion take.

The models are exported by this script with torch (random weights, BatchNorm statistics set
by a few training-mode passes over synthetic inputs so that activations keep their scale):

- ds_cnn: the keyword-spotting DS-CNN (small) on 49 x 10 MFCC frames, 12 keywords;
- mobilenet_v2_035: torchvision's MobileNetV2, width 0.35, 96 x 96 RGB, 1000 classes;
- autoencoder: the anomaly-detection autoencoder of MLPerf Tiny (640 -> 8 -> 640, dense);
- person_detect: MobileNetV1 width 0.25 on 96 x 96 grayscale, 2 classes (the size of TFLite
  Micro's person-detection example);
- conv1d_audio: a 1-D conv classifier on 40 log-mel bands x 101 frames, 10 classes.

Image inputs are calibrated on the shipped photographs; the others on seeded synthetic
features (-cind, 20 samples: 16 calibrate, 4 held out). The cosine is the quant report's:
the full-integer file against the float32 .tflite on the held-out samples.

    python benchmarks/bench_micro.py OUT_DIR [--torch_python /path/to/python] [--json out.json]

Without --torch_python the models are exported with this interpreter (it needs torch and
torchvision then); the conversions always run here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

# name -> (input name, shape, whether the shipped photographs calibrate it)
MODELS = {
    "ds_cnn": ("mfcc", (1, 1, 49, 10), False),
    "mobilenet_v2_035": ("image", (1, 3, 96, 96), True),
    "autoencoder": ("features", (1, 640), False),
    "person_detect": ("image", (1, 1, 96, 96), True),
    "conv1d_audio": ("mel", (1, 40, 101), False),
}
SAMPLES = 20


# --- export (torch) ---------------------------------------------------------------------------
def torch_models() -> dict:
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, groups=1, pad=None, dims=2):
        conv = nn.Conv2d if dims == 2 else nn.Conv1d
        norm = nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d
        pad = k // 2 if pad is None else pad
        return [conv(cin, cout, k, stride, pad, groups=groups, bias=False), norm(cout),
                nn.ReLU()]

    def separable(cin, cout, stride=1):
        return conv_bn(cin, cin, 3, stride, groups=cin) + conv_bn(cin, cout, 1)

    ds_cnn = nn.Sequential(
        *conv_bn(1, 64, (10, 4), (2, 2), pad=(5, 1)),
        *[layer for _ in range(4) for layer in separable(64, 64)],
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 12))
    widths = [(8, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2),
              *[(128, 128, 1)] * 5, (128, 256, 2), (256, 256, 1)]
    person = nn.Sequential(
        *conv_bn(1, 8, 3, 2),
        *[layer for cin, cout, s in widths for layer in separable(cin, cout, s)],
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 2), nn.Softmax(-1))

    def dense(cin, cout):
        return [nn.Linear(cin, cout), nn.BatchNorm1d(cout), nn.ReLU()]

    sizes = [640, 128, 128, 128, 128, 8, 128, 128, 128, 128]
    autoencoder = nn.Sequential(
        *[layer for a, b in itertools.pairwise(sizes) for layer in dense(a, b)],
        nn.Linear(128, 640))
    audio = nn.Sequential(
        *conv_bn(40, 64, 3, dims=1), *conv_bn(64, 64, 3, 2, dims=1),
        *conv_bn(64, 128, 3, 2, dims=1), *conv_bn(128, 128, 3, dims=1),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 10))
    import torchvision

    mobilenet = torchvision.models.mobilenet_v2(weights=None, width_mult=0.35)
    return {"ds_cnn": ds_cnn, "mobilenet_v2_035": mobilenet, "autoencoder": autoencoder,
            "person_detect": person, "conv1d_audio": audio}


def export(out_dir: str) -> None:
    """Every model of MODELS as OUT_DIR/<name>.onnx, with OUT_DIR/<name>.npy samples for the
    inputs the photographs do not calibrate."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    for name, model in torch_models().items():
        input_name, shape, image = MODELS[name]
        model.train()
        with torch.no_grad():  # BatchNorm statistics of synthetic inputs
            for _ in range(8):
                model(torch.randn(16, *shape[1:]))
        model.eval()
        torch.onnx.export(model, (torch.randn(*shape),), os.path.join(out_dir, f"{name}.onnx"),
                          dynamo=False, opset_version=17, input_names=[input_name],
                          output_names=["output"])
        if not image:
            np.save(os.path.join(out_dir, f"{name}.npy"),
                    rng.standard_normal((SAMPLES, *shape[1:])).astype(np.float32))


# --- conversion and figures -------------------------------------------------------------------
def convert(out_dir: str, name: str, flags: tuple = ()) -> dict:
    input_name, _, image = MODELS[name]
    output = os.path.join(out_dir, f"out_{name}{'_'.join(('', *flags)).replace('-', '')}")
    command = [sys.executable, "-m", "onnx2tf_alt", "-i", os.path.join(out_dir, f"{name}.onnx"),
               "-o", output, "--target", "micro", "-n", *flags]
    if not image:
        command += ["-cind", input_name, os.path.join(out_dir, f"{name}.npy")]
    start = time.perf_counter()
    run = subprocess.run(command, check=False, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    row = {"model": name, "seconds": round(time.perf_counter() - start, 1),
           "runs": run.returncode == 0}
    if run.returncode:
        row["error"] = run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
        return row
    with open(os.path.join(output, f"{name}_micro.json")) as f:
        micro = json.load(f)
    with open(os.path.join(output, f"{name}_quant_report.json")) as f:
        quant = json.load(f)
    full = next(e for e in quant["files"] if e["variant"] == "full_integer_quant")
    row.update(
        arena_bytes=micro["arena_bytes"], flash_bytes=micro["flatbuffer_bytes"],
        ops=len(micro["ops"]), samples=micro["samples"],
        litert_lsb=max(o["max_abs_diff"] for o in micro["outputs"].values()),
        reference_lsb=max(o["max_abs_diff"] for o in micro["outputs_reference_kernels"].values()),
        cosine=min(o["cosine"] for o in full["outputs"].values()),
        cosine_min=min(o["cosine_min"] for o in full["outputs"].values()))
    return row


def table(rows: list[dict]) -> str:
    head = ("| model | runs on TFLite Micro | max diff vs litert (reference kernels) | arena "
            "bytes | flash bytes | ops | cosine vs float32 (lowest sample) | conversion s |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["runs"]:
            lines.append(f"| {r['model']} | no: {' '.join(r['error'])} | | | | | | "
                         f"{r['seconds']} |")
            continue
        lines.append(f"| {r['model']} | yes | {r['litert_lsb']:g} LSB ({r['reference_lsb']:g} "
                     f"LSB) | {r['arena_bytes']} | {r['flash_bytes']} | {r['ops']} | "
                     f"{r['cosine']:.6f} ({r['cosine_min']:.6f}) | {r['seconds']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--torch_python", help="the interpreter that exports the models")
    parser.add_argument("--export_only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--dms", action="store_true",
                        help="convert with -dms too (no TensorFlow), each model both ways")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.export_only:
        export(args.out_dir)
        return
    missing = [m for m in args.models if not os.path.isfile(os.path.join(args.out_dir,
                                                                          f"{m}.onnx"))]
    if missing:
        subprocess.run([args.torch_python or sys.executable, __file__, args.out_dir,
                        "--export_only"], check=True)
    rows = []
    for name in args.models:
        for flags in ((), ("-dms",)) if args.dms else ((),):
            rows.append(convert(args.out_dir, name, flags))
            rows[-1]["model"] += " -dms" if flags else ""
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
