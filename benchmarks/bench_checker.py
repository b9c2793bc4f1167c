"""The accuracy checker's cost and verdict: each model is converted with the CLI twice, side by
side in one run, plainly and with -cotof (every node output compared with onnxruntime through
the Keras model and the float32 TFLite); prints the wall-time ratio and the pass counts.

    python benchmarks/bench_checker.py model.onnx [more.onnx ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import convert, run_rows  # the same timed CLI run as bench_model


def bench(path: str) -> dict:
    stem = os.path.splitext(os.path.basename(path))[0]
    with tempfile.TemporaryDirectory() as tmp:
        plain_s, plain_mib = convert(path, os.path.join(tmp, "plain"))
        out = os.path.join(tmp, "checked")
        checked_s, checked_mib = convert(path, out, "-cotof")
        with open(os.path.join(out, f"{stem}_accuracy_report.json")) as f:
            report = json.load(f)
    row = {
        "model": stem, "convert_s": round(plain_s, 2), "cotof_s": round(checked_s, 2),
        "cotof_ratio": round(checked_s / plain_s, 2), "convert_peak_mib": round(plain_mib),
        "cotof_peak_mib": round(checked_mib), "passed": report["passed"],
    }
    for backend in report["backends"].values():
        counts = backend["counts"]
        first = backend["first_divergence"]
        row[backend["backend"]] = (
            f"{counts['pass']} pass / {counts['fail']} fail / {counts['unobserved']} unobserved"
            + (f"; first divergence {first['node_name']}" if first else "")
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--json")
    args = parser.parse_args()
    run_rows([(path, lambda p=path: bench(p)) for path in args.models], args.json)


if __name__ == "__main__":
    main()
