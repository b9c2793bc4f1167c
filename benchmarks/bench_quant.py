"""Quantized TFLite accuracy per variant and quant type, side by side in one run.

For each image classifier (one NCHW float input) the CLI writes every quantized file with
-odrqt -oiqt, once per channel and once per tensor (-qt), calibrated on the shipped photographs;
the script prints the cosine similarity / top-1 agreement against the float32 TFLite on the
held-out photographs (from <stem>_quant_report.json) and the op and tensor-dtype census of the
full-integer files. With --qdq it also quantizes the model with onnxruntime.quantization
(QDQ, per-tensor and per-channel), converts that QDQ model with -oiqt and compares its INT8
TFLite with onnxruntime running the QDQ model on the held-out photographs.

--flags passes more CLI flags (e.g. a trained model's own -ois/-cind data,
--calibration_method, --keep_float_auto); --per_channel_only skips the per-tensor run; each
file's latency at 1 thread (median of --runs
invocations, ai-edge-litert) is printed beside the float32 file's, with the float nodes the
INT8 files kept (from the quant report's 'sensitivity').

    python benchmarks/bench_quant.py model.onnx [more.onnx ...] [--qdq] [--json out.json]
    python benchmarks/bench_quant.py det.onnx --per_channel_only \
        --flags "-ois x:1,3,640,640 -cind x text.npy 0.5 0.5 --keep_float_auto 0.99"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import run_rows  # the benchmarks' shared row loop


def cli(path: str, out: str, *flags: str) -> None:
    subprocess.run([sys.executable, "-m", "onnx2tf_alt", "-i", path, "-o", out, "-n", *flags],
                   check=True)


def census(content: bytes) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    ops, dtypes = {}, {}
    for op in interpreter._get_ops_details():
        ops[op["op_name"]] = ops.get(op["op_name"], 0) + 1
    for t in interpreter.get_tensor_details():
        name = np.dtype(t["dtype"]).name
        dtypes[name] = dtypes.get(name, 0) + 1
    return {"ops": ops, "tensor_dtypes": dtypes}


def latency_ms(path: str, runs: int) -> float:
    """Median time of one invocation at 1 thread, inputs zero (after one warm-up run)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
    interpreter.invoke()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 2)


def photos(model: onnx.ModelProto) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, held-out) NCHW photographs at the model's input size."""
    from calibration.photos import image_samples

    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calibration, held = image_samples(dims[2], dims[3], dims[1])
    return (np.transpose(a, (0, 3, 1, 2)).astype(np.float32) for a in (calibration, held))


def variants_row(path: str, flags: list[str], per_channel_only: bool, runs: int,
                 tmp: str) -> dict:
    stem = os.path.splitext(os.path.basename(path))[0]
    row = {"model": stem}
    for quant_type in ("per-channel",) if per_channel_only else ("per-channel", "per-tensor"):
        out = os.path.join(tmp, quant_type)
        cli(path, out, "-odrqt", "-oiqt", "-qt", quant_type, *flags)
        with open(os.path.join(out, f"{stem}_quant_report.json")) as f:
            report = json.load(f)
        for entry in report["files"]:
            key = f"{quant_type}/{entry['variant']}"
            if entry.get("error") or not entry.get("outputs"):
                row[key] = entry.get("error") or entry.get("not_measured")
                continue
            metrics = next(iter(entry["outputs"].values()))
            row[key] = {k: round(v, 5) for k, v in metrics.items()
                        if k not in ("max_abs_error", "cosine_per_sample")}
        if report.get("sensitivity"):
            sensitivity = report["sensitivity"]
            row[f"{quant_type}/kept_float_nodes"] = sensitivity["kept_float_nodes"]
            row[f"{quant_type}/float_ops"] = sensitivity["float_ops"]
            row[f"{quant_type}/top_offenders"] = [
                (r["nodes"], r["estimated_gain"]) for r in sensitivity["top_offenders"][:5]]
        if runs:
            for entry in [{"file": f"{stem}_float32.tflite"}, *report["files"]]:
                file = os.path.join(out, entry["file"])
                if os.path.isfile(file):
                    key = f"{quant_type}/ms_1_thread/{entry['file'][len(stem) + 1:]}"
                    try:
                        row[key] = latency_ms(file, runs)
                    except RuntimeError as exc:  # a kernel the interpreter lacks
                        row[key] = str(exc).strip().splitlines()[0]
        if quant_type == "per-channel":
            for suffix in ("full_integer_quant", "full_integer_quant_with_int16_act"):
                with open(os.path.join(out, f"{stem}_{suffix}.tflite"), "rb") as f:
                    row[f"census/{suffix}"] = census(f.read())
    return row


