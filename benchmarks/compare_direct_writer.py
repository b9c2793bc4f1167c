"""The direct TFLite writer (tflite/direct.py) against TF's converter, per model, in one run.

Each model is converted twice by the CLI with only .tflite files asked for (-dms), once
with `--tflite_writer tf` and once with `--tflite_writer direct`, alternating for --runs
rounds; every conversion is a child process under /usr/bin/time -v (wall time, peak RSS).
A model the direct writer does not cover is reported with the node it names. For the
others the two float32 files (and the two float16 files) are compared on the same random
inputs (three seeds): max |difference| relative to max(1, |TF route's value|); then op
counts by type, TRANSPOSE counts and, with --latency, each file's median latency at one
thread (XNNPACK), measured alternately, best of three rounds.

    python benchmarks/compare_direct_writer.py MODEL.onnx [...] [--runs 3] [--latency]
        [--json PATH] [--ois NAME:D1,D2 ...] [--run_dim N]

--run_dim: the files are run with their inputs' run-time dims past the batch of this size
(default 1; an image of run-time height and width needs more than a network's strides).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_convert import last_lines, parse_time_report
from compare_tflite_routes import latency, op_counts, run

WRITERS = ("tf", "direct")


def convert(model: Path, writer: str, out: Path, shapes: list[str] | None = None) -> dict:
    report = out.parent / f"{out.name}.time"
    argv = ["/usr/bin/time", "-v", "-o", str(report), sys.executable, "-m", "onnx2tf_alt",
            "-i", str(model), "-o", str(out), "-dms", "--tflite_writer", writer, "-n",
            *(["-ois", *shapes] if shapes else [])]
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    wall, peak = parse_time_report(report)
    return {"code": done.returncode, "wall_s": wall, "peak_mb": peak,
            "tail": "" if done.returncode == 0 else last_lines(done.stdout + done.stderr, 2)}


def max_rel(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max((float(np.max(np.abs(x.astype(np.float64) - y) / np.maximum(1, np.abs(x))))
                if x.size else 0.0 for x, y in zip(a, b)), default=0.0)


def compare_model(model: Path, runs: int, with_latency: bool,
                  shapes: list[str] | None = None, run_dim: int = 1) -> dict:
    row: dict = {"model": model.name}
    work = Path(tempfile.mkdtemp(prefix="compare_direct_"))
    try:
        timings = {w: [] for w in WRITERS}
        for k in range(runs):
            for writer in WRITERS:
                out = work / f"{writer}{k}"
                result = convert(model, writer, out, shapes)
                timings[writer].append(result)
                if result["code"] != 0:
                    row[f"{writer}_error"] = result["tail"]
                if k:
                    shutil.rmtree(out, ignore_errors=True)
            if "direct_error" in row or "tf_error" in row:
                break
        for writer in WRITERS:
            good = [t for t in timings[writer] if t["code"] == 0]
            row[f"{writer}_wall_s"] = statistics.median(t["wall_s"] for t in good) if good else None
            row[f"{writer}_peak_mb"] = max(t["peak_mb"] for t in good) if good else None
        if "direct_error" in row or "tf_error" in row:
            return row
        stem = model.stem
        files = {w: {p: (work / f"{w}0" / f"{stem}_{p}.tflite").read_bytes()
                     for p in ("float32", "float16")} for w in WRITERS}
        for precision in ("float32", "float16"):
            tf_file, direct_file = files["tf"][precision], files["direct"][precision]
            row[f"{precision}_max_rel"] = max(max_rel(run(tf_file, s, run_dim),
                                                      run(direct_file, s, run_dim))
                                              for s in range(3))
        counts = {w: op_counts(files[w]["float32"]) for w in WRITERS}
        row["ops"] = {w: sum(counts[w].values()) for w in WRITERS}
        row["transposes"] = {w: counts[w]["TRANSPOSE"] for w in WRITERS}
        row["op_diff"] = {name: (counts["tf"][name], counts["direct"][name])
                          for name in sorted(set(counts["tf"]) | set(counts["direct"]))
                          if counts["tf"][name] != counts["direct"][name]}
        row["sizes_mb"] = {w: len(files[w]["float32"]) / 1e6 for w in WRITERS}
        if with_latency:
            rounds = [[latency(files[w]["float32"], run_dim=run_dim) for w in WRITERS]
                      for _ in range(3)]
            best = [min(r[i] for r in rounds) * 1e3 for i in range(2)]
            row["latency_ms"] = dict(zip(WRITERS, best))
            row["latency_ratio"] = best[1] / best[0]
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def line(row: dict) -> str:
    name = row["model"]
    if "direct_error" in row or "tf_error" in row:
        return f"{name}: not compared: {row.get('direct_error') or row.get('tf_error')}"
    text = (f"{name}: wall tf {row['tf_wall_s']:.2f} s / direct {row['direct_wall_s']:.2f} s, "
            f"peak {row['tf_peak_mb']:.0f} / {row['direct_peak_mb']:.0f} MB; float32 max rel "
            f"{row['float32_max_rel']:.2e}, float16 {row['float16_max_rel']:.2e}; ops "
            f"{row['ops']['tf']} / {row['ops']['direct']}, transposes "
            f"{row['transposes']['tf']} / {row['transposes']['direct']}")
    if row["op_diff"]:
        text += f"; op diff {row['op_diff']}"
    if "latency_ms" in row:
        text += (f"; latency {row['latency_ms']['tf']:.2f} / {row['latency_ms']['direct']:.2f} "
                 f"ms ({row['latency_ratio']:.3f})")
    return text


def summary(rows: list[dict], with_latency: bool) -> str:
    """The line the direct writer is judged on: how many models it writes, how far its
    outputs are from the TF route's, its ops and TRANSPOSEs against TF's, and latency."""
    covered = [r for r in rows if "direct_error" not in r and "tf_error" not in r]
    not_direct = [r["model"] for r in rows if "direct_error" in r]
    text = (f"summary: {len(rows) - len(not_direct)} of {len(rows)} models written directly"
            + (f" (not: {', '.join(not_direct)})" if not_direct else ""))
    if not covered:
        return text
    ratios = [r["direct_wall_s"] / r["tf_wall_s"] for r in covered]
    worst = max(covered, key=lambda r: r["float32_max_rel"])
    more_t = [r["model"] for r in covered if r["transposes"]["direct"] > r["transposes"]["tf"]]
    more_ops = [r["model"] for r in covered if r["ops"]["direct"] > r["ops"]["tf"]]
    text += (f"; {len(covered)} compared with the TF route: median wall direct/tf "
             f"{statistics.median(ratios):.2f}; worst float32 max rel "
             f"{worst['float32_max_rel']:.2e} ({worst['model']}), "
             f"{sum(r['float32_max_rel'] > 1e-6 for r in covered)} above 1e-6; "
             f"more TRANSPOSE than TF's: {len(more_t)} {more_t or ''}; "
             f"more ops: {len(more_ops)} {more_ops or ''}")
    if with_latency:
        lat = [r["latency_ratio"] for r in covered]
        slow = max(covered, key=lambda r: r["latency_ratio"])
        text += (f"; latency direct/tf median {statistics.median(lat):.3f}, worst "
                 f"{slow['latency_ratio']:.3f} ({slow['model']}), "
                 f"{sum(x > 1.05 for x in lat)} above 1.05")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--ois", nargs="+", metavar="NAME:SHAPE",
                        help="input shapes for every model (a decoder's symbolic dims)")
    parser.add_argument("--run_dim", type=int, default=1,
                        help="size of the files' run-time dims past the batch when run")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        rows.append(compare_model(model, args.runs, args.latency, args.ois, args.run_dim))
        print(line(rows[-1]), flush=True)
        if args.json:  # after every model: a long run's rows survive its interruption
            args.json.write_text(json.dumps(rows, indent=1))
    print(summary(rows, args.latency))


if __name__ == "__main__":
    main()
