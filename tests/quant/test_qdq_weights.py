"""Which QDQ models have per-tensor weights (quant/qdq_weights.py); the INT8 files that keep
them are checked against onnxruntime in test_quantize.py."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.quant.qdq_weights import on_per_tensor_grid, weights_per_tensor


def test_grid():
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (8, 4, 3, 3))
    q.flat[0] = 127
    assert on_per_tensor_grid((q * np.float32(0.013)).astype(np.float32))
    per_channel = q * rng.uniform(0.01, 0.02, (8, 1, 1, 1))
    assert not on_per_tensor_grid(per_channel.astype(np.float32))
    assert not on_per_tensor_grid(rng.standard_normal((8, 4)).astype(np.float32))
    assert not on_per_tensor_grid(np.zeros((4, 4), np.float32))


def conv_model(scale, zero_point, dequantized=True):
    """x -> Conv(w) with w a DequantizeLinear of int8 constants (or float constants)."""
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    q[:, 0, 0, 0] = 127  # symmetric: each channel reaches the top of the range
    scale = np.asarray(scale, np.float32)
    inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scale, "s"),
             numpy_helper.from_array(np.asarray(zero_point, np.int8), "zp")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    if dequantized:
        axis = {} if scale.size == 1 else {"axis": 0}
        nodes.insert(0, helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["w"], **axis))
    else:
        inits = [numpy_helper.from_array((q * scale.reshape(-1, 1, 1, 1)).astype(np.float32),
                                         "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("scale, zero_point, dequantized, expected", [
    (0.02, 0, True, True),
    ([0.01, 0.02, 0.03, 0.04], [0, 0, 0, 0], True, False),  # per channel
    (0.02, 3, True, False),  # asymmetric: no TFLite int8 filter holds it
    (0.02, 0, False, True),  # folded already: the float grid tells
    ([0.01, 0.02, 0.03, 0.04], [0, 0, 0, 0], False, False),
])
def test_weights_per_tensor(scale, zero_point, dequantized, expected):
    assert weights_per_tensor(conv_model(scale, zero_point, dequantized)) is expected
