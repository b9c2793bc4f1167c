"""Run a .tflite's `serving_default` signature, empty outputs included.

The interpreter's Python signature runner refuses to read or write a tensor with no
elements ("Invalid tensor size"), so a detector that finds nothing (outputs of shape
(0, 4)) could not be checked, timed or measured. `signature_call` falls back to running
the signature by hand: empty inputs are not written, and empty outputs come back as
arrays of the shape and type the interpreter computed for them.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import SIGNATURE

# Files past this run without XNNPACK (the builtin kernels): XNNPACK packs a second copy of
# a file's weights in memory (a 2.3 GB file: 2.3 GB more), with the same values
XNNPACK_MAX_BYTES = 1 << 30
PARALLEL_TFLITE_BYTES = 256 << 20  # larger files run on one interpreter (on_cores)


def op_resolver(size: int):
    """The interpreter's op resolver for a .tflite of `size` bytes (XNNPACK_MAX_BYTES)."""
    from ai_edge_litert.interpreter import OpResolverType

    return (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if size > XNNPACK_MAX_BYTES
            else OpResolverType.AUTO)


def on_cores(count: int, size: int, work: Callable[[list[int]], list]) -> list:
    """work(chunk) over chunks of range(count), one thread per core (each makes its own
    interpreter: the interpreter lets go of Python while it runs, so TFLite's
    single-threaded builtin kernels run on every core), or one chunk for a file of more
    than PARALLEL_TFLITE_BYTES (`size`), whose interpreters would each hold its
    tensors; the results concatenated in the order of the items (work returns one per
    item of its chunk, in order)."""
    workers = max(1, min(os.cpu_count() or 1, count))
    if size > PARALLEL_TFLITE_BYTES:
        workers = 1
    chunks = [list(range(count))[w::workers] for w in range(workers)]
    if workers == 1:
        return work(chunks[0])
    with ThreadPoolExecutor(workers) as pool:
        found = {k: r for chunk, part in zip(chunks, pool.map(work, chunks))
                 for k, r in zip(chunk, part)}
    return [found[k] for k in range(count)]


def signature_call(interpreter, feeds: dict[str, np.ndarray]
                   ) -> Callable[[], dict[str, np.ndarray]]:
    """A callable that runs `interpreter`'s signature on `feeds` (by signature key) and
    returns its outputs by key. It runs once here, to choose the way."""
    runner = interpreter.get_signature_runner(SIGNATURE)
    try:
        runner(**feeds)
        return lambda: runner(**feeds)
    except ValueError as exc:
        if "Invalid tensor size" not in str(exc):
            raise
    return lambda: _by_hand(interpreter, feeds)


