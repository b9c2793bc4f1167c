"""QuantizeLinear -> DequantizeLinear pairs of QDQ models as one float op.

onnxruntime's `quantize_static` (and quantization-aware training exports) put a pair on
every activation: Q rounds x to integers, DQ maps them back to float. Computed as written,
Q's integer output is a CAST to int8 and DQ's input a CAST back, and TFLite's CAST has no
XNNPACK kernel: ResNet-18 QDQ's float32 file ran 66 CASTs on the reference kernels, in 31
delegate partitions, at 4.7x onnxruntime's time. The pair is one float function,

    y = (clip(round(x / s) + zp, qmin, qmax) - zp) * s

which `QuantizeDequantize` (domain onnx2tf_alt, ops/quant.py) computes without the casts:
the same values bit for bit, since the integers it rounds to are exact in float32.

A pair is fused where every reader of Q's output is a DequantizeLinear with Q's scale,
zero point and axis, and Q's output is not a graph output; the fused node takes the first
DequantizeLinear's output name and the others' readers read it. Blocked quantization
(`block_size`) is left as it is. The INT8 export (quant/quantize.fake_quant_model) reads
the fused node as the pair it was.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex

DOMAIN = "onnx2tf_alt"  # the converter's own ops (ops/quant.py takes it from here)
FUSED = "QuantizeDequantize"
# the integer types of Q's output a pair is fused for (float8 and 4-bit ones are not)
_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
          onnx.TensorProto.UINT16}


def fuse_quant_pairs(model: onnx.ModelProto, kept: set[str] = frozenset()) -> int:
    """Replace each fusable Q -> DQ pair of the main graph by one QuantizeDequantize node;
    returns how many. Names in `kept` (read inside control-flow bodies) stay."""
    graph = model.graph
    index = GraphIndex(graph)
    fused: dict[int, list[onnx.NodeProto]] = {}  # position of the first DQ -> fused node
    dropped: set[int] = set()
    rename: dict[str, str] = {}
    for position, node in enumerate(index.nodes):
        readers = _pair_readers(node, index, kept)
        if readers is None:
            continue
        first = min(index.producer[r.output[0]] for r in readers)
        out = index.nodes[first].output[0]
        fused[first] = [helper.make_node(
            FUSED, list(node.input), [out], name=f"{node.name}/dequantized", domain=DOMAIN,
            axis=_axis(node), qtype=_qtype(node, index),
        )]
        dropped.add(position)
        dropped.update(index.producer[r.output[0]] for r in readers)
        rename.update((r.output[0], out) for r in readers if r.output[0] != out)
    if not fused:
        return 0
    index.replace_nodes(fused, dropped)
    for node in graph.node:
        for k, name in enumerate(node.input):
            node.input[k] = rename.get(name, name)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(fused)


def unfused_quant_pairs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each QuantizeDequantize node back as the QuantizeLinear ->
    DequantizeLinear pair it was, as onnxruntime runs it (the accuracy check's reference:
    onnxruntime has no QuantizeDequantize); `model` itself where it has none."""
    if not any(n.op_type == FUSED and n.domain == DOMAIN for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for node in copy.graph.node:
        if node.op_type != FUSED or node.domain != DOMAIN:
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = list(node.input) + [""] * (3 - len(node.input))
        if not inputs[2]:  # the pair's zero point: 0 of its integer type
            inputs[2] = f"{node.output[0]}/zero_point"
            copy.graph.initializer.append(helper.make_tensor(inputs[2], attrs["qtype"], [], [0]))
        codes = f"{node.output[0]}/quantized"
        nodes += [helper.make_node("QuantizeLinear", inputs, [codes], axis=attrs["axis"],
                                   name=f"{node.name}/quantize"),
                  helper.make_node("DequantizeLinear", [codes, *inputs[1:]], list(node.output),
                                   axis=attrs["axis"], name=node.name)]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def _pair_readers(node: onnx.NodeProto, index: GraphIndex,
                  kept: set[str]) -> list[onnx.NodeProto] | None:
    """The DequantizeLinear nodes that read `node`, a QuantizeLinear, and only them; None
    when the pair cannot be fused."""
    if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    if any(a.name not in ("axis", "output_dtype", "saturate") for a in node.attribute):
        return None  # block_size, precision: left to the two handlers
    out = node.output[0]
    if out in index.outputs or out in kept or _qtype(node, index) not in _TYPES:
        return None
    readers = index.consumer_nodes(out)
    if not readers:
        return None
    params = list(node.input[1:]) + [""] * (3 - len(node.input))
    for reader in readers:
        if reader.op_type != "DequantizeLinear" or reader.domain not in ("", "ai.onnx"):
            return None
        if reader.input[0] != out or len(reader.output) != 1:
            return None
        if list(reader.input[1:]) + [""] * (3 - len(reader.input)) != params:
            return None
        if _axis(reader) != _axis(node) or any(
                a.name not in ("axis",) for a in reader.attribute):
            return None
        if reader.output[0] in kept:
            return None
    return readers


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _qtype(node: onnx.NodeProto, index: GraphIndex) -> int:
    """Q's output type: its inferred type, else its zero point's, else uint8 (ONNX's
    default)."""
    info = index.info(node.output[0])
    if info is not None and info.type.tensor_type.elem_type:
        return info.type.tensor_type.elem_type
    if len(node.input) > 2 and node.input[2]:
        zp = index.info(node.input[2])
        if zp is not None and zp.type.tensor_type.elem_type:
            return zp.type.tensor_type.elem_type
    attr = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
    return attr or onnx.TensorProto.UINT8
