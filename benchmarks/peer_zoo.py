"""Our float32 files against onnx2tf 2.6.9's and onnxruntime, interleaved, on a zoo of ONNX
models: one line per model, then the summary the peer comparison is judged on.

    python benchmarks/peer_zoo.py MODELS_DIR|model.onnx ... --peer-python PEER/bin/python \
        [--peer-out DIR] [--runs 20] [--json rows.json]

For each model the peer converts it first (in its own process, its venv's bin/ first on PATH
as an activated venv has it, so it finds the `onnxsim` it installs; its outputs are kept in
--peer-out and reused by a later run), then benchmarks/bench_model.py converts it with our
CLI and times our file, the peer's and onnxruntime in one interleaved loop at 1 and 2
threads. The summary: geomean ours / peer at each thread count, the worst model, how many
are above 1.02x, geomean ours / onnxruntime at 1 thread; and for every model where ours is
above 1.02x, the op census of both files (the starting point for profile_tflite.py). A QDQ
model is also converted with -oiqt: its INT8 file (the one to deploy) is timed against
onnxruntime's integer execution of the QDQ graph, its outputs compared in steps of their
scale (`qdq_int8`), and `geomean_deployed_vs_onnxruntime_1t` counts that file for it.

Export a zoo with benchmarks/export_torchvision.py, export_transformers.py, export_rnn.py,
export_decoder.py and export_llama.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_convert import child_env, data_files, linked_model
from bench_model import bench, run_rows

LIMIT = 1.02  # ours / peer above this counts as slower


def peer_file(model: Path, python: str, out_root: Path, timeout: float) -> str | None:
    """The peer's float32 file for `model` (converted now unless a previous run left it);
    None with the reason logged when it writes none."""
    out = out_root / model.stem
    path = out / f"{model.stem}_float32.tflite"
    if path.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        link = linked_model(model, data_files(model), Path(tmp))
        command = [python, "-m", "onnx2tf", "-i", str(link), "-o", str(out)]
        try:
            proc = subprocess.run(command, env=child_env(python), capture_output=True, check=False,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"peer timed out after {timeout:.0f} s"
    if not path.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return f"peer wrote no float32 file (exit {proc.returncode}): {' | '.join(tail)[-300:]}"
    return None


def census(path: str) -> dict[str, int]:
    from ai_edge_litert.interpreter import Interpreter

    ops = Interpreter(model_path=path)._get_ops_details()
    return dict(sorted(Counter(op["op_name"] for op in ops).items()))


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: list[dict], peer_out: Path) -> dict:
    result = {"models": len(rows), "compared": 0}
    for threads in (1, 2):
        ratios = {r["model"]: r[f"ours_vs_peer_{threads}t"] for r in rows
                  if f"ours_vs_peer_{threads}t" in r}
        if not ratios:
            continue
        worst = max(ratios, key=ratios.get)
        result["compared"] = max(result["compared"], len(ratios))
        result[f"{threads}t"] = {
            "geomean_ours_vs_peer": round(geomean(list(ratios.values())), 3),
            "worst": [worst, ratios[worst]],
            "above_1.02": sorted(m for m, v in ratios.items() if v > LIMIT),
        }
    vs_ort = [r["ratio_1t"] for r in rows if "ratio_1t" in r]
    if vs_ort:
        result["geomean_ours_vs_onnxruntime_1t"] = round(geomean(vs_ort), 3)
    # as deployed: a QDQ model's INT8 file against onnxruntime's integer execution of it
    deployed = [r.get("int8_ratio_1t", r["ratio_1t"]) for r in rows if "ratio_1t" in r]
    if any("int8_ratio_1t" in r for r in rows):
        result["geomean_deployed_vs_onnxruntime_1t"] = round(geomean(deployed), 3)
        result["qdq_int8"] = {r["model"]: {k: r.get(k) for k in (
            "int8_ratio_1t", "int8_ratio_2t", "int8_output_lsb")} for r in rows
            if "int8_ratio_1t" in r}
    slower = {m for t in (1, 2) for m in result.get(f"{t}t", {}).get("above_1.02", [])}
    result["census_where_slower"] = {
        r["model"]: {"ours": r.get("tflite_ops"), "peer": census(
            str(peer_out / r["model"] / f"{r['model']}_float32.tflite"))}
        for r in rows if r["model"] in slower}
    result["not_compared"] = {r["model"]: r.get("error") or r.get("peer_error")
                              or r.get("peer_skipped") for r in rows
                              if "ours_vs_peer_1t" not in r}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX files or folders of them")
    parser.add_argument("--peer-python", required=True, help="onnx2tf's venv's python")
    parser.add_argument("--peer-out", default=None, help="where the peer's files are kept")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json")
    args = parser.parse_args()
    paths = sorted(p for m in args.models for p in (
        Path(m).glob("*.onnx") if Path(m).is_dir() else [Path(m)]))
    peer_out = Path(args.peer_out or tempfile.mkdtemp(prefix="peer_zoo_"))

    def job(path: Path):
        def run() -> dict:
            skipped = peer_file(path, args.peer_python, peer_out, args.timeout)
            row = bench(str(path), args.runs, str(peer_out))
            if skipped:
                row["peer_skipped"] = skipped
            return row
        return str(path), run

    rows = run_rows([job(p) for p in paths], None)
    result = {"rows": rows, "summary": summary(rows, peer_out)}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
