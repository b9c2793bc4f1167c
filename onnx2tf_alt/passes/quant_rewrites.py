"""ONNX rewrites that leave a model's float function unchanged (up to float rounding) and
give TFLite's 8-bit quantizer fewer tensors to quantize.

Every op output of an INT8 file is rounded to 256 levels of its own range. Two patterns
that trained mobile backbones (PP-LCNet, MobileNetV3) and their FPN necks export add such
tensors that the float model never needed:

- a constant per-channel affine (Mul by a, Add b: a "learnable affine block" or an
  unfolded BatchNorm) between an activation and the Conv reading it: each is an INT8 op
  that rounds again. Folded into the Conv's weights and bias it costs nothing (a shift
  only where the Conv does not pad: its zero border would change; an explicit Pad with
  -b / a would keep it exact, but TFLite's 16x8 mode leaves PADV2's value in float and fails).
- a squeeze-excitation residual x + x * s (s a per-channel gate): the full-size product is
  one more INT8 tensor, as wide as x. x * (1 + s) rounds once, and the Add runs on the
  small gate tensor.

`rewrite_for_quantization` applies them to a copy; the quantized files are built from it
(quant/prepare.py), the float files from the original model. (Fusing written-out
hard-swish into HardSwish was tried too: TFLite's INT8 HARD_SWISH, which XNNPACK does not
take, made the PP-OCRv4 detector's INT8 file 2.5x slower at one thread for no measurable
accuracy, and 16x8 has no HARD_SWISH kernel.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex


def _replace(g: GraphIndex, old: list[onnx.NodeProto], new: list[onnx.NodeProto]) -> None:
    """Put `new` where the first of `old` was and drop `old`."""
    nodes = list(g.graph.node)
    gone = [any(n is o for o in old) for n in nodes]
    at = gone.index(True)
    kept = [n for n, dropped in zip(nodes, gone) if not dropped]
    del g.graph.node[:]
    g.graph.node.extend(kept[:at] + new + kept[at:])
    g.reindex()


def _other_input(node: onnx.NodeProto, name: str) -> str | None:
    others = [i for i in node.input if i != name]
    return others[0] if len(others) == 1 and len(node.input) == 2 else None


# --- constant affine into the next Conv ---------------------------------------------------
def _channel_vector(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant broadcast against an NC... tensor as one value per channel, or None."""
    if value is None or value.ndim > rank or not np.issubdtype(value.dtype, np.floating):
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float64)


def _affine_chain(g: GraphIndex, conv: onnx.NodeProto, channels: int, rank: int):
    """(source, nodes, scale, shift) of a Mul / Add by per-channel constants (Mul first)
    that only feeds `conv`'s data input, or None."""
    nodes, scale, shift = [], np.ones(channels), np.zeros(channels)
    name = conv.input[0]
    while (node := g.producer_node(name)) is not None and g.only_user(name) is not None:
        source = next((i for i in node.input if g.value(i) is None), None)
        constant = _other_input(node, source) if source is not None else None
        vector = _channel_vector(g.value(constant), channels, rank) if constant else None
        above_mul = bool(nodes) and nodes[0].op_type == "Mul"  # x * a + b: one Mul, on top
        if vector is None or above_mul or node.op_type not in ("Mul", "Add"):
            break
        if node.op_type == "Add":
            shift = shift + vector
        else:
            scale = vector
        nodes.insert(0, node)
        name = source
    return (name, nodes, scale, shift) if nodes else None


def _pads(conv: onnx.NodeProto, spatial: int) -> list[int] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad == "VALID":
        return [0] * 2 * spatial
    if auto_pad != "NOTSET":
        return None
    return list(attrs.get("pads", [0] * 2 * spatial))


