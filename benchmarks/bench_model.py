"""Convert ONNX models with the CLI and compare, side by side in one run, the float32 TFLite
latency (ai-edge-litert, 1 and 2 threads, median of N runs) with onnxruntime's on the same
input; also report conversion wall time, peak memory, max error, the TRANSPOSE count and the census of TFLite ops.

With `--peer DIR`, the float32 file another converter wrote for the same ONNX
(`DIR/<stem>/<stem>_float32.tflite`, e.g. from onnx2tf) is timed in the same loop, on the
same input laid out as its signature wants; runs of the three runtimes are interleaved so
that a busy machine slows them alike.

    python benchmarks/bench_model.py model.onnx [more.onnx ...] [--runs 20] [--json out.json]
        [--peer DIR] [--flags=-dms]

`--flags` adds CLI flags to our conversion (`-dms`: the TFLite-only route, whose INT8 file
of a QDQ model the own quantizer makes; without it TF's converter makes that file beside
the saved_model).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

from onnx2tf_alt.batching.latency import interleaved_medians, random_feeds

# The same timing as `onnx2tf-alt batch --check`.
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.tflite.run import signature_call


def peer_feeds(runner, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ONNX feeds laid out for another converter's signature: matched by name (else by
    order), transposed to its shape (channel-last orders tried first)."""
    wanted = runner.get_input_details()
    by_order = list(feeds.values())
    # onnx2tf writes `past_key_values.0.key` as `past_key_values_0_key`
    by_plain_name = {re.sub(r"[^0-9A-Za-z]", "_", name): a for name, a in feeds.items()}
    out = {}
    for k, (key, detail) in enumerate(wanted.items()):
        array = feeds.get(key, by_plain_name.get(re.sub(r"[^0-9A-Za-z]", "_", key)))
        if array is None:
            array = by_order[k] if k < len(by_order) else None
        shape = tuple(int(d) for d in detail["shape"])
        rank = array.ndim
        last = (0, *range(2, rank), 1) if rank > 2 else tuple(range(rank))
        for perm in [tuple(range(rank)), last, *itertools.permutations(range(rank))]:
            if tuple(array.shape[p] for p in perm) == shape:
                out[key] = np.ascontiguousarray(np.transpose(array, perm))
                break
        else:
            raise ValueError(f"peer input {key} {shape} matches no layout of {array.shape}")
    return out


# The CLI run under a small child that reports the CLI's peak RSS. The ru_maxrss of a
# child as its parent sees it (wait4) starts from the parent's own peak, which Linux carries
# across fork and exec: a benchmark process holding onnxruntime sessions reported 2 GB for
# every conversion. This child's peak is a bare interpreter's, so RUSAGE_CHILDREN after the
# CLI (and whatever it runs) ended is the CLI's own.
_MEASURED = """
import resource, subprocess, sys
code = subprocess.call([sys.executable, "-m", "onnx2tf_alt", *sys.argv[1:]])
sys.stderr.write(f"\\nPEAK_KIB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.exit(code)
"""


