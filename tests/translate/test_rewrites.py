"""Delegate-friendly lowerings chosen by the user: -rtpo OP... (pseudo operators) and -dgc
(grouped convolution split per group). Each is checked against onnxruntime through the TF
model and the float32 TFLite, and the TFLite op census shows the replacement happened."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.translate.options import ConversionOptions, pseudo_operators

from cli_runner import run_cli
from harness import check_nodes, count_tflite_ops, make_model, ort_run


def _rtpo(*names: str) -> ConversionOptions:
    return ConversionOptions(pseudo_operators=pseudo_operators(names))


def _x(shape, low=-6.0, high=6.0, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def test_rtpo_names_are_onnx2tf_names_in_any_case():
    assert pseudo_operators(["HardSwish", "LEAKYRELU", "power", "GeLU", "PReLU"]) == {
        "HardSwish", "LeakyRelu", "Pow", "Gelu", "PRelu"}
    # onnx2tf's names whose ops are builtins here already are accepted and change nothing
    assert pseudo_operators(["Erf", "Abs", "Neg", "GatherND", "MatMulInteger", "Atan"]) == set()
    with pytest.raises(InputError, match="unknown operator 'Sigmoid'.*hardswish"):
        pseudo_operators(["Sigmoid"])


def test_hardswish_without_hard_swish_op():
    x = _x((2, 3, 5, 7))
    _, census = check_nodes([helper.make_node("HardSwish", ["x"], ["y"])], {"x": x},
                            options=_rtpo("hardswish"))
    assert "HARD_SWISH" not in census and census["MUL"] == 2, census


def test_leaky_relu_as_maximum_or_minimum():
    """max(x, alpha x) for alpha in [0, 1]; relu(x) + alpha min(x, 0) beyond."""
    x = _x((3, 4, 6))
    nodes = [helper.make_node("LeakyRelu", ["x"], ["small"], alpha=0.1),
             helper.make_node("LeakyRelu", ["x"], ["large"], alpha=1.7)]
    _, census = check_nodes(nodes, {"x": x}, options=_rtpo("leakyrelu"))
    assert "LEAKY_RELU" not in census, census
    assert census["MAXIMUM"] == 1 and census["MINIMUM"] == 1, census


def test_prelu_without_prelu_op():
    x = _x((2, 3, 4, 5))
    slope = np.array([0.1, -0.5, 2.0], np.float32).reshape(3, 1, 1)
    _, census = check_nodes([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": x},
                            {"slope": slope}, options=_rtpo("prelu"))
    assert "PRELU" not in census and census["MINIMUM"] == 1, census


def test_gelu_exact_and_tanh_without_gelu_op():
    x = _x((2, 5, 9), -8.0, 8.0)
    nodes = [helper.make_node("Gelu", ["x"], ["exact"]),
             helper.make_node("Gelu", ["x"], ["tanh"], approximate="tanh")]
    _, census = check_nodes(nodes, {"x": x}, opset=20, options=_rtpo("gelu"))
    assert "GELU" not in census and census["TANH"] == 1, census


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pow_constant_exponents_as_mul(dtype):
    """Integer exponents become MULs (a DIV for negative ones), 0.5 stays SQRT; float64
    models compute their .tflite in float32 through a rebuild that keeps the options."""
    x = _x((2, 3, 4), 0.2, 3.0).astype(dtype)
    exponents = {"e2": 2.0, "e3": 3.0, "e5": 5.0, "em3": -3.0, "ehalf": 0.5}
    nodes = [helper.make_node("Pow", ["x", name], [f"y_{name}"]) for name in exponents]
    inits = {name: np.array(value, dtype) for name, value in exponents.items()}
    _, census = check_nodes(nodes, {"x": x}, inits, options=_rtpo("pow"))
    assert "POW" not in census and "SQUARE" not in census, census
    # the converter shares the squares between exponents; -3 is 1 / x^3
    assert census["SQRT"] == 1 and census["DIV"] == 1 and census["MUL"] >= 3, census


def test_erf_is_builtin_polynomial_with_or_without_rtpo():
    """Nothing to replace: Erf is a rational polynomial of builtins (no ERF, no Flex op)."""
    x = _x((2, 3, 11), -5.0, 5.0)
    _, census = check_nodes([helper.make_node("Erf", ["x"], ["y"])], {"x": x},
                            options=_rtpo("erf"))
    assert set(census) <= {"MUL", "ADD", "DIV", "MINIMUM", "MAXIMUM"}, census


def test_gathernd_and_matmulinteger_are_delegate_builtins_already():
    """onnx2tf's -rtpo GatherND / MatMulInteger replacements are the default lowering here:
    one GATHER with flattened indices, and a float matmul of the exact integer values."""
    rng = np.random.default_rng(6)
    feeds = {"data": rng.standard_normal((2, 3, 4)).astype(np.float32),
             "a": rng.integers(0, 256, (3, 2, 4)).astype(np.uint8)}
    inits = {"idx": np.array([[[1, 3], [0, 0]], [[2, 1], [1, 2]]], np.int64),
             "b": rng.integers(0, 256, (4, 5)).astype(np.uint8),
             "a_zero": np.array(128, np.uint8), "b_zero": np.array(7, np.uint8)}
    nodes = [helper.make_node("GatherND", ["data", "idx"], ["g"], batch_dims=1),
             helper.make_node("MatMulInteger", ["a", "b", "a_zero", "b_zero"], ["m"])]
    _, census = check_nodes(nodes, feeds, inits, options=_rtpo("gathernd", "matmulinteger"))
    assert "GATHER_ND" not in census and census["GATHER"] == 1, census
    assert not any(op.startswith("Flex") for op in census), census
    assert census.get("FULLY_CONNECTED", 0) + census.get("BATCH_MATMUL", 0) == 1, census


@pytest.mark.parametrize("spatial", [(9, 7), (11,)], ids=["2d", "1d"])
def test_dgc_splits_grouped_conv_per_group(spatial):
    rng = np.random.default_rng(4)
    rank = len(spatial)
    x = rng.standard_normal((2, 6, *spatial)).astype(np.float32)
    inits = {"w": rng.standard_normal((9, 2, *[3] * rank)).astype(np.float32) * 0.3,
             "b": rng.standard_normal(9).astype(np.float32)}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=3, pads=[1] * 2 * rank,
                            strides=[2] * rank)
    _, census = check_nodes([node], {"x": x}, inits,
                            options=ConversionOptions(disable_group_convolution=True))
    assert census["CONV_2D"] == 3 and census["SPLIT"] == 1, census
    assert census["CONCATENATION"] == 1, census


def test_cli_flags_reach_the_handlers(tmp_path):
    """-dgc and -rtpo through the CLI: the written float32 file has the split conv and the
    unfused HardSwish, and matches onnxruntime."""
    from ai_edge_litert.interpreter import Interpreter

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    inits = {"w": rng.standard_normal((4, 2, 3, 3)).astype(np.float32) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=2, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], inits, opset=17)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "out"
    code, log = run_cli("-i", path, "-o", out, "-n", "-rtpo", "HardSwish", "Sigmoid")
    assert code == 2 and "unknown operator 'Sigmoid'" in log and not out.exists(), log
    code, log = run_cli("-i", path, "-o", out, "-n", "-dgc", "-rtpo", "HardSwish")
    assert code == 0, log
    content = (out / "m_float32.tflite").read_bytes()
    census = count_tflite_ops(content)
    assert census["CONV_2D"] == 2 and "HARD_SWISH" not in census, census
    layout = json.loads((out / "m_io_layout.json").read_text())
    io_in, io_out = layout["inputs"][0], layout["outputs"][0]
    runner = Interpreter(model_content=content).get_signature_runner("serving_default")
    got = runner(**{io_in["tf_name"]: np.transpose(x, io_in["perm"])})[io_out["tf_name"]]
    expected = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(np.transpose(got, np.argsort(io_out["perm"])), expected,
                               atol=1e-4, rtol=0)
