"""Where a .tflite spends its time, op by op, and which ops fall off the XNNPACK delegate.

    python benchmarks/profile_tflite.py MODEL.tflite|MODEL.onnx [--threads N] [--top 20]
        [--json out.json] [--run_dim N]

(--run_dim: the size of the inputs' run-time dims past the batch, default 1; an image model
of run-time height and width needs room for its strided windows, e.g. 224.)

An .onnx is converted first with the CLI into a temporary folder and its float32 file is
profiled. Each op is mapped to the ONNX nodes it computes through `<stem>_delegates.json`
(written by the converter beside the .tflite; an .onnx always has one, a .tflite only when
that file lies beside it).

What it measures (ai-edge-litert, CPU, the default XNNPACK delegate, `--threads` threads):
- the whole model: latency with XNNPACK, and with TFLite's reference kernels only;
- each op alone: a one-op model cut from the flatbuffer (same tensors, weights and options;
  its inputs are the values the full model computed on the same random input, so shapes
  and indices are real), latency with XNNPACK: the "per op" and "per op type" tables sum
  these;
- each segment: every XNNPACK partition cut out as one model, and every op left on the
  reference kernels, timed the same way.
Every latency is the fastest of at least 5 runs (more within --budget s), which other processes
on the machine disturb least. Honesty limits: a one-op model adds one interpreter
invocation (a few microseconds), runs with its weights in cache and cannot be fused with
its neighbours, so the sum of op times is not the model's latency (both are printed; the
segment times include fusion and cache effects). An op XNNPACK fuses into a neighbour costs
its full time alone and nothing in the model: e.g. a zero PAD before a convolution
(shufflenet_v2's first PAD + CONV_2D: 0.65 ms + 0.32 ms alone, 0.33 ms together). The
"XNNPACK" column comes from the whole model.
Only the main subgraph is cut (control-flow bodies run inside their op); models whose
weights lie outside the flatbuffer (> 2 GB) are not supported.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from onnx2tf_alt.export.delegates import analyze

BUDGET_S = 0.2  # default timing budget per measured model
MIN_RUNS, MAX_RUNS = 5, 200


def load(path: str) -> tuple[bytes, list[dict] | None, str]:
    """The .tflite bytes to profile, the ops of its delegate report (None when there is
    none), and a name."""
    if path.endswith(".onnx"):
        stem = os.path.splitext(os.path.basename(path))[0]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            subprocess.run([sys.executable, "-m", "onnx2tf_alt", "-i", path, "-o", out, "-n"],
                           check=True)
            return (*_read(os.path.join(out, f"{stem}_float32.tflite")),
                    f"{stem}_float32.tflite")
    return (*_read(path), os.path.basename(path))


def _read(tflite: str) -> tuple[bytes, list[dict] | None]:
    with open(tflite, "rb") as f:
        content = f.read()
    stem = os.path.basename(tflite).removesuffix(".tflite").removesuffix("_float32")
    report = os.path.join(os.path.dirname(tflite), f"{stem}_delegates.json")
    if not os.path.isfile(report):
        return content, None
    with open(report) as f:
        return content, json.load(f)["ops"]


def random_inputs(interpreter: Interpreter, seed: int = 0, run_dim: int = 1) -> list[np.ndarray]:
    """Seeded random inputs; run-time dims past the batch of size `run_dim`."""
    rng = np.random.default_rng(seed)
    feeds = []
    for detail in interpreter.get_input_details():
        shape = [max(int(d), 1) if int(s) >= 0 else 1 if axis == 0 else run_dim
                 for axis, (d, s) in enumerate(zip(detail["shape"], detail["shape_signature"]))]
        dtype = np.dtype(detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feeds.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == np.bool_:
            feeds.append(rng.integers(0, 2, shape).astype(bool))
        else:
            feeds.append(rng.integers(0, 4, shape).astype(dtype))
    return feeds


def all_values(content: bytes, feeds: list[np.ndarray]) -> dict[int, np.ndarray]:
    """Every tensor of the main subgraph after one reference-kernel run on `feeds`."""
    interpreter = Interpreter(
        model_content=content,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        experimental_preserve_all_tensors=True,
    )
    _feed(interpreter, feeds)
    interpreter.invoke()
    values = {}
    for detail in interpreter.get_tensor_details():
        try:
            values[detail["index"]] = interpreter.get_tensor(detail["index"])
        except ValueError:  # tensors without data (optional or never allocated)
            pass
    return values


def _feed(interpreter: Interpreter, feeds: list[np.ndarray]) -> None:
    for detail, value in zip(interpreter.get_input_details(), feeds):
        interpreter.resize_tensor_input(detail["index"], value.shape, strict=False)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), feeds):
        interpreter.set_tensor(detail["index"], value)


def best_ms(content: bytes, feeds: list[np.ndarray], threads: int, budget: float,
            delegate: bool = True) -> float:
    """The fastest of at least MIN_RUNS invocations (more within `budget` s), in ms."""
    resolver = (OpResolverType.AUTO if delegate
                else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter = Interpreter(model_content=content, num_threads=threads,
                              experimental_op_resolver_type=resolver)
    _feed(interpreter, feeds)
    interpreter.invoke()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < MIN_RUNS or (
            time.perf_counter() - start < budget and len(times) < MAX_RUNS):
        t = time.perf_counter()
        interpreter.invoke()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def _is_const(model, tensor) -> bool:
    buffer = model.buffers[tensor.buffer]
    return (buffer.data is not None and len(buffer.data) > 0) or buffer.size > 0


def cut(model, ops: list[int], values: dict[int, np.ndarray]) -> tuple[bytes, list[int]]:
    """A model of the main subgraph's `ops` alone; returns it and its input tensors (the
    original indices, in input order)."""
    main = model.subgraphs[0]
    chosen = set(ops)
    produced = [int(t) for i in ops for t in main.operators[i].outputs]
    used_outside = {int(t) for i, op in enumerate(main.operators) if i not in chosen
                    for t in op.inputs} | {int(t) for t in main.outputs}
    tensors: list[int] = []
    for i in ops:
        op = main.operators[i]
        for t in [*op.inputs, *op.outputs, *(op.intermediates if op.intermediates is not None
                                             else [])]:
            if t >= 0 and int(t) not in tensors:
                tensors.append(int(t))
    inputs = [t for t in tensors if t not in produced and not _is_const(model, main.tensors[t])]
    outputs = [t for t in produced if t in used_outside] or produced[-1:]
    remap = {t: k for k, t in enumerate(tensors)}
    keep_buffers = len(model.subgraphs) > 1  # other subgraphs index the buffers too
    buffers = model.buffers if keep_buffers else [schema.BufferT()]
    sub = schema.SubGraphT()
    sub.tensors = []
    for t in tensors:
        tensor = copy.copy(main.tensors[t])
        if t in values and not _is_const(model, tensor):
            tensor.shape = np.array(values[t].shape, dtype=np.int32)
            tensor.shapeSignature = None
        if not keep_buffers:
            if _is_const(model, tensor):
                buffers.append(model.buffers[tensor.buffer])
                tensor.buffer = len(buffers) - 1
            else:
                tensor.buffer = 0
        sub.tensors.append(tensor)
    sub.operators = []
    for i in ops:
        op = copy.copy(main.operators[i])
        op.inputs = np.array([remap[int(t)] if t >= 0 else -1 for t in op.inputs], np.int32)
        op.outputs = np.array([remap[int(t)] for t in op.outputs], np.int32)
        if op.intermediates is not None:
            op.intermediates = np.array([remap[int(t)] for t in op.intermediates], np.int32)
        sub.operators.append(op)
    sub.inputs = np.array([remap[t] for t in inputs], np.int32)
    sub.outputs = np.array([remap[t] for t in outputs], np.int32)
    sub.name = "cut"
    piece = copy.copy(model)
    piece.subgraphs = [sub, *model.subgraphs[1:]]
    piece.buffers = buffers
    piece.metadata, piece.metadataBuffer, piece.signatureDefs = None, None, None
    builder = flatbuffers.Builder(1024)
    builder.Finish(piece.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), inputs


def time_ops(model, ops: list[int], values, threads: int, budget: float) -> float | None:
    content, inputs = cut(model, ops, values)
    if any(t not in values for t in inputs):
        return None
    return best_ms(content, [values[t] for t in inputs], threads, budget)


def segments(report) -> list[tuple[str, list[int]]]:
    """XNNPACK partitions (ops in order) and, one by one, the ops on reference kernels."""
    parts = defaultdict(list)
    for op in report.ops:
        parts[("partition", op.partition) if op.delegated else ("reference", op.index)].append(
            op.index)
    return [(f"XNNPACK partition {k[1]}" if k[0] == "partition"
             else f"reference {report.ops[k[1]].op} #{k[1]}", v)
            for k, v in sorted(parts.items(), key=lambda kv: kv[1][0])]


def nodes_text(nodes: list[dict] | None, limit: int = 2) -> str:
    if not nodes:
        return "-"
    text = ", ".join(f"{n['name']} ({n['op_type']})" for n in nodes[:limit])
    return text + (f" +{len(nodes) - limit}" if len(nodes) > limit else "")


def profile(path: str, threads: int, top: int, budget: float = BUDGET_S,
            run_dim: int = 1) -> dict:
    """Convert (an .onnx), analyze and time the model; the result print_profile shows."""
    content, described, name = load(path)
    report = analyze(content)
    if described and [d["op"] for d in described] == [op.op for op in report.ops]:
        for op, entry in zip(report.ops, described):
            op.onnx_nodes = entry["onnx_nodes"]
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    probe = Interpreter(model_content=content)
    feeds = random_inputs(probe, run_dim=run_dim)
    values = all_values(content, feeds)
    whole = best_ms(content, feeds, threads, budget)
    reference = best_ms(content, feeds, threads, budget, delegate=False)
    per_op = [time_ops(model, [op.index], values, threads, budget) for op in report.ops]
    segment_times = [(label, ops, time_ops(model, ops, values, threads, budget))
                     for label, ops in segments(report)]
    return {
        "model": name, "threads": threads, "summary": report.summary(),
        "partitions": report.partitions, "whole_ms": whole, "reference_only_ms": reference,
        "ops": [{"index": op.index, "op": op.op, "ms": per_op[op.index],
                 "delegated": op.delegated, "partition": op.partition,
                 "onnx_nodes": op.onnx_nodes} for op in report.ops],
        "segments": [{"segment": label, "ops": len(ops), "first": ops[0], "last": ops[-1],
                      "ms": ms} for label, ops, ms in segment_times],
        "top": top,
    }


def print_profile(p: dict) -> None:
    ops = p["ops"]
    timed = [o for o in ops if o["ms"] is not None]
    total = sum(o["ms"] for o in timed) or 1.0
    print(f"== {p['model']}  ({len(ops)} ops, {p['threads']} thread(s))")
    print(p["summary"])
    print(f"whole model: {p['whole_ms']:.3f} ms with XNNPACK, {p['reference_only_ms']:.3f} ms "
          f"on reference kernels only; sum of one-op times {total:.3f} ms")
    print("\nsegments:")
    for s in p["segments"]:
        ms = "n/a" if s["ms"] is None else f"{s['ms']:.3f} ms"
        print(f"  {s['segment']:<32} ops #{s['first']}..#{s['last']} ({s['ops']})  {ms}")
    by_type = defaultdict(lambda: [0, 0, 0.0])
    for o in timed:
        row = by_type[o["op"]]
        row[0] += 1
        row[1] += bool(o["delegated"])
        row[2] += o["ms"]
    print(f"\n{'op type':<26}{'count':>6}{'on XNNPACK':>11}{'ms':>10}{'%':>7}")
    for op, (count, delegated, ms) in sorted(by_type.items(), key=lambda kv: -kv[1][2]):
        print(f"{op:<26}{count:>6}{delegated:>11}{ms:>10.3f}{100 * ms / total:>7.1f}")
    print(f"\ntop {p['top']} ops by time:")
    print(f"{'#':>5}  {'op':<22}{'ms':>9}{'%':>6}  {'XNNPACK':<8} ONNX nodes")
    for o in sorted(timed, key=lambda o: -o["ms"])[:p["top"]]:
        where = f"p{o['partition']}" if o["delegated"] else "ref"
        print(f"{o['index']:>5}  {o['op']:<22}{o['ms']:>9.3f}{100 * o['ms'] / total:>6.1f}  "
              f"{where:<8} {nodes_text(o['onnx_nodes'])}")
    reference = [o for o in ops if o["delegated"] is False]
    if reference:
        print(f"\n{len(reference)} op(s) on reference kernels:")
        for o in reference:
            print(f"{o['index']:>5}  {o['op']:<22} {nodes_text(o['onnx_nodes'], 4)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .tflite, or an .onnx to convert first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--json", help="also write the profile here")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help="seconds of timing runs per measured model (default 0.2)")
    parser.add_argument("--run_dim", type=int, default=1,
                        help="size of the inputs' run-time dims past the batch (an image's)")
    args = parser.parse_args()
    result = profile(args.model, args.threads, args.top, args.budget, args.run_dim)
    print_profile(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
