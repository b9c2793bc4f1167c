"""The float32 .tflite converted from the written saved_model (lowering.tflite_bytes with
`saved_model`) is the one converted from the traced serving function: same ops, same
outputs bit for bit; and a saved_model the converter cannot read falls back to the trace."""

from __future__ import annotations

from collections import Counter

import numpy as np

from harness import convert, tflite_run
from models import tiny_cnn


def _census(content: bytes) -> Counter:
    from ai_edge_litert.interpreter import Interpreter

    return Counter(op["op_name"] for op in Interpreter(model_content=content)._get_ops_details())


def test_saved_model_and_traced_function_give_the_same_file(tmp_path):
    from onnx2tf_alt.export.saved_model import save_saved_model
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    model, feeds = tiny_cnn()
    converted = convert(model)
    save_saved_model(converted.result, str(tmp_path / "sm"))
    traced = tflite_bytes(converted.result)
    from_saved = tflite_bytes(converted.result, saved_model=str(tmp_path / "sm"))
    unreadable = tflite_bytes(converted.result, saved_model=str(tmp_path / "missing"))
    assert _census(from_saved) == _census(traced) == _census(unreadable)
    want = tflite_run(converted, feeds, traced)
    for content in (from_saved, unreadable):
        for got, ref in zip(tflite_run(converted, feeds, content), want):
            np.testing.assert_array_equal(got, ref)
