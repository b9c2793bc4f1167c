"""Run a .tflite's `serving_default` signature, empty outputs included.

The interpreter's Python signature runner refuses to read or write a tensor with no
elements ("Invalid tensor size"), so a detector that finds nothing (outputs of shape
(0, 4)) could not be checked, timed or measured. `signature_call` falls back to running
the signature by hand: empty inputs are not written, and empty outputs come back as
arrays of the shape and type the interpreter computed for them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import SIGNATURE


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
    kernels, 10-20x slower on convolutions. With `prune`, the ops `tensors` do not depend
    on are left out. The signature keeps its outputs: read `tensors` by index."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model

    graph = model.subgraphs[0]
    operators, outputs = graph.operators, graph.outputs
    if prune:
        writer = {int(o): k for k, op in enumerate(operators) for o in op.outputs}
        needed, stack = set(), [writer[t] for t in tensors if t in writer]
        while stack:
            k = stack.pop()
            if k not in needed:
                needed.add(k)
                stack += [writer[int(i)] for i in operators[k].inputs if int(i) in writer]
        graph.operators = [op for k, op in enumerate(operators) if k in needed]
        kept = {int(o) for op in graph.operators for o in op.outputs} | {
            int(i) for i in graph.inputs}
        signatures = [(s, s.outputs) for s in model.signatureDefs or []]
        for signature, entries in signatures:
            signature.outputs = [e for e in entries if int(e.tensorIndex) in kept]
    graph.outputs = [*dict.fromkeys([*(int(o) for o in outputs if not prune),
                                     *(int(t) for t in tensors)])]
    try:
        return pack_model(model)
    finally:
        graph.operators, graph.outputs = operators, outputs
        if prune:
            for signature, entries in signatures:
                signature.outputs = entries
