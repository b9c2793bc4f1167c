"""The model's weights as the rest of the converter sees them.

Shape inference and validation run on a weight-free copy of the model: ONNX's inference
serializes the whole model on every call, and a model past 2 GB cannot be serialized at all.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

# Initializers above this many elements are weights, never shape data: shape inference runs
# on a copy of the model that declares them as typed inputs instead of carrying their values
# (ONNX's inference serializes the whole model on every call).
INFERENCE_VALUE_LIMIT = 4096


def weight_free_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its large initializers turned into graph inputs of the same type."""
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, copy = model.graph, light.graph
    copy.name = graph.name
    copy.node.extend(graph.node)
    copy.input.extend(graph.input)
    copy.output.extend(graph.output)
    copy.value_info.extend(graph.value_info)
    copy.sparse_initializer.extend(graph.sparse_initializer)
    declared = {i.name for i in graph.input}
    for init in graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= INFERENCE_VALUE_LIMIT:
            copy.initializer.append(init)
        elif init.name not in declared:
            copy.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                            list(init.dims)))
    return light
