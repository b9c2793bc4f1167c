"""Integer inputs and outputs of a quantized file (the full-integer files): its signature
takes and gives codes on the integer grid instead of float values."""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from onnx2tf_alt.quant.grids import TT, Grid
from onnx2tf_alt.tflite.flatbuffer import opcode_index


def integer_io(model, input_type: int, output_type: int) -> None:
    """A quantized model's signature inputs and outputs on the integer grid (an
    integer-only file): a float input that only QUANTIZE ops read becomes their int8 (or
    int16) output, or holds uint8 codes they move to int8; a float output a DEQUANTIZE
    writes becomes the integer tensor it reads, or a QUANTIZE's uint8 copy of it. Each
    keeps the signature's name. Inputs and outputs of ops kept float stay float."""
    graph = model.subgraphs[0]
    ops = graph.operators
    readers: dict[int, list] = {}
    for op in ops:
        for i in op.inputs:
            readers.setdefault(int(i), []).append(op)
    quantize = schema.BuiltinOperator.QUANTIZE
    dequantize = schema.BuiltinOperator.DEQUANTIZE
    dropped, inputs = set(), {}
    for index in [int(i) for i in graph.inputs]:
        t = graph.tensors[index]
        users = readers.get(index, [])
        if t.type != TT.FLOAT32 or not users or any(_builtin(model, op) != quantize
                                                    for op in users):
            continue
        target = graph.tensors[int(users[0].outputs[0])]
        if input_type == TT.UINT8 and target.type == TT.INT8:
            grid = _grid_of(target)
            t.type, t.quantization = TT.UINT8, grid.retyped(TT.UINT8).params()
            continue
        if len(users) > 1 or target.type != input_type:
            continue
        dropped.add(id(users[0]))
        inputs[index] = int(users[0].outputs[0])
        t.name, target.name = t.name + b"/float32", t.name
    outputs = {}
    writer = {int(o): op for op in ops for o in op.outputs}
    for index in [int(i) for i in graph.outputs]:
        op = writer.get(index)
        if op is None or _builtin(model, op) != dequantize:
            continue
        source = int(op.inputs[0])
        t, code = graph.tensors[index], graph.tensors[source]
        if output_type == TT.UINT8 and code.type == TT.INT8:
            op.opcodeIndex = opcode_index(model, quantize, 2)
            t.type, t.quantization = TT.UINT8, _grid_of(code).retyped(TT.UINT8).params()
        elif code.type == output_type and len(readers.get(index, [])) == 0:
            dropped.add(id(op))
            outputs[index] = source
            t.name, code.name = t.name + b"/float32", t.name
    graph.operators = [op for op in ops if id(op) not in dropped]
    graph.inputs = [inputs.get(int(i), int(i)) for i in graph.inputs]
    graph.outputs = [outputs.get(int(i), int(i)) for i in graph.outputs]
    renumber_signature(model, inputs, outputs=False)
    renumber_signature(model, outputs, outputs=True)


def renumber_signature(model, moved: dict[int, int], outputs: bool) -> None:
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for entry in signature.outputs if outputs else signature.inputs:
                entry.tensorIndex = moved.get(int(entry.tensorIndex), int(entry.tensorIndex))


def _builtin(model, op) -> int:
    code = model.operatorCodes[op.opcodeIndex]
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _grid_of(tensor) -> Grid:
    q = tensor.quantization
    return Grid(float(q.scale[0]), int(q.zeroPoint[0]), tensor.type)
