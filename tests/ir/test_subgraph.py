"""-inimc / -onimc: only the part of the graph between the named tensors is converted; it
computes what onnxruntime computes on the same part (extracted with onnx's Extractor)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.utils import Extractor

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.passes.prepare import prepare_model

from harness import assert_close, convert, make_model, ort_run, tf_run, tflite_run

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 7, 9)).astype(np.float32)
BIAS = RNG.standard_normal((2, 4, 7, 9)).astype(np.float32)


def chain() -> onnx.ModelProto:
    """x -> Conv (c1) -> Relu (r1) -> Conv (c2) -> + bias (s) -> Sigmoid (y), and a skip
    output skip = c1 * s."""
    rng = np.random.default_rng(1)
    init = {
        "w1": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
        "w2": (rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "bias"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["y"]),
        helper.make_node("Mul", ["c1", "s"], ["skip"]),
    ]
    return make_model(nodes, {"x": X, "bias": BIAS}, ["y", "skip"], init)


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return chain()


@pytest.fixture(scope="module")
def values(model) -> dict[str, np.ndarray]:
    """Every tensor of the full model, from onnxruntime: the inputs of the parts."""
    names = ["c1", "r1", "c2", "s", "y", "skip"]
    full = onnx.ModelProto()
    full.CopyFrom(model)
    full.graph.output.extend(
        v for v in onnx.shape_inference.infer_shapes(model).graph.value_info if v.name in names)
    outputs = ort_run(full, {"x": X, "bias": BIAS})
    return {"x": X, "bias": BIAS, **dict(zip([o.name for o in full.graph.output], outputs))}


@pytest.mark.parametrize(
    "inputs, outputs, expect_inputs",
    [
        (None, ["r1"], ["x"]),  # -onimc only: from the model's inputs
        (["r1"], ["y"], ["r1", "bias"]),  # the graph input the part still reads stays one
        (["c1"], ["c2"], ["c1"]),
        (["r1", "c1"], None, ["r1", "c1", "bias"]),  # -inimc only: to the model's outputs
        (["r1"], ["skip"], ["r1", "x", "bias"]),  # skip also needs c1, computed from x
    ],
)
def test_part_matches_onnxruntime(model, values, inputs, outputs, expect_inputs):
    converted = convert(model, input_names_to_interrupt_model_conversion=inputs,
                        output_names_to_interrupt_model_conversion=outputs)
    assert converted.graph.inputs == expect_inputs
    outputs = outputs or ["y", "skip"]
    assert converted.graph.outputs == outputs
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    part = Extractor(prepare_model(prepared)).extract_model(expect_inputs, outputs)
    feeds = {n: values[n] for n in expect_inputs}
    expected = ort_run(part, feeds)
    for name, e in zip(outputs, expected):
        assert_close(values[name], e, 1e-5, f"extracted {name}")  # the part is the model's
    for name, a, e in zip(outputs, tf_run(converted, feeds), expected):
        assert_close(a, e, 1e-4, f"TF {name}")
    for name, a, e in zip(outputs, tflite_run(converted, feeds), expected):
        assert_close(a, e, 1e-4, f"TFLite {name}")


@pytest.mark.parametrize(
    "inputs, outputs, message",
    [
        (["nope"], None, "-inimc names tensor(s) ['nope']"),
        (None, ["r1", "missing"], "-onimc names tensor(s) ['missing']"),
        (["r1"], ["c1"], "-inimc names ['r1'], which the outputs ['c1'] do not depend on"),
    ],
)
def test_bad_names_are_input_errors(model, inputs, outputs, message):
    with pytest.raises(InputError) as error:
        convert(model, input_names_to_interrupt_model_conversion=inputs,
                output_names_to_interrupt_model_conversion=outputs)
    assert message in str(error.value) and error.value.exit_code == 2
