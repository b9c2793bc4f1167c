"""Consistency checks of a prepared model, so that an invalid model is reported as such
(exit 2, naming the node and the shapes that disagree) instead of as a failed TF layer.
Only shapes the model fixes itself are compared (graph inputs and constants).

ONNX's checker and shape inference do not compare, e.g., a Conv's weight channels with its
input's; onnxruntime loads such a model and fails only when it runs.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.errors import InputError, printable
from onnx2tf_alt.ir.graph import Graph, Node


class InvalidModelError(InputError):
    """The model contradicts itself: no converter can give it a meaning."""


def _known(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def _declared(graph: Graph, names: list[str]):
    """The shapes of `names` where the model itself fixes them (graph inputs, constants);
    None for any other: shapes ONNX inference derived can be wrong (e.g. its STFT output)
    without the model being so, and a false 'invalid model' would block a valid one."""
    shapes = []
    for name in names:
        if not name or not (name in graph.inputs or graph.is_const(name)):
            return None
        shapes.append(graph.shapes.get(name))
    return shapes


def _fail(node: Node, detail: str) -> None:
    raise InvalidModelError(
        f"The model is invalid: node '{printable(node.name)}' ({printable(node.op_type)}) "
        f"{detail}. onnxruntime would fail on it too when run; fix the model where it was "
        "exported."
    )


def _conv(node: Node, graph: Graph) -> None:
    x, w = _declared(graph, node.inputs[:2]) or (None, None)
    if not (_known(x) and _known(w)) or len(x) != len(w) or len(x) < 3:
        return
    group = int(node.attrs.get("group", 1))
    if node.op_type == "Conv":
        wanted = w[1] * group
        if x[1] != wanted:
            _fail(node, f"reads '{printable(node.inputs[0])}' with {x[1]} channels (shape "
                  f"{list(x)}), but its weights '{printable(node.inputs[1])}' (shape "
                  f"{list(w)}) expect {w[1]} x group {group} = {wanted}")
        if w[0] % group:
            _fail(node, f"has {w[0]} output channels (weights {list(w)}), not a multiple of "
                  f"group {group}")
    elif x[1] != w[0]:
        _fail(node, f"reads '{printable(node.inputs[0])}' with {x[1]} channels (shape "
              f"{list(x)}), but its weights '{printable(node.inputs[1])}' (shape {list(w)}) "
              f"expect {w[0]}")


def _matmul(node: Node, graph: Graph) -> None:
    a, b = _declared(graph, node.inputs[:2]) or (None, None)
    if not (_known(a) and _known(b)) or len(a) < 1 or len(b) < 1:
        return
    if node.op_type == "Gemm":
        if len(a) != 2 or len(b) != 2:
            return
        k_a = a[0] if node.attrs.get("transA", 0) else a[1]
        k_b = b[1] if node.attrs.get("transB", 0) else b[0]
    else:
        k_a, k_b = a[-1], b[0] if len(b) == 1 else b[-2]
    if k_a != k_b:
        _fail(node, f"multiplies '{printable(node.inputs[0])}' (shape {list(a)}) by "
              f"'{printable(node.inputs[1])}' (shape {list(b)}): inner dimensions {k_a} and "
              f"{k_b} differ")


def _batch_norm(node: Node, graph: Graph) -> None:
    x = (_declared(graph, node.inputs[:1]) or [None])[0]
    if not _known(x) or len(x) < 2 or node.attrs.get("spatial", 1) == 0:
        return  # spatial=0 (opset < 9): parameters of shape C x D1 x ...
    for name in node.inputs[1:5]:
        shape = graph.shapes.get(name)
        if name and _known(shape) and list(shape) != [x[1]]:
            _fail(node, f"normalizes '{printable(node.inputs[0])}' with {x[1]} channels (shape "
                  f"{list(x)}), but its parameter '{printable(name)}' has shape {list(shape)}")


def _reshape(node: Node, graph: Graph) -> None:
    x = (_declared(graph, node.inputs[:1]) or [None])[0]
    target = graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if not _known(x) or target is None or target.ndim != 1:
        return
    size, dims = int(np.prod(x)), [int(d) for d in target]
    if not node.attrs.get("allowzero", 0):
        dims = [x[i] if d == 0 and i < len(x) else d for i, d in enumerate(dims)]
    known = int(np.prod([d for d in dims if d != -1]))
    if any(d < -1 for d in dims) or dims.count(-1) > 1 or (
            size != known if -1 not in dims else known == 0 or size % known):
        _fail(node, f"reshapes '{printable(node.inputs[0])}' (shape {list(x)}, {size} "
              f"elements) to {[int(d) for d in target]}, which cannot hold them")


CHECKS = {
    "Reshape": _reshape,
    "Conv": _conv,
    "ConvTranspose": _conv,
    "MatMul": _matmul,
    "Gemm": _matmul,
    "BatchNormalization": _batch_norm,
}


def check_consistency(graph: Graph) -> None:
    """Raise InvalidModelError for the first node that reads a value nothing produces, or
    whose static shapes contradict its op."""
    known = set(graph.inputs) | set(graph.constants)
    for node in graph.nodes:
        for name in node.inputs:
            if name and name not in known:
                _fail(node, f"reads '{printable(name)}', which no earlier node, graph input or "
                      "initializer produces")
        known.update(node.outputs)
    for name in graph.outputs:
        if name not in known:
            raise InvalidModelError(
                f"The model is invalid: graph output '{printable(name)}' is produced by no "
                "node, input or initializer; fix the model where it was exported."
            )
    for node in graph.nodes:
        check = CHECKS.get(node.op_type)
        if check is not None and node.domain in ("", "ai.onnx"):
            check(node, graph)


def check_inference(model) -> None:
    """Strict ONNX shape and type inference on a weight-free copy of the loaded model. When
    it fails and onnxruntime rejects that copy too, the model is invalid (InvalidModelError,
    naming the node); otherwise conversion goes on with the shapes that can be known (ONNX's
    strict inference also trips over gaps onnxruntime fills)."""
    from onnx import shape_inference

    from onnx2tf_alt.ir.weights import ort_options, weight_free_copy

    light = weight_free_copy(model)
    try:
        shape_inference.infer_shapes(light, strict_mode=True, check_type=True)
        return
    except Exception as exc:  # noqa: BLE001 - judged with onnxruntime below
        problem = exc
    import onnxruntime as ort

    options = ort_options()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(light.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
    except Exception as ort_exc:  # noqa: BLE001 - only its verdict matters
        if "InferenceError" in str(ort_exc) or "Type Error" in str(ort_exc):
            lines = [line.strip() for line in str(problem).splitlines() if line.strip()]
            detail = " ".join(lines).replace("[ShapeInferenceError] Inference error(s): ", "")
            raise InvalidModelError(
                f"The model is invalid: its shapes or types contradict each other "
                f"({printable(detail)}); onnxruntime rejects it as well. Fix the model where "
                "it was exported."
            ) from problem
