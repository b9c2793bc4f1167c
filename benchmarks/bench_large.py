"""Large models (issue 29): Llama-style decoders of about 2.3 GB and 4.4 GB with random
weights, converted side by side in one run: each phase's wall time and memory (the
converter's own `-v debug` phase lines), the whole process's wall time and peak RSS against
the bound 2 GB + 1.5 x the weights, the files' sizes, each .tflite's max error against
onnxruntime on a 16-token input, and onnx2tf's result on the same file where it finishes.

    python benchmarks/bench_large.py --models DIR --export-python VENV/bin/python
        [--sizes 2.3 4.4] [--flags=-odrqt] [--peer-python PEER/bin/python] [--timeout S]

The models are exported once into DIR (benchmarks/export_llama.py, run by --export-python,
a Python with torch and transformers); --peer-python runs `python -m onnx2tf` (onnx2tf 2.6.9
in its own venv).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_phases import convert_with_phases

SIZES = {  # GB of float32 weights -> hidden, layers, heads, kv heads, intermediate
    "2.3": (2048, 10, 16, 4, 5632),
    "4.4": (2048, 22, 32, 4, 5632),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def weight_bytes(model: str) -> int:
    folder = os.path.dirname(os.path.abspath(model))
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f != os.path.basename(model))


def tflite_errors(model: str, out: str, seq: int = 16) -> dict[str, str]:
    """Max |error| / max |reference| of every .tflite in `out` and of the saved_model (where
    one was written) against onnxruntime."""
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    ids = np.random.default_rng(0).integers(0, 32000, (1, seq)).astype(np.int64)
    reference = ort.InferenceSession(model).run(None, {"input_ids": ids})[0]
    scale = max(1.0, float(np.abs(reference).max()))
    found = {}
    outputs = {}
    for name in sorted(f for f in os.listdir(out) if f.endswith(".tflite")):
        runner = Interpreter(model_path=os.path.join(out, name)).get_signature_runner()
        (key, detail), = runner.get_input_details().items()
        outputs[name] = next(iter(runner(**{key: ids.astype(detail["dtype"])}).values()))
        del runner
    if os.path.exists(os.path.join(out, "saved_model.pb")):  # with -osm
        outputs["saved_model"] = saved_model_output(out, ids)
    for name, got in outputs.items():
        err = float(np.abs(got - reference).max())
        cos = float(np.dot(got.ravel(), reference.ravel())
                    / (np.linalg.norm(got) * np.linalg.norm(reference)))
        found[name] = f"max|err| {err:.3g} ({err / scale:.2g} of max(1,|ref|)), cosine {cos:.6f}"
    return found


def saved_model_output(out: str, ids: np.ndarray) -> np.ndarray:
    """The saved_model's logits, run in a child process (TF's memory is freed with it)."""
    code = ("import sys, numpy as np, tensorflow as tf; m = tf.saved_model.load(sys.argv[1]); "
            "f = m.signatures['serving_default']; (k, s), = f.structured_input_signature[1]"
            ".items(); ids = np.load(sys.argv[2]); "
            "np.save(sys.argv[3], next(iter(f(**{k: tf.constant(ids, s.dtype)}).values()))"
            ".numpy())")
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "ids.npy"), ids)
        subprocess.run([sys.executable, "-c", code, out, os.path.join(tmp, "ids.npy"),
                        os.path.join(tmp, "out.npy")], check=True, capture_output=True)
        return np.load(os.path.join(tmp, "out.npy"))


def peer(python: str, model: str, timeout: float) -> str:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen([python, "-m", "onnx2tf", "-i", model, "-o", out],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        _, status, usage = os.wait4(proc.pid, 0)
        return (f"exit {os.waitstatus_to_exitcode(status)} after "
                f"{time.perf_counter() - start:.0f} s, peak {usage.ru_maxrss / 2**20:.1f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--export-python")
    parser.add_argument("--sizes", nargs="+", default=sorted(SIZES), choices=sorted(SIZES))
    parser.add_argument("--flags", nargs="*", default=[], help="more CLI flags (e.g. -odrqt)")
    parser.add_argument("--peer-python")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    for size in args.sizes:
        model = os.path.join(args.models, f"llama_{size}gb", "model.onnx")
        if not os.path.exists(model):
            subprocess.run([args.export_python, os.path.join(HERE, "export_llama.py"), model,
                            *map(str, SIZES[size])], check=True)
        weights = weight_bytes(model)
        bound = 2 * 2**30 + 1.5 * weights
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            result = convert_with_phases(model, out, *args.flags)
            print(f"== {model}: {weights / 2**30:.2f} GiB of weights, bound "
                  f"{bound / 2**30:.2f} GiB; flags {' '.join(args.flags) or '(default)'}")
            print("\n".join(result.lines()))
            print(f"  peak / bound: {result.peak_mb * 2**20 / bound:.2f}")
            if result.code == 0:
                for name in sorted(os.listdir(out)):
                    path = os.path.join(out, name)
                    if os.path.isfile(path):
                        print(f"  {name:<36} {os.path.getsize(path) / 2**20:10.1f} MiB")
                for name, line in tflite_errors(model, out).items():
                    print(f"  {name:<36} {line}")
        if args.peer_python:
            print(f"  onnx2tf: {peer(args.peer_python, model, args.timeout)}")


if __name__ == "__main__":
    main()
