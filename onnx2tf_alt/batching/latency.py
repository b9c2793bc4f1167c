"""The float32 TFLite's latency against onnxruntime's, on the same random input, 1 thread.

Run as its own process after a conversion (`python -m onnx2tf_alt.batching.latency MODEL
FOLDER STEM OUT_JSON`): it loads ai-edge-litert and onnxruntime, never TensorFlow, and the
batch parent imports neither. benchmarks/bench_model.py times models the same way.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from onnx2tf_alt.tflite.run import signature_call

RUNS = 9  # timed runs of each runtime, interleaved, after one warm-up each


def random_feeds(model, seed: int = 0,
                 shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for the graph inputs of `model` (an onnx.ModelProto), shaped as
    `shapes` says where it names the input, else with unknown dimensions set to 1."""
    import onnx

    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in inits:
            continue
        t = info.type.tensor_type
        shape = (shapes or {}).get(info.name) or [
            d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[info.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[info.name] = rng.integers(0, 8, shape).astype(dtype)
    return feeds


def interleaved_medians(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median milliseconds of each callable, run in turn (one warm-up each), so that a busy
    machine slows them alike. The turn starts one callable later each round: each runs
    after each of the others equally often (what ran just before, onnxruntime with its own
    weights and threads, leaves the caches and cores to the next one)."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(runs):
        for k in range(len(names)):
            name = names[(round_ + k) % len(names)]
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def latency_ratio(onnx_path: str, folder: str, stem: str, runs: int = RUNS) -> dict:
    """{"latency_ratio": TFLite ms / onnxruntime ms, "latency_ms": {...}} for the float32
    `folder/<stem>_float32.tflite` of `onnx_path`, both on 1 thread, the TFLite fed the
    same arrays laid out as `<stem>_io_layout.json` says."""
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.ir.in_place import read_in_place

    with open(os.path.join(folder, f"{stem}_io_layout.json")) as f:
        layout = json.load(f)
    interpreter = Interpreter(model_path=os.path.join(folder, f"{stem}_float32.tflite"),
                              num_threads=1)
    runner = interpreter.get_signature_runner()
    details = runner.get_input_details()
    inputs = [(e["onnx_name"], e.get("tflite_name") or e["tf_name"], e["perm"])
              for e in layout["inputs"]]
    # The .tflite's shapes hold any -ois overwrite: its axis i is ONNX axis perm[i].
    shapes = {name: [int(details[key]["shape"][list(perm).index(a)]) for a in range(len(perm))]
              for name, key, perm in inputs}
    feeds = random_feeds(read_in_place(onnx_path)[0], shapes=shapes)  # its weights unread
    physical = {key: np.ascontiguousarray(np.transpose(feeds[name], perm))
                for name, key, perm in inputs}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    ms = interleaved_medians({"tflite": signature_call(interpreter, physical),
                              "onnxruntime": lambda: session.run(None, feeds)}, runs)
    return {"latency_ratio": round(ms["tflite"] / ms["onnxruntime"], 3),
            "latency_ms": {k: round(v, 4) for k, v in ms.items()}}


def main(argv: list[str]) -> int:
    """Measure and write the result (or {"latency_error": why}) to OUT_JSON; exit 0 either
    way once OUT_JSON is written: a model that does not run is recorded, not a crash."""
    onnx_path, folder, stem, out = argv
    try:
        result = latency_ratio(onnx_path, folder, stem)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the record's reason
        result = {"latency_error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
