"""A strided 2-D ConvTranspose written as convolutions of its output phases.

A transposed convolution of stride s gives each output pixel `(m·s + rh, n·s + rw)` from the
kernel taps of its phase `(rh, rw)` only: for one phase the output is an ordinary
convolution of the input, whose kernel is those taps (per axis, the taps `t` with
`(r + pad_begin - t) % s == 0`, read at input offset `(r + pad_begin - t) / s`). So

    ConvTranspose(x, w, b)  ==  DepthToSpace_DCR(Concat_channels(Conv_phase(x) for each
                                phase), s), cropped to the output size

exactly (each output is the same sum of the same products). An inference BatchNormalization
after it is folded into the phases' weights, and a Relu / Clip (0..6, -1..1) after that is
applied to each phase before they interleave, where TFLite fuses it into the CONV_2D (as
TF's converter moves it). XNNPACK's TRANSPOSE_CONV is
slow next to its convolutions (and gains nothing from a second thread): measured on this
machine's 2 cores, 1 / 2 threads, against the single TRANSPOSE_CONV (with its bias ADD
and crop SLICE): see docs/benchmarks.md#transposed-convolutions. Where every phase reads
the same input offsets (kernel size a multiple of the stride, e.g. SAM's 2x2 stride-2
upscaling) the phases are one convolution with s² times the output channels, and no
Concat.

A 1-D one (vocoders' upsampling) interleaves its phases with reshapes and a transpose that,
channel-last, move no data.

Rewritten: 1-D and 2-D, any group (a grouped or depthwise Conv per phase: CenterNet's
upsampling), dilation 1, equal strides above 1, a constant weight (and bias), any padding
(explicit, VALID, SAME_UPPER / SAME_LOWER or an `output_shape`), and every phase with a
tap at an offset >= 0 start (pads below the stride, as exporters write them). Others are
left as they are.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset
from onnx2tf_alt.ir.weights import to_array


def split_transposed_convs(model: onnx.ModelProto) -> int:
    """Rewrite each ConvTranspose of the main graph that qualifies (module docstring);
    returns how many."""
    graph = model.graph
    opset = default_opset(model)
    index = GraphIndex(graph)
    initializers = index.initializers
    rewritten: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for position, node in enumerate(index.nodes):
        phases = _phases(node, initializers, index.shape)
        if phases is None or (opset < 5 and len(phases[1]) == 1):  # Reshape's shape input
            continue
        norm, activation = _followers(index, node.output[0])
        last = activation or norm
        if len(phases[1]) == 1 and (last or node).output[0] in index.outputs:
            continue  # a model output of rank 3 made by the interleave would be given in
            # ONNX layout (layout/plan.py's rule for rank-3 outputs): one TRANSPOSE more
        dropped.update(index.producer[n.output[0]] for n in (norm, activation) if n)
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        rewritten[position] = _rewrite(graph, node, initializers, opset, *phases,
                                       norm=norm, activation=activation,
                                       output=(last or node).output[0], groups=groups)
    if not rewritten:
        return 0
    nodes = [n for position, node in enumerate(index.nodes) if position not in dropped
             for n in rewritten.get(position, [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(rewritten)


def _phases(node: onnx.NodeProto, initializers: dict, shape_of):
    """(stride, per axis the taps of each phase [(offset, tap), ...], output size) where
    the node qualifies, else None."""
    if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) < 2 or node.input[1] not in initializers:
        return None
    if len(node.input) > 2 and node.input[2] and node.input[2] not in initializers:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight_shape = list(initializers[node.input[1]].dims)
    rank = len(weight_shape) - 2  # spatial axes: 1 or 2
    x, y = shape_of(node.input[0]), shape_of(node.output[0])
    if rank not in (1, 2) or not x or not y or len(x) != rank + 2 or len(y) != rank + 2:
        return None
    if None in x[2:] or None in y[2:]:
        return _run_time_phases(attrs, weight_shape)
    if None in x[1:] or None in y[1:]:
        return None
    kernel = list(attrs.get("kernel_shape", weight_shape[2:]))
    strides = list(attrs.get("strides", [1] * rank))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if (list(attrs.get("dilations", [1] * rank)) != [1] * rank
            or len(set(strides)) != 1 or strides[0] < 2 or kernel != weight_shape[2:]):
        return None
    stride = strides[0]
    padding = list(attrs.get("output_padding", [0] * rank))
    pads = list(attrs.get("pads", [0] * 2 * rank)) if auto_pad == "NOTSET" else [0] * 2 * rank
    if "output_shape" in attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # pads from the output size (shape inference's), split as onnxruntime splits them:
        # SAME_UPPER puts an odd one at the end, SAME_LOWER and an explicit output_shape at
        # the start (checked against onnxruntime: tests/passes/test_deconv_phases.py)
        if any(padding):
            return None
        totals = [stride * (x[2 + a] - 1) + kernel[a] - y[2 + a] for a in range(rank)]
        if min(totals) < 0:
            return None
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = [*begins, *(t - b for t, b in zip(totals, begins))]
    taps = []
    for axis in range(rank):
        begin, size = pads[axis], x[2 + axis]
        per_phase = [[((r + begin - t) // stride, t) for t in range(kernel[axis])
                      if (r + begin - t) % stride == 0] for r in range(stride)]
        if any(not p or min(d for d, _ in p) > 0 for p in per_phase):
            return None  # a phase without taps, or one that starts past the input's start
        expected = (size - 1) * stride - pads[axis] - pads[axis + rank] + kernel[axis] + (
            padding[axis])
        steps = -(-expected // stride)  # outputs of each phase
        if expected != y[2 + axis] or any(steps + max(d for d, _ in p) < size
                                          for p in per_phase):
            return None  # a phase conv would need a negative end pad: an output cropped
        taps.append(per_phase)
    return stride, taps, y[2:], x[2:]


def _run_time_phases(attrs: dict, weight_shape: list[int]):
    """_phases of a 2-D ConvTranspose on spatial dims known only at run time, where its
    output is `in · s` whatever the input (k + output_padding - pads = s: a U-Net's or a
    text detector's 2x2 stride-2 upsampling, 4x4 with pads 1): each phase is a
    convolution of the input with size-independent pads, interleaved without a crop. The
    output size is None."""
    kernel = list(attrs.get("kernel_shape", weight_shape[2:]))
    strides = list(attrs.get("strides", [1, 1]))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if (len(weight_shape) != 4 or auto_pad not in ("NOTSET", "VALID") or "output_shape" in attrs
            or list(attrs.get("dilations", [1, 1])) != [1, 1] or len(set(strides)) != 1
            or strides[0] < 2 or kernel != weight_shape[2:]):
        return None
    stride = strides[0]
    padding = list(attrs.get("output_padding", [0, 0]))
    pads = list(attrs.get("pads", [0] * 4)) if auto_pad == "NOTSET" else [0] * 4
    taps = []
    for axis in range(2):
        if kernel[axis] + padding[axis] - pads[axis] - pads[axis + 2] != stride:
            return None  # the output is not in · s: a crop of run-time length
        per_phase = [[((r + pads[axis] - t) // stride, t) for t in range(kernel[axis])
                      if (r + pads[axis] - t) % stride == 0] for r in range(stride)]
        if any(not p or min(d for d, _ in p) > 0 or max(d for d, _ in p) < 0
               for p in per_phase):
            return None
        taps.append(per_phase)
    return stride, taps, None, None


# activations TFLite fuses into a CONV_2D: applied to each phase before they interleave
_FUSED = {"Relu": None, "Clip": ((0.0, 6.0), (-1.0, 1.0), (0.0, None))}


def _followers(index: GraphIndex, name: str):
    """(the inference BatchNormalization, the fusable activation) that read `name` alone, one
    after the other (each may be None): they commute with the interleaving, so the norm is
    folded into the phases' weights and the activation applied to each phase, where the
    CONV_2D takes it."""
    norm = activation = None
    consumers = index.consumer_nodes(name) if index.single_use(name) else []
    if consumers and consumers[0].op_type == "BatchNormalization" and len(
            consumers[0].output) == 1 and all(i in index.initializers
                                              for i in consumers[0].input[1:5]):
        norm = consumers[0]
        name = norm.output[0]
        consumers = index.consumer_nodes(name) if index.single_use(name) else []
    if consumers and consumers[0].op_type in _FUSED and _fusable(consumers[0], index):
        activation = consumers[0]
    return norm, activation


def _fusable(node: onnx.NodeProto, index: GraphIndex) -> bool:
    if node.op_type == "Relu":
        return True
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bounds = [attrs.get("min"), attrs.get("max")]  # Clip before opset 11
    for k, name in enumerate(node.input[1:3]):
        if name and name not in index.initializers:
            return False
        if name:
            bounds[k] = float(to_array(index.initializers[name]))
    return tuple(bounds) in _FUSED["Clip"]


def _rewrite(graph: onnx.GraphProto, node: onnx.NodeProto, initializers: dict, opset: int,
             stride: int, taps: list, out_size: list[int], in_size: list[int],
             norm: onnx.NodeProto | None = None, activation: onnx.NodeProto | None = None,
             output: str = "", groups: int = 1) -> list[onnx.NodeProto]:
    """The Conv(s) [each with `activation`], Concat, DepthToSpace (1-D: the phases stacked
    on a last axis that a Reshape merges) and crop that compute `output` (`node`'s, or that
    of the `norm` / `activation` after it), in the forms of the model's opset."""
    w = to_array(initializers[node.input[1]])  # [C_in, C_out / groups, *kernel]
    rank = w.ndim - 2
    cin, cout = w.shape[0], w.shape[1] * groups
    bias = (to_array(initializers[node.input[2]]) if len(node.input) > 2 and node.input[2]
            else np.zeros(cout, w.dtype))
    scale = np.ones(cout, w.dtype)
    if norm is not None:  # y = (x - mean) * gamma / sqrt(var + eps) + beta, per channel
        gamma, beta, mean, var = (to_array(initializers[n]) for n in norm.input[1:5])
        eps = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
        scale = (gamma / np.sqrt(var + eps)).astype(w.dtype)
        bias = ((bias - mean) * scale + beta).astype(w.dtype)

    def conv_taps(tap: np.ndarray) -> np.ndarray:
        """One kernel position of the transposed conv's weight, [C_in, C_out / groups], as
        the grouped Conv's [C_out, C_in / groups], the norm's scale applied."""
        per_group = tap.reshape(groups, cin // groups, cout // groups).transpose(0, 2, 1)
        return per_group.reshape(cout, cin // groups) * scale[:, None]

    prefix = f"{node.name or node.output[0]}/phase"
    # outputs per phase and axis: the input's length where the output is in · s (at run time)
    steps = in_size if out_size is None else [-(-o // stride) for o in out_size]
    # (weight, pads) per phase, row-major over (rh, rw): DepthToSpace DCR's channel order
    phases = []
    for phase in itertools.product(range(stride), repeat=rank):
        chosen = [taps[a][r] for a, r in enumerate(phase)]
        low = [min(d for d, _ in t) for t in chosen]
        high = [max(d for d, _ in t) for t in chosen]
        weight = np.zeros((cout, cin // groups, *[h - lo + 1 for lo, h in zip(low, high)]),
                          w.dtype)
        for combination in itertools.product(*chosen):
            at = tuple(d - lo for (d, _), lo in zip(combination, low))
            weight[(slice(None), slice(None), *at)] = conv_taps(
                w[(slice(None), slice(None), *[t for _, t in combination])])
        ends = [high[a] if out_size is None else steps[a] - 1 + high[a] - (in_size[a] - 1)
                for a in range(rank)]
        phases.append((weight, [*(-lo for lo in low), *ends]))
    # one conv for every phase where they read the same offsets (2-D: DepthToSpace's
    # channel order; 1-D phases are stacked on a new axis, so one conv each)
    merged = rank == 2 and groups == 1 and all(
        p[1] == phases[0][1] and p[0].shape == phases[0][0].shape for p in phases)
    nodes, outputs = [], []
    convs = [("all", phases)] if merged else [(f"{i}", [p]) for i, p in enumerate(phases)]
    for label, together in convs:
        weight = np.concatenate([p[0] for p in together])
        name = f"{prefix}{label}"
        graph.initializer.append(numpy_helper.from_array(weight, f"{name}_weight"))
        graph.initializer.append(numpy_helper.from_array(
            np.tile(bias, len(together)).astype(w.dtype), f"{name}_bias"))
        nodes.append(helper.make_node(
            "Conv", [node.input[0], f"{name}_weight", f"{name}_bias"], [f"{name}_out"],
            name=f"{name}_conv", kernel_shape=list(weight.shape[2:]), pads=together[0][1],
            group=groups))
        outputs.append(f"{name}_out")
        if activation is not None:
            nodes.append(helper.make_node(
                activation.op_type, [f"{name}_out", *activation.input[1:]],
                [f"{name}_act"], name=f"{name}_{activation.op_type.lower()}"))
            nodes[-1].attribute.extend(activation.attribute)
            outputs[-1] = f"{name}_act"
    cropped = out_size is not None and [s * stride for s in steps] != list(out_size)
    output = output or node.output[0]
    spread = f"{prefix}s_spread" if cropped else output
    if rank == 1:  # [N, C, M] each -> [N, C, M, s] -> [N, C, M * s]
        nodes += _interleaved(graph, outputs, spread, prefix, cout, steps[0])
        nodes[-1].name = node.name
    else:
        stacked = outputs[0]
        if len(outputs) > 1:
            stacked = f"{prefix}s_stacked"
            nodes.append(helper.make_node("Concat", outputs, [stacked],
                                          name=f"{prefix}s_concat", axis=1))
        mode = {"mode": "DCR"} if opset >= 11 else {}  # DCR, the only mode before opset 11
        nodes.append(helper.make_node("DepthToSpace", [stacked], [spread], name=node.name,
                                      blocksize=stride, **mode))
    if cropped:
        crop = {"starts": [0] * rank, "ends": list(out_size), "axes": list(range(2, 2 + rank))}
        if opset < 10:  # Slice-1 takes them as attributes
            nodes.append(helper.make_node("Slice", [spread], [output],
                                          name=f"{prefix}s_crop", **crop))
            return nodes
        names = [f"{prefix}s_crop_{key}" for key in crop]
        graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), n)
                                 for n, v in zip(names, crop.values()))
        nodes.append(helper.make_node("Slice", [spread, *names], [output],
                                      name=f"{prefix}s_crop"))
    return nodes


def _interleaved(graph: onnx.GraphProto, phases: list[str], output: str, prefix: str,
                 channels: int, steps: int) -> list[onnx.NodeProto]:
    """1-D phases [N, C, M] interleaved into `output` [N, C, M * s]: concatenated on the
    channels [N, s * C, M], split [N, s, C, M], moved to [N, C, M, s] and the last two axes
    merged. Channel-last that is [N, M, s * C] = [N, M, s, C] = [N, M * s, C]: no data
    moves (the layout plan sees the reshapes as splits and merges of adjacent axes)."""
    nodes, stacked = [], f"{prefix}s_stacked"
    nodes.append(helper.make_node("Concat", phases, [stacked], name=f"{prefix}s_concat",
                                  axis=1))
    shapes = {"split": [0, len(phases), channels, steps],
              "merged": [0, channels, steps * len(phases)]}
    for key, value in shapes.items():
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64),
                                                         f"{prefix}s_{key}_shape"))
    nodes.append(helper.make_node("Reshape", [stacked, f"{prefix}s_split_shape"],
                                  [f"{prefix}s_split"], name=f"{prefix}s_split"))
    nodes.append(helper.make_node("Transpose", [f"{prefix}s_split"], [f"{prefix}s_moved"],
                                  name=f"{prefix}s_move", perm=[0, 2, 3, 1]))
    nodes.append(helper.make_node("Reshape", [f"{prefix}s_moved", f"{prefix}s_merged_shape"],
                                  [output]))
    return nodes
