"""--builtin_only: a model whose .tflite needs Select TF (Flex) ops fails, naming the ONNX
nodes responsible; without it a warning names them. Every shipped handler lowers to
builtins, so the model here uses a test handler whose TF op (MatrixInverse) TFLite lacks."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import TensorProto, helper

from onnx2tf_alt.errors import ConversionError
from onnx2tf_alt.layout.policies import logical
from onnx2tf_alt.translate import registry

DOMAIN = "test.flex"


@pytest.fixture
def inverse_handler(monkeypatch):
    """`test.flex::Inverse` converted with tf.linalg.inv, for this test only."""
    registry.all_handlers()  # the shipped handlers are registered first
    handler = registry.Handler("Inverse", DOMAIN, 1, lambda ctx: tf.linalg.inv(ctx.x(0)),
                               logical, infer=lambda node, types: [types[0]])
    monkeypatch.setitem(registry._REGISTRY, (DOMAIN, "Inverse"), [handler])


def flex_model(inverse_is_output: bool = False) -> onnx.ModelProto:
    """x -> Inverse (node 'invert_me') -> Add -> y; or Inverse alone -> y."""
    nodes = [
        helper.make_node("Inverse", ["x"], ["inv"], name="invert_me", domain=DOMAIN),
        helper.make_node("Add", ["inv", "x"], ["y"], name="add"),
    ]
    if inverse_is_output:
        nodes = [helper.make_node("Inverse", ["x"], ["y"], name="invert_me", domain=DOMAIN)]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 3]) for n in "xy"]
    graph = helper.make_graph(nodes, "flex", info[:1], info[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("inverse_is_output", [False, True])
def test_builtin_only_fails_naming_the_node(inverse_handler, tmp_path, inverse_is_output):
    """Named from the op's Keras layer, or, for a model output (whose tensor TF names
    StatefulPartitionedCall:0), from the signature key."""
    from onnx2tf_alt.api import convert

    out = tmp_path / "out"
    with pytest.raises(ConversionError) as error:
        convert(onnx_graph=flex_model(inverse_is_output), output_folder_path=str(out),
                non_verbose=True, builtin_only=True)
    message = str(error.value)
    assert error.value.exit_code == 1
    assert "model_float32.tflite needs Select TF ops" in message, message
    assert "FlexMatrixInverse from node 'invert_me' (Inverse)" in message, message
    assert not out.exists()  # nothing is published


def test_without_builtin_only_a_warning_names_the_node(inverse_handler, tmp_path, caplog):
    from onnx2tf_alt.api import convert
    from onnx2tf_alt.export.tflite import flex_ops

    out = tmp_path / "out"
    logger = logging.getLogger("onnx2tf_alt")  # it does not propagate to the root logger
    logger.addHandler(caplog.handler)
    try:
        convert(onnx_graph=flex_model(), output_folder_path=str(out), verbosity="warn")
    finally:
        logger.removeHandler(caplog.handler)
    text = caplog.text
    assert "FlexMatrixInverse from node 'invert_me' (Inverse)" in text, text
    for suffix in ("float32", "float16"):
        content = (out / f"model_{suffix}.tflite").read_bytes()
        assert [op.code for op in flex_ops(content)] == ["FlexMatrixInverse"], suffix


def test_builtin_model_has_no_flex_ops():
    from onnx2tf_alt.export.tflite import flex_ops, flex_report
    from onnx2tf_alt.pipeline import build
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    converted = build(onnx_graph=helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 18)], ir_version=10))
    content = tflite_bytes(converted.tflite_result())
    assert flex_ops(content) == [] and flex_report(content, converted) == []
    assert np.asarray(content[4:8]).tobytes() == b"TFL3"