def _fold_into_conv(g: GraphIndex, conv: onnx.NodeProto) -> bool:
    weight = g.value(conv.input[1]) if len(conv.input) > 1 else None
    if conv.op_type != "Conv" or weight is None or weight.ndim < 3:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    groups, rank = attrs.get("group", 1), weight.ndim
    channels = weight.shape[1] * groups
    chain = _affine_chain(g, conv, channels, rank)
    pads = _pads(conv, rank - 2)
    if chain is None or pads is None:
        return False
    source, nodes, scale, shift = chain
    if any(pads) and np.any(shift != 0):
        # the zero border would read -b after the fold (an explicit Pad with -b / a keeps
        # it exact, but TFLite's 16x8 mode leaves PADV2's value in float and fails)
        return False
    out_per_group = weight.shape[0] // groups
    w = weight.astype(np.float64)
    per_input = scale.reshape(groups, 1, weight.shape[1])  # [group, 1, input channel]
    spatial = (1,) * (rank - 2)
    factors = np.repeat(per_input, out_per_group, axis=1).reshape(weight.shape[0], -1, *spatial)
    shifts = np.repeat(shift.reshape(groups, 1, weight.shape[1]), out_per_group, axis=1
                       ).reshape(weight.shape[0], -1, *spatial)
    bias = g.value(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if len(conv.input) > 2 and conv.input[2] and bias is None:
        return False
    new_bias = (np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)) + (
        w * shifts).reshape(weight.shape[0], -1).sum(axis=1)
    stem = conv.name or conv.output[0]
    inputs = [source, g.add_constant(f"{stem}_folded_w", (w * factors).astype(weight.dtype)),
              g.add_constant(f"{stem}_folded_b", new_bias.astype(weight.dtype))]
    folded = helper.make_node("Conv", inputs, list(conv.output), name=conv.name)
    folded.attribute.extend(conv.attribute)
    _replace(g, [*nodes, conv], [folded])
    return True


# --- squeeze-excitation residual ----------------------------------------------------------
def _gated_residual_at(g: GraphIndex, add: onnx.NodeProto):
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    for k in (0, 1):
        x, product = add.input[k], add.input[1 - k]
        mul = g.producer_node(product)
        if mul is None or mul.op_type != "Mul" or g.only_user(product) is not add:
            continue
        gate = _other_input(mul, x)
        if gate is None or g.value(gate) is not None or not _smaller(g, gate, x):
            continue
        return x, gate, mul
    return None


def _smaller(g: GraphIndex, gate: str, x: str) -> bool:
    """Whether `gate` has a known shape with fewer elements than `x`'s (a broadcast gate)."""
    shapes = [g.static_shape(gate), g.static_shape(x)]
    if None in shapes or any(0 in s for s in shapes):
        return False
    return int(np.prod(shapes[0])) < int(np.prod(shapes[1]))


def _factor_gated_residual_at(g: GraphIndex, node: onnx.NodeProto) -> bool:
    match = _gated_residual_at(g, node)
    if match is None:
        return False
    x, gate, mul = match
    one = g.add_constant(f"{node.name or node.output[0]}_one", np.array(1, np.float32))
    shifted = g.unique(f"{gate}_plus_one")
    _replace(g, [mul, node], [
        helper.make_node("Add", [gate, one], [shifted], name=f"{shifted}_add"),
        helper.make_node("Mul", [x, shifted], list(node.output), name=node.name)])
    return True


# --- per-channel range equalization -------------------------------------------------------
# INT8 activations are quantized per tensor: one channel with a 10x wider range than the
# others leaves those others a handful of the 256 levels. Scaling channel c of a tensor by
# k_c and the next Conv's input channel c by 1 / k_c is exact in float (a zero border stays
# zero) and equalizes the channels' ranges (cross-layer equalization, Nagel et al., 2019).
MAX_CHANNEL_GAIN = 16.0


@dataclass
class _Equalizable:
    """Conv / BatchNormalization -> scalar Mul, Div, Add ... -> [x * Clip(x + b, lo, hi)]
    -> scalar ops ... -> Conv(s), every value read by the next step only."""

    producer: onnx.NodeProto  # whose output channels are scaled by k
    adds: list[onnx.NodeProto] = field(default_factory=list)  # their constant scales by k
    gate: onnx.NodeProto | None = None  # the Add of a gate x * Clip(x + b): recomputed from x
    value: str = ""  # the tensor whose per-channel ranges choose k
    consumers: list[onnx.NodeProto] = field(default_factory=list)  # input channels: 1 / k


