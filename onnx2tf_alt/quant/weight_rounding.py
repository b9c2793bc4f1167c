"""Conv weights rounded for the INT8 files with error feedback (GPTQ), on calibration data.

TFLite quantizes a Conv's weights per output channel, symmetric: scale = max|w| / 127,
each weight rounded to the nearest step. Rounded one by one, the errors of a channel's
weights add up in its output; in trained mobile backbones a few pointwise convs whose
inputs are large and correlated lose most of the model's accuracy that way (on PaddleOCR's
PP-LCNetV3 text detector, rounding the weights alone, activations in float, took the output
cosine to 0.90-0.965 on held-out photographs; GPTQ's to 0.995). GPTQ (Frantar et al., 2022) rounds one input position at a time and spreads
its error over the weights not yet rounded, weighted by the inverse of H = X X^T of the
conv's input patches X on the calibration samples: the output error, not the weight error,
is what it minimizes.

The weights are written back in float, already on TFLite's grid (each channel's largest
weight kept at +-127 steps, so TFLite finds the same scale and rounds nothing), into a copy of
the model that the calibrated quantized files are built from. Per-channel grids only: with
-qt per-tensor the INT8 files' weights share one scale, which the INT16-activation files
(always per channel) do not, so nothing is rounded then.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.weights import ort_options, to_array

LEVELS = 127  # TFLite's symmetric int8 weight range
DAMPING = 0.01  # of H's mean diagonal, added to it: keeps H invertible
MAX_SAMPLES = 16  # calibration samples the patch statistics are collected on
MAX_POSITIONS = 8192  # output positions per sample and conv those statistics take, at most
# ... and per sample this many per row of H (a patch's inputs), at least MIN_POSITIONS: with
# 13 samples, 52 rows per dimension, within GPTQ's own 16-64; the products cost dim^2 x
# positions, and the 3x3 convs over 96 channels took most of a DB detector's 9 s at 8192
POSITIONS_PER_INPUT = 4
MIN_POSITIONS = 1024


def conv_input_statistics(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                          convs: list[onnx.NodeProto]) -> dict[str, list[np.ndarray]]:
    """{conv output: [H per group]}, H = sum of patch outer products of the conv's input."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in dict.fromkeys(c.input[0] for c in convs):
        if name not in known:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    # the weights kept on disk are found where they lie (ir/weights.py)
    session = ort.InferenceSession(probe.SerializeToString(), ort_options(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    weights = _weights(model)
    hessians: dict[str, list[np.ndarray]] = {}
    for sample in samples[:MAX_SAMPLES]:
        values = dict(zip(names, session.run(None, sample)))
        for conv in convs:
            for k, h in enumerate(_group_hessians(conv, values[conv.input[0]],
                                                  weights[conv.input[1]].shape)):
                found = hessians.setdefault(conv.output[0], [])
                if k < len(found):
                    found[k] += h
                else:
                    found.append(h)
    return hessians


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    found = {i.name: to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found


def _attrs(conv: onnx.NodeProto, spatial: int) -> tuple[int, list, list, list]:
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    return (attrs.get("group", 1), list(attrs.get("strides", [1] * spatial)),
            list(attrs.get("dilations", [1] * spatial)),
            list(attrs.get("pads", [0] * 2 * spatial)))


def _group_hessians(conv: onnx.NodeProto, x: np.ndarray, shape: tuple) -> list[np.ndarray]:
    """Patch outer products of one input (N, C, H, W) of a 2-D Conv, per group, over at
    most `limit` output positions (POSITIONS_PER_INPUT per row of H, within MIN_POSITIONS
    and MAX_POSITIONS; a fixed random subset estimates H as well): only the patches of those
    positions are gathered."""
    groups, strides, dilations, pads = _attrs(conv, 2)
    x = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    kh, kw = shape[2], shape[3]
    out_h = (x.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (x.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    positions = np.arange(x.shape[0] * out_h * out_w)
    limit = min(MAX_POSITIONS, max(MIN_POSITIONS, POSITIONS_PER_INPUT * shape[1] * kh * kw))
    if len(positions) > limit:
        positions = np.sort(np.random.default_rng(0).choice(len(positions), limit,
                                                            replace=False))
    n, rows, cols = (positions // (out_h * out_w), (positions // out_w) % out_h * strides[0],
                     positions % out_w * strides[1])
    # C, taps, positions: rows in (c, ky, kx) order, as the weights are; float32 products
    # (8192-term sums, relative error ~1e-5), summed over samples in float64
    # every tap of every position at once, as offsets into each channel's flat samples
    height, width = x.shape[2], x.shape[3]
    taps = (np.arange(kh)[:, None] * dilations[0] * width + np.arange(kw) * dilations[1])
    offsets = taps.reshape(-1, 1) + (n * height * width + rows * width + cols)
    flat = x.transpose(1, 0, 2, 3).reshape(x.shape[1], -1)  # a view for one sample
    patches = np.take(flat, offsets, axis=1).astype(np.float32, copy=False)
    per_group = shape[1]
    if per_group == 1:  # depthwise: one batched product for every channel
        return list((patches @ patches.transpose(0, 2, 1)).astype(np.float64))
    result = []
    for g in range(groups):
        p = patches[g * per_group:(g + 1) * per_group].reshape(per_group * kh * kw, -1)
        result.append((p @ p.T).astype(np.float64))
    return result


def round_rows(w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """GPTQ of `w` (rows: output channels, columns: one group's patch positions) given the
    patch statistics `h`; the result lies on each row's grid max|w_row| / 127 (rounded to
    nearest where `h` is too ill-conditioned to factor). With a leading axis (groups:
    `w` (G, rows, columns), `h` (G, columns, columns)) every group is rounded at once, each
    as alone: a depthwise conv's 192 groups of 25 columns take 25 steps, not 4,800."""
    if w.ndim == 2:
        return round_rows(w[None], h[None])[0]
    try:
        return _round_groups(w, h, factored=True)
    except np.linalg.LinAlgError:  # a group's h too ill-conditioned: each on its own
        if len(w) == 1:
            return _round_groups(w, h, factored=False)
        return np.concatenate([round_rows(w[g:g + 1], h[g:g + 1]) for g in range(len(w))])


def _round_groups(w: np.ndarray, h: np.ndarray, factored: bool) -> np.ndarray:
    groups, columns = w.shape[0], w.shape[2]
    w = w.astype(np.float64)
    scale = np.abs(w).max(axis=2, keepdims=True) / LEVELS
    scale[scale == 0] = 1.0
    damping = [max(float(np.mean(np.diag(h[g]))), 1e-12) for g in range(groups)]
    h = h.copy()  # + DAMPING x its mean diagonal on the diagonal (no identity of h's size)
    h[:, np.arange(columns), np.arange(columns)] += DAMPING * np.array(damping)[:, None]
    diagonal = np.diagonal(h, axis1=1, axis2=2)
    order = np.stack([np.argsort(-diagonal[g]) for g in range(groups)])  # act-order
    w = np.take_along_axis(w, order[:, None, :], axis=2)
    h = h[np.arange(groups)[:, None, None], order[:, :, None], order[:, None, :]]
    # the inverse's upper factor
    upper = np.linalg.cholesky(np.linalg.inv(h)).transpose(0, 2, 1) if factored else None
    q = np.zeros_like(w)
    for i in range(columns):
        q[:, :, i] = np.clip(np.round(w[:, :, i] / scale[:, :, 0]), -LEVELS, LEVELS) \
            * scale[:, :, 0]
        if upper is not None:
            error = (w[:, :, i] - q[:, :, i]) / upper[:, i, i][:, None]
            w[:, :, i + 1:] -= error[:, :, None] * upper[:, None, i, i + 1:]
    steps = np.round(np.take_along_axis(q, np.argsort(order, axis=1)[:, None, :], axis=2)
                     / scale)
    # TFLite re-derives the scale from max|w|: keep each row's largest weight at 127 steps
    largest = np.abs(steps).max(axis=2)
    for g, r in zip(*np.nonzero((largest < LEVELS) & (largest > 0))):
        k = int(np.argmax(np.abs(steps[g, r])))
        steps[g, r, k] = np.sign(steps[g, r, k]) * LEVELS
    return steps * scale


def round_conv_weights(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]
                       ) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` whose 2-D Conv weights (constant, per-channel) are GPTQ-rounded on
    `samples` (feeds in ONNX layout); and how many convs were."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weights = _weights(copy)
    readers: dict[str, int] = {}
    for node in copy.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    convs = [n for n in copy.graph.node if n.op_type == "Conv" and len(n.input) > 1
             and weights.get(n.input[1]) is not None and weights[n.input[1]].ndim == 4
             and readers[n.input[1]] == 1]  # a shared weight would be rounded for one reader
    if not convs or not samples:
        return copy, 0
    hessians = conv_input_statistics(copy, samples, convs)
    rounded = {}
    for conv in convs:
        w = weights[conv.input[1]]
        groups = _attrs(conv, 2)[0]
        rows = w.shape[0] // groups
        flat = w.reshape(groups, rows, -1)
        hessian = hessians.pop(conv.output[0])  # (a 3x3 conv over 384 channels: 95 MB)
        new = round_rows(flat, hessian[0][None] if groups == 1 else np.stack(hessian))
        del hessian
        rounded[conv.input[1]] = new.reshape(w.shape).astype(w.dtype)
    _replace_constants(copy.graph, rounded)
    return copy, len(convs)


def _replace_constants(graph: onnx.GraphProto, values: dict[str, np.ndarray]) -> None:
    for init in graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in values:
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(values[node.output[0]]))
