"""INT8 files judged on samples no step of the conversion saw, next to onnxruntime's own static
quantization on the same calibration samples, in one run.

    python benchmarks/bench_int8_heldout.py model.onnx --cal cal.npy --held held.npy [more.npy] \
        [--input x] [--shape 1,3,640,640]
        [--variants default direct tf_quantizer percentile no_bias keep_auto direct_keep_auto
         direct_minmax direct_percentile]
        [--ort MinMax Percentile Entropy] [--out DIR] [--json out.json]

Each variant is one CLI run (`-oiqt -cind INPUT cal.npy` plus its flags, timed: `direct`
adds -dms, which calibrates and quantizes without TF; `tf_quantizer` makes the 8-bit files
with TF's MLIR quantizer, the oracle the own quantizer replaced); every
quantized .tflite it writes is run on each held-out set and compared with the float32
TFLite of the same run: mean and lowest per-sample cosine (samples whose float output is
empty left out and counted), pooled cosine and SQNR (onnx2tf_alt/quant/measure.py), plus
the figure the quant report gives for that file on its own held-out samples. `--ort` adds
onnxruntime.quantization.quantize_static (QDQ, per-channel weights, the named calibration
methods, the same calibration samples) run by onnxruntime against the float ONNX model.
Inputs are in ONNX layout (see benchmarks/ocr_samples.py for a text detector's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
from ai_edge_litert.interpreter import Interpreter

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import peer_feeds

from onnx2tf_alt.quant.measure import compare_output
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE
from onnx2tf_alt.tflite.run import as_input, run_signature

VARIANTS = {
    "default": [],
    "direct": ["-dms"],  # the direct writer's float file, calibrated and quantized without TF
    "tf_quantizer": [],  # the INT8 files by TF's MLIR quantizer (the oracle), as before 2026-12
    "percentile": ["--calibration_method", "percentile"],
    "direct_minmax": ["-dms", "--calibration_method", "minmax"],
    "direct_percentile": ["-dms", "--calibration_method", "percentile"],
    "no_bias": ["--no_bias_correction"],
    "keep_auto": ["--keep_float_auto", "0.99"],  # ranked by the TF model's gradient
    # without TF: ops ranked by measuring re-quantized files (quant/group_ranking.py)
    "direct_keep_auto": ["-dms", "--keep_float_auto", "0.99"],
}


# the CLI with TF's MLIR quantizer in place of the own one for the 8-bit files (the INT16
# ones stay the own quantizer's: TF's 16x8 mode fails on a MUL by a constant)
ORACLE = ("import sys\n"
          "import onnx2tf_alt.quant.sensitivity as s\n"
          "s.quantize_calibrated = s.tf_quantize_calibrated\n"
          "from onnx2tf_alt.cli.main import main\n"
          "sys.exit(main(sys.argv[1:]))\n")


def run_tflite(path: str, samples: np.ndarray, name: str) -> list[np.ndarray]:
    interpreter = Interpreter(model_path=path, num_threads=2)
    runner = interpreter.get_signature_runner(SIGNATURE)
    details = runner.get_input_details()
    outputs = []
    for x in samples:
        feeds = peer_feeds(runner, {name: x[None]})
        feeds = {k: as_input(v, details[k]) for k, v in feeds.items()}
        out = run_signature(interpreter, feeds)
        key = min(out)
        value = out[key]
        scale, zero = runner.get_output_details()[key]["quantization"]
        if value.dtype.kind in "iu" and scale:
            value = (value.astype(np.float32) - zero) * scale
        outputs.append(value.astype(np.float32))
    return outputs


def onnx_layout(outputs: list[np.ndarray], reference_shape: tuple) -> list[np.ndarray]:
    """TFLite outputs in the ONNX model's layout (channel-last maps moved back)."""
    fixed = []
    for value in outputs:
        if value.shape != reference_shape and value.ndim == 4:
            value = value.transpose(0, 3, 1, 2)
        fixed.append(value)
    return fixed


def row(label: str, references: list[np.ndarray], actuals: list[np.ndarray], **extra) -> dict:
    m = compare_output(references, actuals)
    return {"file": label, "mean": round(m["cosine"], 4), "lowest": round(m["cosine_min"], 4),
            "pooled": m["cosine_pooled"], "sqnr_db": m["sqnr_db"],
            "empty": m["empty_samples"], **({"iou": m["iou"]} if "iou" in m else {}), **extra}


def set_label(path: str, paths: list[str]) -> str:
    """A held-out set's name: its file's stem, with its folder where two files share it."""
    stem = os.path.splitext(os.path.basename(path))[0]
    shared = sum(os.path.splitext(os.path.basename(p))[0] == stem for p in paths) > 1
    return f"{os.path.basename(os.path.dirname(os.path.abspath(path)))}/{stem}" if shared \
        else stem