def qdq_row(path: str, per_channel: bool, tmp: str) -> dict:
    from ai_edge_litert.interpreter import Interpreter
    from onnxruntime import InferenceSession
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    model = onnx.load(path)
    name = model.graph.input[0].name
    calibration, held = photos(model)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rows = iter(calibration)

        def get_next(self):
            row = next(self.rows, None)
            return None if row is None else {name: row[np.newaxis]}

    stem = f"{os.path.splitext(os.path.basename(path))[0]}_qdq_{'pc' if per_channel else 'pt'}"
    qdq_path = os.path.join(tmp, f"{stem}.onnx")
    quantize_static(path, qdq_path, Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel)
    out = os.path.join(tmp, stem)
    cli(qdq_path, out, "-oiqt")
    with open(os.path.join(out, f"{stem}_io_layout.json")) as f:
        layout = json.load(f)
    session = InferenceSession(qdq_path, providers=["CPUExecutionProvider"])
    row = {"model": stem}
    for suffix in ("integer_quant", "full_integer_quant"):
        runner = Interpreter(
            model_path=os.path.join(out, f"{stem}_{suffix}.tflite")).get_signature_runner()
        inputs, outputs = runner.get_input_details(), runner.get_output_details()
        entry_in, entry_out = layout["inputs"][0], layout["outputs"][0]
        cosines, agree = [], []
        for image in held:
            x = np.transpose(image[np.newaxis], entry_in["perm"])
            detail = inputs[entry_in["tf_name"]]
            scale, zero = detail["quantization"]
            if np.dtype(detail["dtype"]).kind in "iu" and scale:
                x = np.clip(np.round(x / scale) + zero, -128, 127).astype(detail["dtype"])
            y = runner(**{entry_in["tf_name"]: x})[entry_out["tf_name"]]
            scale, zero = outputs[entry_out["tf_name"]]["quantization"]
            if y.dtype.kind in "iu" and scale:
                y = (y.astype(np.float32) - zero) * scale
            ref = session.run(None, {name: image[np.newaxis]})[0]
            a, b = y.ravel().astype(np.float64), ref.ravel().astype(np.float64)
            cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
            agree.append(int(np.argmax(a) == np.argmax(b)))
        row[suffix] = {"cosine_vs_ort_qdq": round(float(np.mean(cosines)), 5),
                       "cosine_min": round(min(cosines), 5),
                       "top1_agreement": float(np.mean(agree))}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--qdq", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--flags", default="", help="more CLI flags for the per-channel run")
    parser.add_argument("--per_channel_only", action="store_true")
    parser.add_argument("--runs", type=int, default=10, help="latency runs per file (0: none)")
    args = parser.parse_args()
    def in_tmp(row_fn, *args):
        with tempfile.TemporaryDirectory() as tmp:
            return row_fn(*args, tmp)

    jobs = []
    for path in args.models:
        if args.qdq:
            jobs += [(path, lambda p=path, pc=pc: in_tmp(qdq_row, p, pc)) for pc in (False, True)]
        else:
            jobs.append((path, lambda p=path: in_tmp(
                variants_row, p, shlex.split(args.flags), args.per_channel_only, args.runs)))
    run_rows(jobs, args.json)


if __name__ == "__main__":
    main()
