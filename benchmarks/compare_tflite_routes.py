"""The float32 .tflite with weights bound after conversion (tflite/late_weights.py)
against TF's converter seeing every weight, per model, in one run: op counts by type (and
any difference), TRANSPOSE counts, max |difference| of every output on random inputs
relative to max(1, |reference|), and the time of each route's conversion.

    python benchmarks/compare_tflite_routes.py MODEL.onnx [...] [--latency] [-ois NAME:DIMS]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np


def op_counts(content: bytes) -> collections.Counter:
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = unpack_model(content)
    return collections.Counter(op_name(model, op) for g in model.subgraphs for op in g.operators)


def run_shape(signature, run_dim: int = 1) -> list[int]:
    """The shape a file's input of `shape_signature` is run at: its run-time batch 1, its
    other run-time dims `run_dim` (an image's height and width)."""
    return [d if d > 0 else 1 if axis == 0 else run_dim for axis, d in enumerate(signature)]


def run(content: bytes, seed: int = 0, run_dim: int = 1) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    runner = interpreter.get_signature_runner()
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, detail in runner.get_input_details().items():
        shape = run_shape(detail["shape_signature"], run_dim)
        dtype = detail["dtype"]
        if np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, 4, shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    out = runner(**feeds)
    return [out[k] for k in sorted(out)]


def latency(content: bytes, runs: int = 20, run_dim: int = 1) -> float:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=1)
    runner = interpreter.get_signature_runner()
    feeds = {}
    for name, detail in runner.get_input_details().items():
        shape = run_shape(detail["shape_signature"], run_dim)
        feeds[name] = np.zeros(shape, detail["dtype"])
    runner(**feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runner(**feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def compare(path: str, with_latency: bool, shapes: list[str] | None = None) -> dict:
    from onnx2tf_alt.pipeline import build
    from onnx2tf_alt.tflite.lowering import _tflite_bytes, late_bound

    result = build(path, overwrite_input_shape=shapes).tflite_result()
    start = time.perf_counter()
    bound = late_bound(result)
    late = bound.to_bytes() if bound is not None else None
    late_s = time.perf_counter() - start
    start = time.perf_counter()
    reference = _tflite_bytes(result, False, True, None)
    reference_s = time.perf_counter() - start
    row = {"model": path, "late": late is not None, "late_s": late_s, "converter_s": reference_s}
    if late is None:
        return row
    a, b = op_counts(reference), op_counts(late)
    row["op_diff"] = {k: (a[k], b[k]) for k in sorted(set(a) | set(b)) if a[k] != b[k]}
    row["transposes"] = (a["TRANSPOSE"], b["TRANSPOSE"])
    ref_out, late_out = run(reference), run(late)
    row["max_rel"] = max(
        float(np.max(np.abs(x.astype(np.float64) - y) / np.maximum(1, np.abs(x))))
        if x.size else 0.0 for x, y in zip(ref_out, late_out))
    row["sizes"] = (len(reference), len(late))
    if with_latency:
        pairs = [(latency(reference), latency(late)) for _ in range(3)]
        row["latency_ms"] = (min(p[0] for p in pairs) * 1e3, min(p[1] for p in pairs) * 1e3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("-ois", "--overwrite_input_shape", nargs="+", metavar="NAME:D1,D2,...",
                        help="input shapes, as the CLI's -ois (every model given)")
    args = parser.parse_args(argv)
    bad = 0
    for path in args.models:
        try:
            row = compare(path, args.latency, args.overwrite_input_shape)
        except Exception as exc:  # noqa: BLE001 - one line per model
            print(f"{path}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            bad += 1
            continue
        print(row, flush=True)
        bad += bool(row.get("op_diff")) or row.get("max_rel", 0) > 1e-6
    print(f"{len(args.models) - bad}/{len(args.models)} models equal", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