def convert(path: str, out: str, *flags: str) -> tuple[float, float]:
    """Run the CLI in a child process; return (wall seconds, peak RSS MiB of that child)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, "-i", path, "-o", out, "-n", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    peak = [line for line in proc.stderr.splitlines() if line.startswith("PEAK_KIB ")]
    return wall, int(peak[-1].split()[1]) / 1024 if peak else float("nan")


def output_steps(model: onnx.ModelProto, layout: dict, outputs: dict, expected: list
                 ) -> list[float]:
    """Per output made by a DequantizeLinear of constant scale: the largest difference from
    onnxruntime in steps of that scale (0: the same integers), else nothing."""
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    by_output = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    steps = []
    for entry, ref in zip(layout["outputs"], expected):
        node = by_output.get(entry["onnx_name"])
        scale = scales.get(node.input[1]) if node is not None else None
        if scale is None or scale.size != 1:
            continue
        got = P.to_onnx_order(outputs[entry["tf_name"]], entry["perm"])
        steps.append(round(float(np.abs(got - ref).max() / float(scale)), 2))
    return steps


def bench(path: str, runs: int, peer_dir: str | None = None, flags: tuple = ()) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    model = onnx.load(path)
    feeds = random_feeds(model)
    stem = os.path.splitext(os.path.basename(path))[0]
    qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        # a QDQ model's deployable file is its INT8 one: timed beside the float32 one
        wall, peak_mib = convert(path, out, *flags, *(["-oiqt"] if qdq else []))
        int8_path = os.path.join(out, f"{stem}_integer_quant.tflite") if qdq else None
        with open(os.path.join(out, f"{stem}_io_layout.json")) as f:
            layout = json.load(f)
        tflite_path = os.path.join(out, f"{stem}_float32.tflite")
        row = {"model": stem, "convert_s": round(wall, 2), "convert_peak_mib": round(peak_mib)}
        # contiguous, as the peer's feeds are: a transposed view costs a strided copy into
        # the input tensor on every run (0.2 ms of MobileNetV2's 5.7)
        phys = {e["tf_name"]: np.ascontiguousarray(
            P.to_physical_order(feeds[e["onnx_name"]], e["perm"])) for e in layout["inputs"]}
        peer_path = os.path.join(peer_dir, stem, f"{stem}_float32.tflite") if peer_dir else None
        for threads in (1, 2):
            interpreter = Interpreter(model_path=tflite_path, num_threads=threads)
            run_tflite = signature_call(interpreter, phys)
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # An idle onnxruntime worker spins for a while after each run; interleaved with
            # TFLite on a 2-core machine it would steal the core TFLite's second thread needs.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            fns = {"tflite": run_tflite,
                   "ort": lambda s=session: s.run(None, feeds)}
            if int8_path:
                run_int8 = signature_call(Interpreter(model_path=int8_path,
                                                      num_threads=threads), phys)
                fns["int8"] = run_int8
            if peer_path and os.path.exists(peer_path) and "peer_error" not in row:
                try:  # a peer's file that does not run is reported, not fatal
                    peer = Interpreter(model_path=peer_path, num_threads=threads)
                    peer_runner = peer.get_signature_runner()
                    peer_in = peer_feeds(peer_runner, feeds)
                    peer_runner(**peer_in)
                    fns["peer"] = lambda r=peer_runner, f=peer_in: r(**f)
                except Exception as exc:  # noqa: BLE001 - reported in the row
                    row["peer_error"] = str(exc).strip().splitlines()[0][:200]
            ms = interleaved_medians(fns, runs)
            row[f"tflite_ms_{threads}t"] = round(ms["tflite"], 3)
            row[f"ort_ms_{threads}t"] = round(ms["ort"], 3)
            row[f"ratio_{threads}t"] = round(ms["tflite"] / ms["ort"], 2)
            if "int8" in ms:
                row[f"int8_ratio_{threads}t"] = round(ms["int8"] / ms["ort"], 2)
            if "peer" in ms:
                row[f"peer_ratio_{threads}t"] = round(ms["peer"] / ms["ort"], 2)
                row[f"ours_vs_peer_{threads}t"] = round(ms["tflite"] / ms["peer"], 2)
        if peer_path and os.path.exists(peer_path) and "peer_error" not in row:
            peer_ops = Interpreter(model_path=peer_path)._get_ops_details()
            row["peer_transposes"] = sum(op["op_name"] == "TRANSPOSE" for op in peer_ops)
        outputs = run_tflite()
        expected = session.run(None, feeds)
        errors, mismatched = [0.0], []
        for entry, ref in zip(layout["outputs"], expected):
            got = P.to_onnx_order(outputs[entry["tf_name"]], entry["perm"])
            if got.shape != ref.shape:  # e.g. detections near a score tie (random weights)
                mismatched.append(f"{entry['onnx_name']}: {list(got.shape)} vs {list(ref.shape)}")
            elif ref.size:
                scale = max(1.0, float(np.abs(ref).max()))
                errors.append(float(np.abs(got - ref).max()) / scale)
        row["max_rel_err"] = float(f"{max(errors):.3g}")
        if int8_path:
            row["int8_output_lsb"] = output_steps(model, layout, run_int8(), expected)
        if mismatched:
            row["output_shapes_differ"] = mismatched
        ops = {}
        for op in Interpreter(model_path=tflite_path)._get_ops_details():
            ops[op["op_name"]] = ops.get(op["op_name"], 0) + 1
        row["tflite_transposes"] = ops.get("TRANSPOSE", 0)
        row["tflite_ops"] = dict(sorted(ops.items()))
        row["onnx_transposes"] = sum(n.op_type == "Transpose" for n in model.graph.node)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--peer", help="folder of another converter's outputs, one per stem")
    parser.add_argument("--flags", default="", help="more CLI flags for our conversion")
    args = parser.parse_args()
    flags = tuple(args.flags.split())
    run_rows([(path, lambda p=path: bench(p, args.runs, args.peer, flags))
              for path in args.models], args.json)


def run_rows(jobs, json_path: str | None) -> list[dict]:
    """Run each (model path, job) in turn, printing its row as JSON; a failing job becomes
    an error row (one failing model must not hide the others). Optionally saves all rows."""
    rows = []
    for path, job in jobs:
        try:
            rows.append(job())
        except Exception as exc:  # noqa: BLE001 - reported in the row
            rows.append({"model": os.path.basename(path), "error": str(exc).strip()[-300:]})
        print(json.dumps(rows[-1]), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
