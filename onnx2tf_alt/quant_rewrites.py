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

import numpy as np
import onnx
from onnx import helper, numpy_helper


class _Graph:
    """Producers, consumers and constants of a graph, kept current while nodes change."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.constants = {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        for node in self.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.outputs = {o.name for o in self.graph.output}
        self.index()

    def index(self) -> None:
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def const(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def only_user(self, name: str) -> onnx.NodeProto | None:
        """The single consumer of an intermediate value (None for graph outputs)."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def add_constant(self, name: str, value: np.ndarray) -> str:
        name = self.unique(name)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        self.constants[name] = value
        return name

    def unique(self, name: str) -> str:
        taken = set(self.producer) | set(self.constants) | {i.name for i in self.graph.input}
        candidate, k = name, 0
        while candidate in taken:
            k += 1
            candidate = f"{name}_{k}"
        return candidate

    def replace(self, old: list[onnx.NodeProto], new: list[onnx.NodeProto]) -> None:
        """Put `new` where the first of `old` was and drop `old`."""
        nodes = list(self.graph.node)
        gone = [any(n is o for o in old) for n in nodes]
        at = gone.index(True)
        kept = [n for n, dropped in zip(nodes, gone) if not dropped]
        del self.graph.node[:]
        self.graph.node.extend(kept[:at] + new + kept[at:])
        self.index()


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


def _affine_chain(g: _Graph, conv: onnx.NodeProto, channels: int, rank: int):
    """(source, nodes, scale, shift) of a Mul / Add by per-channel constants (Mul first)
    that only feeds `conv`'s data input, or None."""
    nodes, scale, shift = [], np.ones(channels), np.zeros(channels)
    name = conv.input[0]
    while (node := g.producer.get(name)) is not None and g.only_user(name) is not None:
        source = next((i for i in node.input if g.const(i) is None), None)
        constant = _other_input(node, source) if source is not None else None
        vector = _channel_vector(g.const(constant), channels, rank) if constant else None
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


def _fold_into_conv(g: _Graph, conv: onnx.NodeProto) -> bool:
    weight = g.const(conv.input[1]) if len(conv.input) > 1 else None
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
    bias = g.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if len(conv.input) > 2 and conv.input[2] and bias is None:
        return False
    new_bias = (np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)) + (
        w * shifts).reshape(weight.shape[0], -1).sum(axis=1)
    stem = conv.name or conv.output[0]
    inputs = [source, g.add_constant(f"{stem}_folded_w", (w * factors).astype(weight.dtype)),
              g.add_constant(f"{stem}_folded_b", new_bias.astype(weight.dtype))]
    folded = helper.make_node("Conv", inputs, list(conv.output), name=conv.name)
    folded.attribute.extend(conv.attribute)
    g.replace([*nodes, conv], [folded])
    return True


# --- squeeze-excitation residual ----------------------------------------------------------
def _gated_residual_at(g: _Graph, add: onnx.NodeProto):
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    for k in (0, 1):
        x, product = add.input[k], add.input[1 - k]
        mul = g.producer.get(product)
        if mul is None or mul.op_type != "Mul" or g.only_user(product) is not add:
            continue
        gate = _other_input(mul, x)
        if gate is None or g.const(gate) is not None or not _smaller(g, gate, x):
            continue
        return x, gate, mul
    return None


def _smaller(g: _Graph, gate: str, x: str) -> bool:
    """Whether `gate` has a known shape with fewer elements than `x`'s (a broadcast gate)."""
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*g.graph.value_info, *g.graph.input, *g.graph.output]
              if v.name in (gate, x) and v.type.tensor_type.HasField("shape")}
    if len(shapes) != 2 or any(0 in s for s in shapes.values()):
        return False
    return int(np.prod(shapes[gate])) < int(np.prod(shapes[x]))


def _factor_gated_residual_at(g: _Graph, node: onnx.NodeProto) -> bool:
    match = _gated_residual_at(g, node)
    if match is None:
        return False
    x, gate, mul = match
    one = g.add_constant(f"{node.name or node.output[0]}_one", np.array(1, np.float32))
    shifted = g.unique(f"{gate}_plus_one")
    g.replace([mul, node], [
        helper.make_node("Add", [gate, one], [shifted], name=f"{shifted}_add"),
        helper.make_node("Mul", [x, shifted], list(node.output), name=node.name)])
    return True


# --- entry point --------------------------------------------------------------------------
REWRITES = {  # name in the counts -> one rewrite at a node (True when it rewrote)
    "affine_into_conv": _fold_into_conv,
    "gated_residual": _factor_gated_residual_at,
}


def _repeat(g: _Graph, rewrite_at) -> int:
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
    g = _Graph(copy)
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