def _scalar_step(g: GraphIndex, node: onnx.NodeProto, name: str) -> bool:
    """Whether `node` multiplies, divides or shifts `name` by a one-element constant."""
    other = _other_input(node, name)
    value = g.value(other) if other else None
    if value is None or value.size != 1 or node.op_type not in ("Mul", "Add", "Div"):
        return False
    return node.op_type != "Div" or node.input[0] == name


def _walk_scalars(g: GraphIndex, name: str, found: _Equalizable) -> str:
    """The last value of the scalar chain from `name`."""
    while (node := g.only_user(name)) is not None and _scalar_step(g, node, name):
        if node.op_type == "Add":
            found.adds.append(node)
        name = node.output[0]
    return name


def _gate_at(g: GraphIndex, x: str) -> onnx.NodeProto | None:
    """The Add of x * Clip(x + b, lo, hi) when those are x's only readers, else None."""
    users = g.consumer_nodes(x)
    if len(users) != 2 or x in g.outputs:
        return None
    add = next((u for u in users if u.op_type == "Add"), None)
    mul = next((u for u in users if u.op_type == "Mul"), None)
    clip = g.only_user(add.output[0]) if add is not None and _scalar_step(g, add, x) else None
    if clip is None or clip.op_type != "Clip" or len(clip.input) != 3 or any(
            g.value(i) is None for i in clip.input[1:]):
        return None
    if g.only_user(clip.output[0]) is not mul or set(mul.input) != {x, clip.output[0]}:
        return None
    return add


def _equalizable_at(g: GraphIndex, producer: onnx.NodeProto) -> _Equalizable | None:
    if producer.op_type not in ("Conv", "BatchNormalization") or any(
            g.value(i) is None for i in producer.input[1:] if i):
        return None
    found = _Equalizable(producer)
    name = found.value = _walk_scalars(g, producer.output[0], found)
    gate = _gate_at(g, name)
    if gate is not None:
        found.gate = gate
        product = next(u for u in g.consumer_nodes(name) if u.op_type == "Mul")
        name = _walk_scalars(g, product.output[0], found)
    found.consumers = g.consumer_nodes(name)
    if name in g.outputs or not found.consumers or any(
            c.op_type != "Conv" or c.input[0] != name or g.value(c.input[1]) is None
            for c in found.consumers):
        return None
    return found


def _channel_shape(k: np.ndarray, rank: int, axis: int = 1) -> tuple:
    return tuple(len(k) if i == axis else 1 for i in range(rank))


def _equalize(g: GraphIndex, found: _Equalizable, k: np.ndarray) -> None:
    """Scale `found`'s chain by k per channel (exact in float)."""
    producer = found.producer
    rank = g.value(found.consumers[0].input[1]).ndim
    scaled = {}  # constant input name -> new value
    if producer.op_type == "Conv":  # output channels: weight rows and bias
        w = g.value(producer.input[1])
        scaled[producer.input[1]] = w * k.reshape(_channel_shape(k, w.ndim, 0))
        if len(producer.input) > 2 and producer.input[2]:
            scaled[producer.input[2]] = g.value(producer.input[2]) * k
    else:  # BatchNormalization: gamma and beta
        for i in producer.input[1:3]:
            scaled[i] = g.value(i) * k
    for add in found.adds:
        other = _other_input(add, next(i for i in add.input if g.value(i) is None))
        scaled[other] = g.value(other).reshape(()) * k.reshape(_channel_shape(k, rank))
    for consumer in found.consumers:
        scaled[consumer.input[1]] = _scale_inputs(consumer, g.value(consumer.input[1]), 1 / k)
    for node in [producer, *found.adds, *found.consumers]:  # new constants: others may share
        for j, name in enumerate(node.input):
            if name in scaled:
                node.input[j] = g.add_constant(f"{name}_equalized",
                                               scaled[name].astype(np.float32))
    if found.gate is not None:  # Clip(x + b) from the scaled x: a 1x1 depthwise Conv
        add = found.gate
        shift = g.value(_other_input(add, found.value)).reshape(())
        taps = g.add_constant(f"{add.output[0]}_unscale",
                              (1 / k).reshape(len(k), 1, *(1,) * (rank - 2)).astype(np.float32))
        bias = g.add_constant(f"{add.output[0]}_shift", np.full(len(k), shift, np.float32))
        gate = helper.make_node("Conv", [found.value, taps, bias], list(add.output),
                                name=add.name or add.output[0], group=len(k))
        _replace(g, [add], [gate])
    g.reindex()