def run_signature(interpreter, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The signature's outputs on `feeds`, once."""
    try:
        return interpreter.get_signature_runner(SIGNATURE)(**feeds)
    except ValueError as exc:
        if "Invalid tensor size" not in str(exc):
            raise
    return _by_hand(interpreter, feeds)


def _by_hand(interpreter, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    signature = interpreter._get_full_signature_list()[SIGNATURE]
    for name, index in signature["inputs"].items():
        interpreter.resize_tensor_input(index, feeds[name].shape, strict=False)
    interpreter.allocate_tensors()
    for name, index in signature["inputs"].items():
        if feeds[name].size:
            interpreter.set_tensor(index, feeds[name])
    interpreter.invoke()
    outputs = {}
    for name, index in signature["outputs"].items():
        detail = interpreter._get_tensor_details(index, 0)
        shape = tuple(int(d) for d in detail["shape"])
        outputs[name] = (np.zeros(shape, detail["dtype"]) if 0 in shape
                         else interpreter.get_tensor(index))
    return outputs


def signature_inputs(model) -> dict[str, int]:
    """{input name: tensor index} of an unpacked model's SIGNATURE (what a feed is keyed by,
    and the tensor a piece of the file reads it as)."""
    def text(name) -> str:
        return name.decode() if isinstance(name, bytes) else name

    return {text(e.name): int(e.tensorIndex) for s in model.signatureDefs or []
            if text(s.signatureKey) == SIGNATURE for e in s.inputs}


def set_inputs(interpreter, details: list[dict], values: list[np.ndarray]) -> None:
    """Set the inputs `details` (the interpreter's input details) of `interpreter` to
    `values`, the inputs resized first where a run-time dim differs (a file of run-time
    height and width, calibrated at one size, run in pieces: tflite/run.segment)."""
    values = [np.asarray(v, d["dtype"]) for v, d in zip(values, details)]
    resized = False
    for value, d in zip(values, details):
        if tuple(d["shape"]) != value.shape:
            interpreter.resize_tensor_input(d["index"], value.shape, strict=False)
            resized = True
    if resized:
        interpreter.allocate_tensors()
    for value, d in zip(values, details):
        interpreter.set_tensor(d["index"], value)


def as_input(value: np.ndarray, details: dict) -> np.ndarray:
    """`value` as the input `details` (the interpreter's) take it: a float value on the
    grid of an integer input (full-integer files), else cast to the input's type."""
    dtype = np.dtype(details["dtype"])
    scale, zero_point = details["quantization"]
    if value.dtype.kind == "f" and dtype.kind in "iu" and scale:
        info = np.iinfo(dtype)
        return np.clip(np.round(value / scale) + zero_point, info.min, info.max).astype(dtype)
    return value.astype(dtype)


def dequantized(value: np.ndarray, details: dict) -> np.ndarray:
    """An output of a signature runner (`details`: its output details) as float: integer
    values scaled by their quantization, float ones as they are."""
    scale, zero_point = details["quantization"]
    if value.dtype.kind in "iu" and scale:
        return (value.astype(np.float32) - zero_point) * np.float32(scale)
    return value


def exposed(model, tensors: list[int], prune: bool = False) -> bytes:
    """`model` (an unpacked schema.ModelT, left as it was) packed with `tensors` of its main
    subgraph as that subgraph's outputs: a delegate (XNNPACK) then writes them out, where
    keeping every tensor (`experimental_preserve_all_tensors`) needs TFLite's reference
    kernels, 10-20x slower on convolutions. With `prune` (a model of one subgraph), the ops
    `tensors` do not depend on are left out, with the tensors and buffers only they read:
    packing then costs what the cut holds (bias correction packs one cut per conv; keeping
    every tensor and weight made packing 8 of a DB detector's 22 s). Pruned, the indices
    change: read `tensors` as the cut's outputs (the interpreter's output details)."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model

    if prune:
        return pack_model(_pruned(model, [int(t) for t in tensors]))
    graph = model.subgraphs[0]
    outputs = graph.outputs
    graph.outputs = [*dict.fromkeys([*(int(o) for o in outputs), *(int(t) for t in tensors)])]
    try:
        return pack_model(model)
    finally:
        graph.outputs = outputs


def _pruned(model, tensors: list[int]):
    """A shallow copy of `model` whose one subgraph computes `tensors` (its outputs) from its
    inputs: the ops they depend on, the tensors and buffers those read (renumbered), its
    signatures' inputs and the outputs still computed."""
    graph = model.subgraphs[0]
    if len(model.subgraphs) != 1:
        raise ValueError("a pruned cut of a model of several subgraphs")
    operators = graph.operators
    writer = {int(o): k for k, op in enumerate(operators) for o in op.outputs}
    needed, stack = set(), [writer[t] for t in tensors if t in writer]
    while stack:
        k = stack.pop()
        if k not in needed:
            needed.add(k)
            stack += [writer[int(i)] for i in operators[k].inputs if int(i) in writer]
    pruned, index = _cut(model, sorted(needed), [int(i) for i in graph.inputs], tensors)
    computed = {int(o) for k in needed for o in operators[k].outputs}
    computed |= {int(i) for i in graph.inputs}
    for signature in model.signatureDefs or []:
        signature = copy.copy(signature)
        signature.inputs = [_renumbered(e, index) for e in signature.inputs]
        signature.outputs = [_renumbered(e, index) for e in signature.outputs
                             if int(e.tensorIndex) in computed]
        pruned.signatureDefs.append(signature)
    return pruned


def segment(model, ops: list[int], outputs: list[int]) -> tuple[bytes, list[int]]:
    """(the ops `ops` of `model`'s one subgraph (indices, in graph order) as a file of their
    own, the tensors it takes as inputs): every tensor they read that none of them writes
    and no buffer holds, in the order first read; its outputs are `outputs`. A file run
    piece by piece through segments (each fed the tensors the ones before wrote) computes
    what the whole file computes, op for op, where a cut from the inputs would run every
    op before the piece again (bias correction: 43 cuts of a DB detector ran it ~20
    times)."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model

    if len(model.subgraphs) != 1:
        raise ValueError("a segment of a model of several subgraphs")
    graph = model.subgraphs[0]
    written = {int(o) for k in ops for o in graph.operators[k].outputs}
    inputs = [*dict.fromkeys(
        int(i) for k in ops for i in graph.operators[k].inputs
        if int(i) >= 0 and int(i) not in written and not _constant(model, graph.tensors[int(i)]))]
    cut, _ = _cut(model, ops, inputs, outputs)
    return pack_model(cut), inputs


def _constant(model, tensor) -> bool:
    buffer = model.buffers[int(tensor.buffer)] if tensor.buffer else None
    return tensor.isVariable or (buffer is not None and (
        (buffer.data is not None and len(buffer.data) > 0) or bool(buffer.size)))


def _cut(model, ops: list[int], inputs: list[int], outputs: list[int]):
    """(a shallow copy of `model` whose one subgraph is the ops `ops` of its first, with
    the tensors and buffers they read (renumbered), inputs `inputs` and outputs `outputs`,
    no signature and no metadata; {old tensor index: new})."""
    graph = model.subgraphs[0]
    kept_ops = [graph.operators[k] for k in ops]
    used = sorted({int(i) for op in kept_ops
                   for i in [*op.inputs, *op.outputs, *(op.intermediates or [])] if int(i) >= 0}
                  | set(inputs) | {int(t) for t in outputs})
    index = {old: new for new, old in enumerate(used)}
    buffers = sorted({0} | {int(graph.tensors[t].buffer) for t in used})
    buffer_index = {old: new for new, old in enumerate(buffers)}
    cut = copy.copy(graph)
    cut.tensors = []
    for t in used:
        tensor = copy.copy(graph.tensors[t])
        tensor.buffer = buffer_index[int(tensor.buffer)]
        cut.tensors.append(tensor)
    cut.operators = []
    for op in kept_ops:
        op = copy.copy(op)
        op.inputs = [index[int(i)] if int(i) >= 0 else -1 for i in op.inputs]
        op.outputs = [index[int(o)] for o in op.outputs]
        if op.intermediates is not None:
            op.intermediates = [index[int(i)] for i in op.intermediates]
        cut.operators.append(op)
    cut.inputs = [index[int(i)] for i in inputs]
    cut.outputs = [index[int(t)] for t in dict.fromkeys(outputs)]
    result = copy.copy(model)
    result.subgraphs = [cut]
    result.buffers = [model.buffers[b] for b in buffers]
    result.signatureDefs = []
    result.metadata = None  # its entries name buffers the cut does not keep
    return result, index


def _renumbered(entry, index: dict[int, int]):
    entry = copy.copy(entry)
    entry.tensorIndex = index[int(entry.tensorIndex)]
    return entry


# --- the heap between runs ---------------------------------------------------------------------
@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def give_back_heap() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim; elsewhere nothing).

    glibc's malloc serves a freed block of up to 32 MB again from its heap instead of
    returning it (its mmap threshold rises to the largest block freed): a float file's
    unpacked weights, an interpreter's packed ones and its tensors stay resident after the
    step that used them, and the next step's peak lands on top. On ViT-B/16's `-oiqt` (346
    MB of weights) the INT16-activation calibration started at 1.36 GB resident without a
    trim and 0.85 GB with one."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
