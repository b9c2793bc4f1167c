"""A QDQ model's own grids, as the own quantizer (quant/integer.py) takes them.

The INT8 export rewrites each QuantizeLinear -> DequantizeLinear pair into a FakeQuantize
node (quant/quantize.fake_quant_model), which the direct writer writes as FAKE_QUANT with
the pair's grid on its output tensor (ops/quant.py). `take_grids` removes each FAKE_QUANT:
the tensor it reads takes the grid (scale and zero point exactly, on int8 codes) and its
readers read that tensor. A tensor the writer adds between two nodes by moving one value
(a convolution's explicit PAD, a RESHAPE, a max pool) takes the grid of the value it
moves, or of the value it becomes (a 1-D convolution's 2-D result reshaped back): the
integer kernels keep it. The quantizer then puts the op that writes the tensor on the
model's own grid, as onnxruntime's integer kernels do (a QLinearConv requantizes onto the
QuantizeLinear's grid after it), with no calibration.

onnxruntime's calibrators' ranges (--calibration_method ort_*, entropy) come the same way
(calibration/ort.fake_quantized), their values renamed back to their ONNX names.

A FAKE_QUANT stays (and computes in float) where the tensor it reads is a constant or has
another grid of its own already (two pairs with different grids on one value, where the
layout plan dropped a Transpose or a Reshape between them); a second pair with the same
grid goes."""

from __future__ import annotations

from calibration.ort import FLOAT_SUFFIX
from onnx2tf_alt.quant.grids import TT, given_grid
from onnx2tf_alt.quant.integer import drop_unused
from onnx2tf_alt.quant.op_rules import RULES, SAME
from onnx2tf_alt.tflite.flatbuffer import (
    builtin_codes,
    op_name,
    pack_model,
    read_model,
    schema,
    unpack_model,
)


def take_grids(content: bytes) -> tuple[bytes, int]:
    """(the file without its FAKE_QUANT ops, each one's grid on the tensor it read; how
    many were taken) (module docstring). A file without FAKE_QUANT is not unpacked."""
    if not _has_fake_quant(content):
        return content, 0
    model = unpack_model(content)
    graph = model.subgraphs[0]
    replaced: dict[int, int] = {}  # FAKE_QUANT output -> the tensor it read
    kept = []
    for op in graph.operators:
        op.inputs = [replaced.get(int(i), int(i)) if i >= 0 else i for i in op.inputs]
        if op_name(model, op) != "FAKE_QUANT" or not _takes(model, graph, op):
            kept.append(op)
            continue
        source, out = int(op.inputs[0]), int(op.outputs[0])
        graph.tensors[source].quantization = graph.tensors[out].quantization
        graph.tensors[source].name = _plain(graph.tensors[source].name)
        replaced[out] = source
    if not replaced:
        return content, 0
    graph.operators = kept
    graph.outputs = [int(i) for i in graph.outputs]
    for position, index in enumerate(graph.outputs):
        source = replaced.get(int(index))
        if source is not None:  # the output keeps its name
            graph.tensors[source].name = graph.tensors[int(index)].name
            graph.outputs[position] = source
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for entry in signature.outputs:
                entry.tensorIndex = replaced.get(int(entry.tensorIndex), entry.tensorIndex)
    _moved_grids(model, graph)
    drop_unused(model)
    return pack_model(model, len(content) + (1 << 16)), len(replaced)


def _has_fake_quant(content: bytes) -> bool:
    return schema.BuiltinOperator.FAKE_QUANT in builtin_codes(read_model(content))


def _plain(name: bytes) -> bytes:
    """A value's name without calibration/ort.py's suffix of the value before its
    FakeQuantize (in each ';'-joined part of a fused op's name): its ONNX name."""
    suffix = FLOAT_SUFFIX.encode()
    return b";".join(p.removesuffix(suffix) for p in name.split(b";"))


def _moved_grids(model, graph) -> None:
    """Grids across the ops that move one value input (op_rules: SAME over one value):
    their outputs without a grid take the input's, in graph order; then, backwards, an
    input without a grid that such an op alone reads takes its output's (a 1-D
    convolution's result RESHAPEd back to 3-D before its pair)."""
    moves = []
    for op in graph.operators:
        rule = RULES.get(op_name(model, op))
        if rule is None or rule.output != SAME or rule.values is None or len(rule.values) != 1:
            continue
        position = rule.values[0]
        if position < len(op.inputs) and op.inputs[position] >= 0:
            moves.append((int(op.inputs[position]), [int(o) for o in op.outputs]))
    for source, outputs in moves:
        if given_grid(graph.tensors[source]) is None:
            continue
        for out in outputs:
            tensor = graph.tensors[out]
            if tensor.type == TT.FLOAT32 and tensor.quantization is None:
                tensor.quantization = graph.tensors[source].quantization
    readers: dict[int, int] = {}
    for op in graph.operators:
        for i in op.inputs:
            readers[int(i)] = readers.get(int(i), 0) + 1
    for source, outputs in reversed(moves):
        tensor = graph.tensors[source]
        if (len(outputs) != 1 or readers.get(source) != 1 or tensor.type != TT.FLOAT32
                or tensor.quantization is not None or source in graph.inputs
                or _constant(model, tensor)):
            continue
        if given_grid(graph.tensors[outputs[0]]) is not None:
            tensor.quantization = graph.tensors[outputs[0]].quantization


def _takes(model, graph, op) -> bool:
    """Whether FAKE_QUANT `op` goes, its grid onto the float value it reads (module
    docstring)."""
    source = graph.tensors[int(op.inputs[0])]
    grid = given_grid(graph.tensors[int(op.outputs[0])])
    if source.type != TT.FLOAT32 or given_grid(source) not in (None, grid):
        return False  # two pairs on one value (the layout plan dropped a Transpose)
    if _constant(model, source):
        return False
    if int(op.inputs[0]) in graph.inputs and int(op.outputs[0]) in graph.outputs:
        return False  # a graph input read straight to an output keeps both names
    return grid is not None


def _constant(model, tensor) -> bool:
    data = model.buffers[tensor.buffer].data
    return data is not None and len(data) > 0