def ort_static(model: str, cal: np.ndarray, name: str, method: str, out: str) -> str:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{name: x[None]} for x in cal])

        def get_next(self):
            return next(self.items, None)

    pre = os.path.join(out, "pre.onnx")
    if not os.path.exists(pre):
        try:
            quant_pre_process(model, pre)
        except Exception:  # noqa: BLE001 - its symbolic shape inference fails on some exports
            # (Paddle2ONNX's); without it, its graph optimizations make fused Conv nodes
            # whose quantized form onnxruntime then refuses to load: both skipped
            quant_pre_process(model, pre, skip_symbolic_shape=True, skip_optimization=True)
    target = os.path.join(out, f"ort_{method}.onnx")
    quantize_static(pre, target, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--cal", required=True)
    parser.add_argument("--held", required=True, nargs="+",
                        help="held-out sets (.npy), each judged on its own")
    parser.add_argument("--input", default="x")
    parser.add_argument("--shape", help="static input shape for -ois, e.g. 1,3,640,640")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--ort", nargs="*", default=[])
    parser.add_argument("--out")
    parser.add_argument("--json")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the files already in OUT/<variant> instead of converting")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="int8_heldout_")
    sets = {set_label(p, args.held): np.load(p) for p in args.held}
    stem = os.path.splitext(os.path.basename(args.model))[0]
    session = ort.InferenceSession(args.model)
    onnx_refs = {label: [session.run(None, {args.input: x[None]})[0] for x in held]
                 for label, held in sets.items()}
    rows = []

    def add(label: str, **fields) -> None:
        rows.append({"file": label, **fields})
        print(json.dumps(rows[-1]), flush=True)

    for variant in args.variants:
        folder = os.path.join(out, variant)
        launch = [sys.executable, "-c", ORACLE] if variant == "tf_quantizer" else [
            sys.executable, "-m", "onnx2tf_alt"]
        command = [*launch, "-i", args.model, "-o", folder, "-oiqt",
                   "-cind", args.input, os.path.abspath(args.cal), *VARIANTS[variant]]
        if args.shape:
            command += ["-ois", f"{args.input}:{args.shape}"]
        seconds = None
        if not (args.reuse and os.path.isdir(folder)):
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            seconds = round(time.perf_counter() - start, 1)
            if done.returncode:
                add(variant, error=done.stderr.strip().splitlines()[-1])
                continue
        with open(os.path.join(folder, f"{stem}_quant_report.json")) as f:
            reported = {e["file"]: e for e in json.load(f)["files"]}
        float_path = os.path.join(folder, f"{stem}_float32.tflite")
        for label, held in sets.items():
            refs = onnx_layout(run_tflite(float_path, held, args.input), onnx_refs[label][0].shape)
            for suffix in ("full_integer_quant", "integer_quant", "dynamic_range_quant",
                           "full_integer_quant_with_int16_act", "integer_quant_with_int16_act"):
                name = f"{stem}_{suffix}.tflite"
                path = os.path.join(folder, name)
                if not os.path.exists(path):
                    continue
                actual = onnx_layout(run_tflite(path, held, args.input), refs[0].shape)
                outputs = (reported.get(name) or {}).get("outputs") or {}
                in_report = min((o.get("cosine_pooled", o["cosine"]) for o in outputs.values()),
                                default=None)
                rows.append({**row(f"{variant}: {suffix}", refs, actual, seconds=seconds,
                                   report_figure=in_report), "set": label})
                print(json.dumps(rows[-1]), flush=True)
    for method in args.ort:
        label = f"onnxruntime QDQ per-channel {method}"
        try:
            qdq = ort.InferenceSession(ort_static(args.model, np.load(args.cal), args.input,
                                                  method, out))
        except Exception as exc:  # noqa: BLE001 - reported in its row
            add(label, error=f"{type(exc).__name__}: {exc}"[:200])
            continue
        for name, held in sets.items():
            actual = [qdq.run(None, {args.input: x[None]})[0] for x in held]
            rows.append({**row(label, onnx_refs[name], actual), "set": name})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nheld-out sets: {', '.join(f'{k} ({len(v)} samples)' for k, v in sets.items())}; "
          "cosine against the float32 TFLite (onnxruntime's rows: against the float ONNX model)")
    print("| file | set | mean | lowest | pooled | SQNR dB | empty | report's figure | "
          "conversion s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['file']} | | error: {r['error']} |||||||")
            continue
        print(f"| {r['file']} | {r['set']} | {r['mean']} | {r['lowest']} | {r['pooled']} | "
              f"{r['sqnr_db']} | {r['empty']} | {r.get('report_figure', '-')} | "
              f"{r.get('seconds', '-')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
