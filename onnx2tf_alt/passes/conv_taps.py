"""Kernel taps that never touch the input, cut from convolutions.

A dilated convolution on a small feature map can read only padding with most of its taps:
DeepLabV3's ASPP runs 3x3 convolutions with dilations 12, 24 and 36 on a 14x14 map (224
input), where every off-centre tap of the last two lands outside the map for every output.
Those taps multiply zeros, yet a 3x3 kernel costs nine times the 1x1 one that computes the
same values. Along each spatial axis this pass keeps only the run of taps that reads at least
one real element for some output, moves the padding with it, and shrinks the constant weights:

    output o, tap a reads x[o*s - pad_begin + a*d];  keeping taps a0..a1 means
    pad_begin' = pad_begin - a0*d  and  pad_end' = (O-1)*s + d*(k'-1) + 1 - H - pad_begin'

so the output length O is unchanged and every dropped product was a product with padding.
Applied only where both new pads stay non-negative (no cropping needed), with static spatial
sizes and constant weights. deeplabv3_mobilenet_v3_large at 224: the two outer ASPP branches
become 1x1 convolutions (13 ms each at 1 thread before).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex
from onnx2tf_alt.ir.weights import to_array


def cut_dead_taps(model: onnx.ModelProto) -> int:
    """Shrink every main-graph Conv whose kernel has taps that only ever read padding;
    return how many convolutions changed."""
    graph = model.graph
    index = GraphIndex(graph)
    replaced: set[str] = set()  # weights the cut ones replace
    changed = 0
    for node in graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.input) < 2 or node.input[1] not in index.initializers:
            continue
        spatial = (index.shape(node.input[0]) or [])[2:]
        if not spatial or not all(d is not None and d > 0 for d in spatial):
            continue
        weights = to_array(index.initializers[node.input[1]])
        if weights.ndim != len(spatial) + 2:
            continue
        plan = _kept_taps(node, spatial, weights.shape[2:])
        if plan is None:
            continue
        (begins, ends), pads, dilations = plan
        live = (slice(None), slice(None), *(slice(b, e) for b, e in zip(begins, ends)))
        name = f"{node.input[1]}_{node.name or node.output[0]}_live_taps"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weights[live]), name))
        replaced.add(node.input[1])
        node.input[1] = name
        _set_attributes(node, [e - b for b, e in zip(begins, ends)], pads, dilations)
        changed += 1
    if changed:
        index.reindex()
        drop_unread_weights(graph, index, replaced)
    return changed


def drop_unread_weights(graph: onnx.GraphProto, index: GraphIndex, names: set[str]) -> None:
    """Remove the initializers among `names` that no node reads any more (`index` current)."""
    stale = names - set(index.consumers) - {i.name for i in graph.input}
    kept = [i for i in graph.initializer if i.name not in stale]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _kept_taps(node, sizes: list[int], kernel: tuple[int, ...]):
    """((begins, ends), pads, dilations) of the live taps, or None if every tap is live or the
    cut cannot be expressed with non-negative pads."""
    geometry = conv_geometry(node, sizes, kernel)
    if geometry is None:
        return None
    strides, dilations, pads = geometry
    rank = len(sizes)
    begins, ends, new_begin, new_end = [], [], [], []
    for axis in range(rank):
        size, k, s, d = sizes[axis], kernel[axis], strides[axis], dilations[axis]
        pad_begin, pad_end = pads[axis], pads[axis + rank]
        count = (size + pad_begin + pad_end - d * (k - 1) - 1) // s + 1
        if count <= 0:
            return None
        first_read = np.arange(count) * s - pad_begin  # input index tap 0 reads, per output
        live = [bool(np.any((first_read + a * d >= 0) & (first_read + a * d < size)))
                for a in range(k)]
        if not any(live):
            return None  # the output is the bias alone; rare, left to the handler
        a0 = live.index(True)
        a1 = k - 1 - live[::-1].index(True)
        begin = pad_begin - a0 * d
        end = (count - 1) * s + d * (a1 - a0) + 1 - size - begin
        if begin < 0 or end < 0:
            return None
        begins.append(a0)
        ends.append(a1 + 1)
        new_begin.append(begin)
        new_end.append(end)
    if begins == [0] * rank and ends == list(kernel):
        return None
    dilations = [1 if e - b == 1 else d for b, e, d in zip(begins, ends, dilations)]
    return (begins, ends), new_begin + new_end, dilations


def conv_geometry(node, sizes: list[int], kernel: tuple[int, ...]):
    """(strides, dilations, explicit pads [begins..., ends...]) of a Conv node over spatial
    `sizes`, or None where its auto_pad cannot be made explicit."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = len(sizes)
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    pads = _explicit_pads(auto_pad, list(attrs.get("pads", [0] * 2 * rank)), sizes, kernel,
                          strides, dilations)
    return None if pads is None else (strides, dilations, pads)


def _explicit_pads(auto_pad, pads, sizes, kernel, strides, dilations) -> list[int] | None:
    rank = len(sizes)
    if auto_pad == "NOTSET":
        return pads
    if auto_pad == "VALID":
        return [0] * 2 * rank
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER") or any(d != 1 for d in dilations):
        return None  # onnxruntime refuses SAME with dilations: nothing to check a cut against
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


def _set_attributes(node, kernel: list[int], pads: list[int], dilations: list[int]) -> None:
    kept = [a for a in node.attribute
            if a.name not in ("kernel_shape", "pads", "dilations", "auto_pad")]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend([
        helper.make_attribute("kernel_shape", kernel),
        helper.make_attribute("pads", pads),
        helper.make_attribute("dilations", dilations),
    ])
