"""onnx2tf_alt/tflite/run.py: a .tflite's signature run with empty outputs (a detector that
finds nothing), which the interpreter's Python runner refuses to read."""

import numpy as np
from onnx import helper

from harness import convert, make_model, ort_run


def _nonzero_model():
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             helper.make_node("Transpose", ["where"], ["y"], perm=[1, 0])]
    return make_model(nodes, {"x": np.ones((5,), np.float32)}, ["y"],
                      {"zero": np.array(0.0, np.float32)}, opset=13)


def test_empty_and_non_empty_outputs():
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.lowering import tflite_bytes
    from onnx2tf_alt.tflite.run import run_signature, signature_call

    model = _nonzero_model()
    converted = convert(model)
    content = tflite_bytes(converted.tflite_result())
    for x in (np.array([1, -1, 2, 0, 3], np.float32), np.zeros(5, np.float32)):
        expected = ort_run(model, {"x": x})[0]
        physical = converted.result.to_physical({"x": x})
        key = converted.result.output_names["y"]
        for run in (lambda i, p=physical: run_signature(i, p),
                    lambda i, p=physical: signature_call(i, p)()):
            got = run(Interpreter(model_content=content))[key]
            assert got.shape == expected.shape and np.array_equal(got, expected), (got, expected)
