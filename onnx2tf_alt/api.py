"""The public Python surface: `convert` (keyword names equal to the CLI's long flags),
`check`, `batch`, `custom_objects` and `deep_graphs`. The conversion itself is pipeline.py
(in memory) and conversion.py (files); this module only names what users call.
"""

from __future__ import annotations

from onnx2tf_alt.batching import batch
from onnx2tf_alt.check import check
from onnx2tf_alt.conversion import convert
from onnx2tf_alt.translate.recursion import deep_graphs


def custom_objects() -> dict:
    """The custom Keras layers converted models may contain, for tf_keras.models.load_model:

    `tf_keras.models.load_model("model.keras", custom_objects=onnx2tf_alt.custom_objects())`
    """
    from onnx2tf_alt import version

    version.require("onnx2tf_alt.custom_objects()")
    from onnx2tf_alt.ops.control import control_flow_layer
    from onnx2tf_alt.translate.keras_layers import ConstantWeights
    from onnx2tf_alt.translate.node_layer import NodeLayer

    return {"ConstantWeights": ConstantWeights, "ControlFlow": control_flow_layer(),
            "NodeLayer": NodeLayer}


__all__ = ["batch", "check", "convert", "custom_objects", "deep_graphs"]
