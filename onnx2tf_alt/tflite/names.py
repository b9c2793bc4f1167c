"""-coion: the ONNX input and output names inside a .tflite, by editing its flatbuffer.

TF's converter names a .tflite's input tensors `serving_default_<key>:0` and its outputs
`StatefulPartitionedCall:<i>`, with signature keys made TF-safe (io_layout.keras_name) and
the outputs in the alphabetical order of those keys. Here the signature keys and the I/O
tensor names become the ONNX names and the subgraph's inputs and outputs follow the ONNX
order, through the schema's object API (flatbuffer.py); no op, buffer or quantization parameter changes.
"""

from __future__ import annotations

from onnx2tf_alt.ir.graph import Graph
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, pack_model, unpack_model
from onnx2tf_alt.translate.builder import BuildResult
from onnx2tf_alt.translate.io_layout import tflite_keys


def rename_io(content: bytes, inputs: dict[str, str], outputs: dict[str, str]) -> bytes:
    """`content` with the `serving_default` signature's inputs and outputs renamed
    ({current key: new name}; keys not listed keep their name) and ordered as the dicts
    are: signature keys, tensor names, and the subgraph's input and output lists."""
    model = unpack_model(content)
    signature = next(s for s in model.signatureDefs if s.signatureKey.decode() == SIGNATURE)
    subgraph = model.subgraphs[signature.subgraphIndex]
    for maps, names, attr in ((signature.inputs, inputs, "inputs"),
                              (signature.outputs, outputs, "outputs")):
        order = {key: i for i, key in enumerate(names)}
        maps.sort(key=lambda m: order.get(m.name.decode(), len(order)))
        for tensor_map in maps:
            new = names.get(tensor_map.name.decode(), tensor_map.name.decode()).encode()
            tensor_map.name = new
            subgraph.tensors[tensor_map.tensorIndex].name = new
        setattr(subgraph, attr, [m.tensorIndex for m in maps])
    return pack_model(model, len(content) + 4096)


def copy_onnx_names(content: bytes, result: BuildResult, graph: Graph) -> bytes:
    """A .tflite converted from `result` with the ONNX names and order (see rename_io)."""
    old_in, old_out = tflite_keys(result, graph, onnx_names=False)
    new_in, new_out = tflite_keys(result, graph, onnx_names=True)
    return rename_io(content, {old_in[n]: new_in[n] for n in graph.inputs},
                     dict(zip(old_out, new_out)))


def copy_onnx_names_in_files(paths: list[str], result: BuildResult, graph: Graph) -> None:
    """copy_onnx_names on each .tflite file of `paths`, in place."""
    for path in paths:
        with open(path, "rb") as f:
            content = f.read()
        with open(path, "wb") as f:
            f.write(copy_onnx_names(content, result, graph))
