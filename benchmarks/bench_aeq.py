"""Google's ai-edge-quantizer on the project's own float32 file, next to the project's
quantized files of the same conversion, judged on the same held-out samples in one run.

    python benchmarks/bench_aeq.py FOLDER --cal cal.npy --held held.npy [more.npy] --aeq-python PY
        [--recipes static_wi8_ai8 static_wi8_ai16] [--json out.json]

FOLDER holds one conversion (`-oiqt -cind INPUT cal.npy`, e.g. a variant folder of
bench_int8_heldout.py): its `<stem>_float32.tflite` is quantized by ai-edge-quantizer with
each recipe, calibrated on the same samples (cal.npy, ONNX layout, laid out as the file's
signature wants), in the Python `--aeq-python` names (a venv with `pip install
ai-edge-quantizer`; it needs neither this package nor TF); the time is that process's.
Every file — the project's INT8 and INT16 ones from FOLDER and ai-edge-quantizer's — is
then run on each held-out set and compared with the float32 file: mean and lowest per-sample
cosine, pooled cosine and SQNR (bench_int8_heldout.row).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_int8_heldout import row, run_tflite, set_label

# run in the ai-edge-quantizer venv: argv = float file, calibration .npy (signature layout),
# input name, recipe, output file
QUANTIZE = """
import sys
import numpy as np
from ai_edge_quantizer import quantizer, recipe
source, samples, name, chosen, target = sys.argv[1:]
data = np.load(samples)
q = quantizer.Quantizer(source)
q.load_quantization_recipe(getattr(recipe, chosen)())
ranges = q.calibrate({"serving_default": [{name: x[None]} for x in data]})
q.quantize(ranges, enable_progress_report=False).export_model(target, overwrite=True)
"""


def signature_input(path: str) -> tuple[str, list[int]]:
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_path=path).get_signature_runner().get_input_details()
    (name, detail), = details.items()
    return name, [int(d) for d in detail["shape"]]


def laid_out(samples: np.ndarray, shape: list[int]) -> np.ndarray:
    """ONNX-layout samples (N, C, ...) as the signature's (1, ..., C) when it is channel
    last."""
    if list(samples.shape[1:]) == shape[1:]:
        return samples
    moved = np.moveaxis(samples, 1, -1)
    assert list(moved.shape[1:]) == shape[1:], (samples.shape, shape)
    return np.ascontiguousarray(moved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--cal", required=True)
    parser.add_argument("--held", required=True, nargs="+",
                        help="held-out sets (.npy), each judged on its own")
    parser.add_argument("--aeq-python", required=True)
    parser.add_argument("--recipes", nargs="*", default=["static_wi8_ai8", "static_wi8_ai16"])
    parser.add_argument("--json")
    args = parser.parse_args()
    (float_path,) = glob.glob(os.path.join(args.folder, "*_float32.tflite"))
    stem = os.path.basename(float_path).removesuffix("_float32.tflite")
    name, shape = signature_input(float_path)
    cal = laid_out(np.load(args.cal), shape)
    work = os.path.join(args.folder, "aeq")
    os.makedirs(work, exist_ok=True)
    cal_path = os.path.join(work, "cal_signature_layout.npy")
    np.save(cal_path, cal)
    files = {f"ours: {suffix}": os.path.join(args.folder, f"{stem}_{suffix}.tflite")
             for suffix in ("integer_quant", "integer_quant_with_int16_act")}
    seconds = {}
    for chosen in args.recipes:
        target = os.path.join(work, f"{stem}_{chosen}.tflite")
        start = time.perf_counter()
        done = subprocess.run([args.aeq_python, "-c", QUANTIZE, float_path, cal_path, name,
                               chosen, target], capture_output=True, text=True, check=False)
        seconds[f"ai-edge-quantizer: {chosen}"] = round(time.perf_counter() - start, 1)
        if done.returncode:
            print(f"{chosen}: {done.stderr.strip().splitlines()[-1]}", flush=True)
            continue
        files[f"ai-edge-quantizer: {chosen}"] = target
    rows = []
    for held_path in args.held:
        held = np.load(held_path)
        refs = run_tflite(float_path, held, name)
        label_set = set_label(held_path, args.held)
        for label, path in files.items():
            if not os.path.exists(path):
                continue
            actual = run_tflite(path, held, name)  # laid out as the float file's outputs
            rows.append({**row(label, refs, actual, seconds=seconds.get(label)),
                         "set": label_set})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\ncosine against the float32 TFLite of {args.folder}, per held-out set")
    print("| file | set | mean | lowest | pooled | SQNR dB | quantizer s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['set']} | {r['mean']} | {r['lowest']} | {r['pooled']} | "
              f"{r['sqnr_db']} | {r.get('seconds') or ''} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
