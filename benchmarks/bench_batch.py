"""Convert a small model zoo with `onnx2tf-alt batch`: --jobs 1 against --jobs 2, a resumed
rerun, a --baseline with an injected regression, and (with --ray) the same batch on a
local Ray cluster; prints the counts by outcome and the wall times. With --check every batch
also checks accuracy and times each .tflite against onnxruntime (and the baseline gets an
injected latency regression too).

    python benchmarks/bench_batch.py [--work DIR] [--ray] [--check]

The zoo: tiny onnx.helper models (Conv/Relu/Pool/Gemm/elementwise variants), the shipped
tests/data/mobilenet_block.onnx, one model with an op no handler converts, one stopped by
a 1 s timeout and one by a 150 MB memory cap.
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
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(nodes, x_shape, y_shape, inits=None, domains=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (inits or {}).items()])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains or []]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def tiny_models() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    models = {}
    for c in (4, 8, 16):
        for k in (1, 3):
            w = rng.standard_normal((c, 3, k, k))
            nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[k // 2] * 4),
                     helper.make_node("Relu", ["c"], ["y"])]
            models[f"conv{c}_k{k}"] = _model(nodes, [1, 3, 16, 16], [1, c, 16, 16], {"w": w})
    for op in ("Relu", "Sigmoid", "Tanh", "Abs"):
        models[op.lower()] = _model([helper.make_node(op, ["x"], ["y"])], [2, 8], [2, 8])
    for op in ("Add", "Mul", "Sub"):
        nodes = [helper.make_node(op, ["x", "b"], ["y"])]
        models[op.lower()] = _model(nodes, [2, 4, 6], [2, 4, 6], {"b": rng.standard_normal(6)})
    models["maxpool"] = _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                                 strides=[2, 2])], [1, 3, 8, 8], [1, 3, 4, 4])
    models["gap"] = _model([helper.make_node("GlobalAveragePool", ["x"], ["y"])],
                           [1, 5, 7, 7], [1, 5, 1, 1])
    models["gemm"] = _model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [3, 10],
                            [3, 6], {"w": rng.standard_normal((6, 10))})
    models["unsupported"] = _model(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example.bench")], [1, 4],
        [1, 4], domains=["com.example.bench"])
    return models


def build_zoo(folder: str) -> str:
    """Write the models and a manifest; returns the manifest's path."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for name, model in tiny_models().items():
        onnx.save(model, os.path.join(folder, f"{name}.onnx"))
        entries.append({"path": f"{name}.onnx"} | (
            {"expect": "failed"} if name == "unsupported" else {}))
    entries.append({"path": os.path.join(REPO, "tests", "data", "mobilenet_block.onnx")})
    entries.append({"path": "relu.onnx", "name": "relu_timeout", "timeout": 1,
                    "expect": "timeout"})
    entries.append({"path": "relu.onnx", "name": "relu_memory", "memory_limit_mb": 150,
                    "expect": "memory"})
    manifest = os.path.join(folder, "zoo.jsonl")
    with open(manifest, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return manifest


def run_batch(*args: str) -> tuple[int, float, list[dict]]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "onnx2tf_alt", "batch", *args],
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    out = args[args.index("-o") + 1]
    with open(os.path.join(out, "batch_results.jsonl")) as f:
        records = [json.loads(line) for line in f]
    print(proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else proc.stderr[-500:])
    print("".join(f"{line}\n" for line in proc.stdout.splitlines() if "regression:" in line),
          end="")
    return proc.returncode, wall, records


def counts(records: list[dict]) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in records:
        key = r["outcome"] + (f"({r['actual']})" if r["outcome"] == "expected-failure" else "")
        found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", help="working folder (default: a new temporary one)")
    p.add_argument("--ray", action="store_true", help="also run the batch on local Ray")
    p.add_argument("--check", action="store_true", help="pass --check to every batch")
    args = p.parse_args()
    check = ["--check"] if args.check else []
    work = args.work or tempfile.mkdtemp(prefix="bench_batch_")
    manifest = build_zoo(os.path.join(work, "zoo"))
    with open(manifest) as f:
        print(f"{sum(1 for _ in f)} models, manifest {manifest}")
    rows = {}
    for label, out, extra in [("jobs 1", "out1", ["--jobs", "1"]),
                              ("jobs 2", "out2", ["--jobs", "2"]),
                              ("jobs 2, resumed", "out2", ["--jobs", "2"])]:
        code, wall, records = run_batch(manifest, "-o", os.path.join(work, out), *extra, *check)
        resumed = sum(bool(r.get("resumed")) for r in records)
        rows[label] = wall
        print(f"{label:18s} exit {code}  {wall:6.1f} s  resumed {resumed:2d}  {counts(records)}")
    print(f"jobs 1 / jobs 2 wall time: {rows['jobs 1'] / rows['jobs 2']:.2f}x")
    baseline = os.path.join(work, "baseline.jsonl")
    with open(os.path.join(work, "out2", "batch_results.jsonl")) as f:
        previous = [json.loads(line) for line in f]
    for r in previous:  # inject a regression: mobilenet_block used to take a tenth of the time
        if r["name"] == "mobilenet_block":
            r["wall_s"] = r["wall_s"] / 10
            if "latency_ratio" in r:  # ... and to run at half the ratio, in a tenth of the ms
                r["latency_ratio"] /= 2
                r["latency_ms"]["tflite"] /= 10
    with open(baseline, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in previous)
    code, wall, _ = run_batch(manifest, "-o", os.path.join(work, "out3"), "--jobs", "2",
                              "--baseline", baseline, *check)
    print(f"{'--baseline':18s} exit {code}  {wall:6.1f} s  (fresh folder; exit 1 expected)")
    if args.ray:
        code, wall, records = run_batch(manifest, "-o", os.path.join(work, "out_ray"),
                                        "--ray", "local", "--jobs", "2", *check)
        same = ({r["name"]: r["outcome"] for r in records}
                == {r["name"]: r["outcome"] for r in previous})
        print(f"{'ray local':18s} exit {code}  {wall:6.1f} s  {counts(records)}  "
              f"same outcomes as local: {same}")
    print(f"summaries: {os.path.join(work, 'out2', 'batch_summary.html')}")


if __name__ == "__main__":
    main()
