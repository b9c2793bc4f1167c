"""Det against onnxruntime, through TF and the float32 TFLite (builtins only).

Sizes up to 4 use cofactor expansion, larger ones elimination with partial pivoting; the
cases include singular matrices and ones whose leading entries are zero (forcing swaps).
"""

import numpy as np
import pytest
from onnx import helper

from harness import (
    assert_builtin,
    assert_keras_reloads,
    check_model,
    check_nodes,
    convert,
    count_tflite_ops,
    make_model,
)

rng = np.random.default_rng(0)
F32 = np.float32


def matrices(*shape):
    """Random matrices; the second one singular, the third one needing row swaps."""
    a = rng.standard_normal(shape).astype(F32)
    flat = a.reshape(-1, shape[-1], shape[-1])
    n = shape[-1]
    if len(flat) > 1 and n > 1:
        flat[1, -1] = flat[1, 0] * 2 - flat[1, 1] if n > 2 else flat[1, 0] * 2
    if len(flat) > 2:
        flat[2, :, 0] = 0
        flat[2, n // 2, 0] = 3
    return a


def test_det_sizes():
    """Every size from 1 to 6 in one model, batch 3 (one singular, one pivoting case)."""
    inputs = {f"x{n}": matrices(3, n, n) for n in range(1, 7)}
    nodes = [helper.make_node("Det", [f"x{n}"], [f"det{n}"]) for n in range(1, 7)]
    _, counts = check_nodes(nodes, inputs, opset=11)
    assert_builtin(counts)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3, 3), (2, 3, 5, 5)])
def test_det_batch_dims(shape):
    x = matrices(*shape)
    _, counts = check_nodes([helper.make_node("Det", ["x"], ["y"])], {"x": x}, opset=22)
    assert_builtin(counts)


def test_det_dynamic_batch():
    x = matrices(3, 5, 5)
    model = make_model([helper.make_node("Det", ["x"], ["y"])], {"x": x}, ["y"], opset=11,
                       input_shapes={"x": ["N", 5, 5]})
    converted = check_model(model, {"x": x})
    assert_builtin(count_tflite_ops(converted.tflite))


def test_keras_files_reload(tmp_path):
    """Both Det forms (cofactors, elimination) survive a .h5 and a .keras reload."""
    feeds = {"a": matrices(3, 3, 3), "b": matrices(3, 5, 5)}
    nodes = [helper.make_node("Det", ["a"], ["da"]), helper.make_node("Det", ["b"], ["db"])]
    converted = convert(make_model(nodes, feeds, ["da", "db"], opset=11))
    assert_keras_reloads(converted, feeds, tmp_path)
