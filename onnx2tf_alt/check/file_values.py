"""The values under test read out of the .tflite files the direct writer and the own
quantizer write, without TF's converter (issue 48: it is a test oracle, not a product path).

- The float32 file (-cotof): the direct writer writes a probe of the same graph and plan
  whose signature also returns every value under test (`direct_probe`). Like the Keras
  probe it stands for, a value that is an output is not fused into the op after it, so
  every value is observed.
- A quantized file (-cotof with -oiqt): the shipped file itself, each value under test read
  from the tensor that carries its ONNX name, made an output of the signature
  (`exposed_file`) and dequantized. The writer names a fused op's result after every node
  it computes, the value it holds first ("a;b", as TF's converter names it); a value
  computed inside a fused op (a convolution's sum before its ReLU) has no tensor and is
  unobserved.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from onnx2tf_alt.check.observe import Target
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, pack_model, schema, unpack_model

FUSED = "computed inside a fused op of the file: no tensor holds it"
KEY = "onnx2tf_alt_value_{}"  # signature keys of the exposed values


def direct_probe(converted, found: list[Target]):
    """(a float32 .tflite of `converted`'s graph and plan, a direct conversion, by the
    direct writer with every non-constant target also an output, a Converted of it whose
    result maps ONNX names to its signature keys and perms); None where the writer does
    not cover the probe."""
    from onnx2tf_alt.tflite.direct import DirectResult, write_direct

    graph, plan = converted.graph, converted.plan
    extra = [t.onnx_name for t in found if t.const is None and t.onnx_name in plan.perms
             and t.onnx_name not in graph.outputs]
    probe_graph = dataclasses.replace(graph, outputs=[*graph.outputs, *dict.fromkeys(extra)])
    probe_plan = dataclasses.replace(plan, output_perms={
        **plan.output_perms, **{name: plan.perms[name] for name in extra}})
    result = write_direct(probe_graph, probe_plan, converted.options)
    if not isinstance(result, DirectResult) or not result.content:
        return None
    return result.content, dataclasses.replace(converted, result=result, _tflite_result=result)


def exposed_file(content: bytes, converted, found: list[Target]):
    """(the file `content`, written from `converted`'s plan, with every target it holds in a
    tensor of its own also an output of its signature, a Converted of it whose result maps
    those targets' ONNX names to their keys and perms): run it as any file
    (quant/quantize.run_tflite), its values dequantized."""
    model = unpack_model(content)
    graph = model.subgraphs[0]
    signature = next(s for s in model.signatureDefs if s.signatureKey.decode() == SIGNATURE)
    keys = {int(m.tensorIndex): m.name.decode() for m in signature.outputs}
    holders = _holders(graph)
    names, perms = {}, {}
    for k, target in enumerate(found):
        if target.const is not None:
            continue
        perm = converted.plan.perms.get(target.onnx_name, target.perm)
        shape = converted.graph.shapes.get(target.onnx_name)
        fitting = [i for i in holders.get(target.onnx_name, [])
                   if _fits(graph.tensors[i].shape, shape, perm)]
        if len(fitting) != 1:
            continue
        index = fitting[0]
        if index not in keys:
            keys[index] = KEY.format(k)
            graph.outputs = [*(int(o) for o in graph.outputs), index]
            tensor_map = schema.TensorMapT()
            tensor_map.name, tensor_map.tensorIndex = keys[index].encode(), index
            signature.outputs.append(tensor_map)
        names[target.onnx_name], perms[target.onnx_name] = keys[index], perm
    result = dataclasses.replace(converted.result, output_names=names, output_perms=perms)
    return pack_model(model), dataclasses.replace(converted, result=result,
                                                  _tflite_result=result)


def _holders(graph) -> dict[str, list[int]]:
    """{ONNX value name: the tensors an op writes (or the subgraph takes) whose value it
    is}: a tensor's name, or the first of a fused result's names (';'-joined, a name may
    hold ';' itself: every leading join counts)."""
    written = sorted({int(o) for op in graph.operators for o in op.outputs}
                     | {int(i) for i in graph.inputs})
    holders: dict[str, list[int]] = {}
    for index in written:
        parts = (graph.tensors[index].name or b"").decode(errors="replace").split(";")
        for end in range(1, len(parts) + 1):
            holders.setdefault(";".join(parts[:end]), []).append(index)
    return holders


def _fits(physical, shape, perm) -> bool:
    """Whether a tensor of `physical` shape can hold a value of ONNX `shape` in `perm`
    (dims unknown at conversion time match any)."""
    if shape is None or physical is None or len(physical) != len(shape):
        return False
    expected = P.physical_shape(shape, perm)
    return all(e is None or not isinstance(e, (int, np.integer)) or int(e) == int(d)
               for e, d in zip(expected, physical))