def _scale_inputs(conv: onnx.NodeProto, weight: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """`conv`'s weight with input channel c scaled by factor[c]."""
    groups = {a.name: helper.get_attribute_value(a) for a in conv.attribute}.get("group", 1)
    per_group = weight.shape[1]  # input channels per group; output rows are grouped alike
    rows = weight.shape[0] // groups
    factors = np.repeat(factor.reshape(groups, 1, per_group), rows, axis=1)
    return weight * factors.reshape(weight.shape[0], per_group, *(1,) * (weight.ndim - 2))


def equalizable_chains(model: onnx.ModelProto) -> list[_Equalizable]:
    """The chains `equalize_channels` can scale (read-only; node references into `model`)."""
    g = GraphIndex(model.graph)
    return [f for n in g.graph.node if (f := _equalizable_at(g, n)) is not None]


def equalize_channels(model: onnx.ModelProto, channel_max: dict[str, np.ndarray]
                      ) -> tuple[onnx.ModelProto, int]:
    """(copy of `model` with each equalizable chain scaled, how many), given each chain
    value's max |x| per channel (`channel_max`, e.g. measured on calibration samples):
    channel c is scaled by k_c = max / max_c, between 1 and MAX_CHANNEL_GAIN."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    g = GraphIndex(copy.graph)
    count = 0
    # by output name: a rewrite re-lists the graph's nodes (one chain's consumer may be the
    # next one's producer)
    for output in [f.producer.output[0] for f in equalizable_chains(copy)]:
        found = _equalizable_at(g, g.producer_node(output))
        peaks = channel_max.get(found.value) if found is not None else None
        if peaks is None:
            continue
        k = np.clip(peaks.max() / np.maximum(peaks, 1e-12), 1, MAX_CHANNEL_GAIN)
        if np.all(k < 1.01):
            continue
        _equalize(g, found, k.astype(np.float64))
        count += 1
    _drop_unused_constants(copy.graph)
    return copy, count


def channel_peaks(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                  names: list[str]) -> dict[str, np.ndarray]:
    """{name: max |value| per channel (axis 1)} over `samples`, run in onnxruntime."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names
                              if n not in known)
    from onnx2tf_alt.ir.weights import ort_options

    # the weights kept on disk are found where they lie (ir/weights.py)
    session = ort.InferenceSession(probe.SerializeToString(), ort_options(),
                                   providers=["CPUExecutionProvider"])
    peaks: dict[str, np.ndarray] = {}
    for sample in samples:
        for name, value in zip(names, session.run(names, sample)):
            peak = np.abs(value).max(axis=tuple(i for i in range(value.ndim) if i != 1))
            peaks[name] = np.maximum(peaks.get(name, peak), peak)
    return peaks


# --- entry point --------------------------------------------------------------------------
REWRITES = {  # name in the counts -> one rewrite at a node (True when it rewrote)
    "affine_into_conv": _fold_into_conv,
    "gated_residual": _factor_gated_residual_at,
}


def _repeat(g: GraphIndex, rewrite_at) -> int:
    """Apply `rewrite_at` until no node matches (each rewrite re-lists the nodes); the count."""
    count = 0
    while any(rewrite_at(g, n) for n in list(g.graph.node)):
        count += 1
    return count


def rewrite_for_quantization(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of `model` with every rewrite applied, and how often each applied (all zero:
    the copy computes what the model does, node for node)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if not copy.graph.value_info:  # the gated-residual rewrite reads shapes
        copy = onnx.shape_inference.infer_shapes(copy)
    g = GraphIndex(copy.graph)
    counts = {name: _repeat(g, rewrite_at) for name, rewrite_at in REWRITES.items()}
    _drop_unused_constants(copy.graph)
    return copy, counts


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    """Remove the initializers and Constant nodes the rewrites left without readers."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}
    kept = [i for i in graph.initializer if i.name in read or i.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in read]
    del graph.node[:]
    graph.node.extend(nodes)
