"""Small ONNX models shared by the end-to-end tests, built with onnx.helper."""

from __future__ import annotations

import numpy as np
from onnx import helper

from harness import make_model


def tiny_cnn(batch="N", seed: int = 0):
    """Conv -> Relu -> Conv(stride 2) -> Add(residual-free) -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal((8,)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal((16,)).astype(np.float32) * 0.1,
        "fc_w": rng.standard_normal((10, 16)).astype(np.float32) * 0.3,
        "fc_b": rng.standard_normal((10,)).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
    ]
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    model = make_model(
        nodes, {"input": x}, ["logits"], inits, opset=17, input_shapes={"input": [batch, 3, 16, 16]}
    )
    return model, {"input": x}


def custom_op_model():
    """Two nodes of an unknown custom domain between standard ops."""
    x = np.ones((1, 4), np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("FancyOp", ["a"], ["b"], domain="com.example", name="fancy_1"),
        helper.make_node("OtherOp", ["b"], ["y"], domain="com.example", name="other_2"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", 1, [1, 4])],
        [helper.make_tensor_value_info("y", 1, [1, 4])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    ), {"x": x}
