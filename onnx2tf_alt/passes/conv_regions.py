"""Convolutions whose taps read mostly padding, computed region by region.

After conv_taps.py every tap of a convolution reads the map for some output, but a dilation
as large as the map still leaves most products with padding: DeepLabV3's ASPP branch of
dilation 12 on a 14x14 map (224 input) reads the map with 1.65 of its 9 taps per output on
average, yet a CONV_2D multiplies all nine everywhere (8.1 of the model's 23.5 ms at 1
thread). Along each spatial axis the outputs fall into runs that read the map with the same
taps (dilation 12, pads 12, 14 positions: outputs 0-1 taps 1-2, outputs 2-11 tap 1, outputs
12-13 taps 0-1). Each product of runs is a region of the output: a convolution without
padding of the input window those outputs read, with those taps only. Concats put the
regions back in place; every dropped product was a product with padding, so each output is
the same sum less its zero terms.

Done where the regions compute at most `KEEP` of the products the convolution computes, save
at least `MIN_SAVED` multiply-adds (each region adds a SLICE and a CONV_2D, a few
microseconds) and number at most `MAX_REGIONS`; with static spatial sizes, constant weights
and every output reading the map with some tap.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex
from onnx2tf_alt.ir.weights import to_array
from onnx2tf_alt.passes.conv_taps import conv_geometry, drop_unread_weights

KEEP = 0.75
MIN_SAVED = 2_000_000
MAX_REGIONS = 9


def split_padded_regions(model: onnx.ModelProto) -> int:
    """Compute every main-graph Conv whose products are mostly with padding as regions;
    returns how many convolutions were split."""
    index = GraphIndex(model.graph)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for position, node in enumerate(index.nodes):
        plan = _plan(node, index)
        if plan is None:
            continue
        # a Relu reading the convolution alone is applied to each region, where TFLite fuses
        # it into the CONV_2D (one RELU over the joined regions otherwise)
        relu = index.only_user(node.output[0])
        if relu is not None and (relu.op_type != "Relu" or relu.domain not in ("", "ai.onnx")):
            relu = None
        if relu is not None:
            dropped.add(index.consumers[node.output[0]][0])
        replaced[position] = _regions(node, relu, index, *plan)
    if replaced:
        weights = {index.nodes[p].input[1] for p in replaced}
        index.replace_nodes(replaced, dropped)
        drop_unread_weights(model.graph, index, weights)
    return len(replaced)


def _plan(node: onnx.NodeProto, index: GraphIndex):
    """(runs per axis, weights, strides, dilations, pads at the start of each axis) where
    `node` is worth splitting, else None. A run is (first output, end output, first tap,
    last tap)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    if node.input[1] not in index.initializers:
        return None
    shape = index.shape(node.input[0])
    spatial = (shape or [])[2:]
    if not spatial or not all(d is not None and d > 0 for d in spatial):
        return None
    weights = to_array(index.initializers[node.input[1]])
    if weights.ndim != len(spatial) + 2:
        return None
    rank, kernel = len(spatial), weights.shape[2:]
    geometry = conv_geometry(node, spatial, kernel)
    if geometry is None:
        return None
    strides, dilations, pads = geometry
    runs = [_runs(spatial[a], kernel[a], strides[a], dilations[a], pads[a], pads[a + rank])
            for a in range(rank)]
    if any(r is None for r in runs) or math.prod(len(r) for r in runs) > MAX_REGIONS:
        return None
    full = math.prod(r[-1][1] * k for r, k in zip(runs, kernel))
    kept = sum(math.prod((o1 - o0) * (a1 - a0 + 1) for o0, o1, a0, a1 in region)
               for region in itertools.product(*runs))
    per_product = (shape[0] or 1) * weights.shape[0] * weights.shape[1]
    if kept > KEEP * full or (full - kept) * per_product < MIN_SAVED:
        return None
    return runs, weights, strides, dilations, pads[:rank]


