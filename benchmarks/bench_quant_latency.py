"""Latency of the quantized files of two conversions of one model, side by side in one run:
each file of folder A timed interleaved with the file of the same name in folder B, at 1
and 2 threads, with the ops XNNPACK takes in each.

    python benchmarks/bench_quant_latency.py A_DIR B_DIR [--runs 30] [--threads 1 2]
        [--files PATTERN] [--json out.json]

E.g. A = the own quantizer's files and B = those of TF's MLIR quantizer on the same model
(`bench_int8_heldout.py --variants direct tf_quantizer --out DIR` writes both folders).
Every file gets the same random input (uniform over its input type's range for integer
inputs); latency is the median of `--runs` interleaved runs (onnx2tf_alt.batching.latency),
ratio A / B.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from onnx2tf_alt.batching.latency import interleaved_medians
from onnx2tf_alt.export.delegates import xnnpack_partitions

QUANTIZED = "*_quant*.tflite"


def feeds_for(runner, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, detail in runner.get_input_details().items():
        dtype, shape = detail["dtype"], detail["shape"]
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            feeds[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return feeds


def runner_for(path: str, threads: int):
    interpreter = Interpreter(model_path=path, num_threads=threads)
    runner = interpreter.get_signature_runner()
    feeds = feeds_for(runner)
    return lambda: runner(**feeds)


def delegated(path: str) -> str:
    partition, count = xnnpack_partitions(None, path)
    return f"{sum(p is not None for p in partition)}/{len(partition)} ops, {count} partitions"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--files", default=QUANTIZED, help="file name pattern")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for name in sorted(os.listdir(args.a)):
        other = os.path.join(args.b, name)
        if not fnmatch.fnmatch(name, args.files) or not os.path.exists(other):
            continue
        mine = os.path.join(args.a, name)
        row = {"file": name, "xnnpack_a": delegated(mine), "xnnpack_b": delegated(other)}
        for threads in args.threads:
            ms = interleaved_medians({"a": runner_for(mine, threads),
                                      "b": runner_for(other, threads)}, args.runs)
            row[f"{threads}t"] = {"a_ms": round(ms["a"], 3), "b_ms": round(ms["b"], 3),
                                  "ratio": round(ms["a"] / ms["b"], 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    heads = " | ".join(f"{t} thread(s): A / B ms (ratio)" for t in args.threads)
    print(f"\n| file | {heads} | XNNPACK A | XNNPACK B |")
    print("|---|" + "---|" * len(args.threads) + "---|---|")
    for row in rows:
        cells = [f"{row[f'{t}t']['a_ms']} / {row[f'{t}t']['b_ms']} ({row[f'{t}t']['ratio']})"
                 for t in args.threads]
        print(f"| {row['file']} | {' | '.join(cells)} | {row['xnnpack_a']} | "
              f"{row['xnnpack_b']} |")
    ratios = [row[f"{t}t"]["ratio"] for row in rows for t in args.threads]
    if ratios:
        print(f"geomean A / B over {len(ratios)} timings: "
              f"{float(np.exp(np.mean(np.log(ratios)))):.3f}, highest {max(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