def _runs(size: int, k: int, s: int, d: int, pad_begin: int, pad_end: int):
    """Maximal runs of outputs that read the map with the same taps along one axis, or None
    where an output reads padding only."""
    count = (size + pad_begin + pad_end - d * (k - 1) - 1) // s + 1
    if count <= 0:
        return None
    runs: list[list[int]] = []
    for o in range(count):
        first = o * s - pad_begin  # what tap 0 reads
        a0 = max(0, -(first // d))  # the first tap at or past index 0
        a1 = min(k - 1, (size - 1 - first) // d)
        if a0 > a1:
            return None
        if runs and runs[-1][2:] == [a0, a1]:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1, a0, a1])
    return [tuple(r) for r in runs]


def _regions(node: onnx.NodeProto, relu: onnx.NodeProto | None, index: GraphIndex,
             runs: list, weights: np.ndarray, strides: list[int], dilations: list[int],
             pads: list[int]) -> list[onnx.NodeProto]:
    """The nodes computing `node` (and `relu` after it) region by region: a Slice of the
    window a region reads, its Conv (and Relu), and the Concats that place the regions, the
    last writing `node`'s output (or `relu`'s)."""
    rank = len(runs)
    base = node.name or node.output[0]
    group = [a for a in node.attribute if a.name == "group"]
    sizes = index.shape(node.input[0])[2:]
    nodes: list[onnx.NodeProto] = []
    outputs: dict[tuple, str] = {}
    for cell in itertools.product(*(range(len(r)) for r in runs)):
        region = [runs[a][i] for a, i in enumerate(cell)]
        tag = "_".join(map(str, cell))
        starts = [o0 * s - pb + a0 * d
                  for (o0, _, a0, _), s, d, pb in zip(region, strides, dilations, pads)]
        ends = [(o1 - 1) * s - pb + a1 * d + 1
                for (_, o1, _, a1), s, d, pb in zip(region, strides, dilations, pads)]
        window = node.input[0]
        if starts != [0] * rank or ends != list(sizes):
            window = index.unique(f"{base}/region_{tag}/window")
            nodes.append(helper.make_node(
                "Slice", [node.input[0],
                          index.add_constant(f"{base}/region_{tag}/starts", np.array(starts)),
                          index.add_constant(f"{base}/region_{tag}/ends", np.array(ends)),
                          index.add_constant(f"{base}/region_{tag}/axes",
                                             np.arange(2, 2 + rank))],
                [window], name=f"{base}/region_{tag}/Slice"))
        taps = (slice(None), slice(None), *(slice(a0, a1 + 1) for _, _, a0, a1 in region))
        kernel = index.add_constant(f"{node.input[1]}_region_{tag}",
                                    np.ascontiguousarray(weights[taps]))
        out = index.unique(f"{base}/region_{tag}")
        nodes.append(helper.make_node(
            "Conv", [window, kernel, *node.input[2:]], [out], name=f"{base}/region_{tag}",
            kernel_shape=[a1 - a0 + 1 for _, _, a0, a1 in region], strides=strides,
            dilations=[d if a1 > a0 else 1 for (_, _, a0, a1), d in zip(region, dilations)],
            pads=[0] * 2 * rank))
        nodes[-1].attribute.extend(group)
        if relu is not None:
            nodes.append(helper.make_node("Relu", [out], [index.unique(f"{out}/relu")],
                                          name=f"{base}/region_{tag}/Relu"))
            out = nodes[-1].output[0]
        outputs[cell] = out
    placed, top = _placed(outputs, runs, base, index)
    nodes.extend(placed)
    producer = next(n for n in nodes if top in n.output)
    producer.output[:] = [(relu or node).output[0]]  # the regions joined
    if relu is not None and relu.name and producer.op_type == "Concat":
        producer.name = relu.name  # still found by its name (--keep_float)
    return nodes


def _placed(outputs: dict[tuple, str], runs: list, base: str,
            index: GraphIndex) -> tuple[list[onnx.NodeProto], str]:
    """Concats joining the regions along the last axis first, then outwards, and the name
    of the whole (the outermost Concat's output, or the one region's)."""
    nodes: list[onnx.NodeProto] = []

    def join(prefix: tuple) -> str:
        axis = len(prefix)
        if axis == len(runs):
            return outputs[prefix]
        parts = [join(prefix + (i,)) for i in range(len(runs[axis]))]
        if len(parts) == 1:
            return parts[0]
        tag = "_".join(map(str, prefix))
        name = index.unique(f"{base}/regions_{axis}_{tag}")
        nodes.append(helper.make_node("Concat", parts, [name], axis=2 + axis,
                                      name=f"{base}/regions_{axis}_{tag}"))
        return name

    return nodes, join(())
