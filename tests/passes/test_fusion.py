import copy
import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.passes.fusion import fuse_patterns
from onnx2tf_alt.tflite.lowering import tflite_bytes

from harness import assert_close, convert, count_tflite_ops, make_model, ort_run, tf_run, tflite_run

rng = np.random.default_rng(0)
SQRT2 = math.sqrt(2)


def mul(a, b, out):
    return helper.make_node("Mul", [a, b], [out])


def add(a, b, out):
    return helper.make_node("Add", [a, b], [out])


def erf_torch():
    """F.gelu as torch.onnx exports it: x * (erf(x / sqrt2) + 1) * 0.5, after a bias add."""
    return [
        add("inp", "bias", "x"),
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        add("e", "one", "a"),
        mul("x", "a", "m"),
        mul("m", "half", "y"),
    ], {"sqrt2": SQRT2, "one": 1.0, "half": 0.5}


def erf_half_first():
    """Hugging Face style: (x * 0.5) * (1 + erf(x / sqrt2))."""
    return [
        mul("inp", "half", "h"),
        helper.make_node("Div", ["inp", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        add("one", "e", "a"),
        mul("h", "a", "y"),
    ], {"sqrt2": SQRT2, "one": 1.0, "half": 0.5}


def erf_inverse_sqrt2():
    """x * (0.5 * (erf(x * 0.7071) + 1)), constants as Constant nodes."""
    constants = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
            np.array(value, np.float32)))
        for name, value in (("c_rsqrt2", 1 / SQRT2), ("c_one", 1.0), ("c_half", 0.5))
    ]
    return [
        *constants,
        mul("c_rsqrt2", "inp", "d"),
        helper.make_node("Erf", ["d"], ["e"]),
        add("e", "c_one", "a"),
        mul("c_half", "a", "h"),
        mul("inp", "h", "y"),
    ], {}


def tanh_pow():
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), x^3 as Pow."""
    return [
        helper.make_node("Pow", ["inp", "three"], ["c"]),
        mul("c", "kappa", "k"),
        add("inp", "k", "s"),
        mul("s", "beta", "u"),
        helper.make_node("Tanh", ["u"], ["t"]),
        add("t", "one", "a"),
        mul("half", "inp", "h"),
        mul("h", "a", "y"),
    ], {"three": 3.0, "kappa": 0.044715, "beta": math.sqrt(2 / math.pi), "one": 1.0,
        "half": 0.5}


def tanh_products():
    """x^3 as x * (x * x), and the 0.5 applied last."""
    return [
        mul("inp", "inp", "sq"),
        mul("inp", "sq", "c"),
        mul("kappa", "c", "k"),
        add("k", "inp", "s"),
        mul("beta", "s", "u"),
        helper.make_node("Tanh", ["u"], ["t"]),
        add("one", "t", "a"),
        mul("inp", "a", "m"),
        mul("m", "half", "y"),
    ], {"kappa": 0.044715, "beta": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}


PATTERNS = {
    "erf_torch": (erf_torch, "none"),
    "erf_half_first": (erf_half_first, "none"),
    "erf_inverse_sqrt2": (erf_inverse_sqrt2, "none"),
    "tanh_pow": (tanh_pow, "tanh"),
    "tanh_products": (tanh_products, "tanh"),
}


def build(pattern, opset=17, outputs=("y",)):
    nodes, scalars = pattern()
    inits = {n: np.array(v, np.float32) for n, v in scalars.items()}
    inits["bias"] = rng.standard_normal(16).astype(np.float32)
    inits = {n: v for n, v in inits.items() if any(n in node.input for node in nodes)}
    feeds = {"inp": (rng.standard_normal((2, 5, 16)) * 2).astype(np.float32)}
    return make_model(nodes, feeds, list(outputs), inits, opset), feeds


CONTRIB_OP = {"none": "Gelu", "tanh": "FastGelu"}


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("name", PATTERNS)
def test_gelu_patterns_fuse(name, opset):
    """One Gelu remains (ONNX's from opset 20, onnxruntime's contrib op below); the fused
    model is valid, onnxruntime runs it, and the conversion matches the original model."""
    pattern, approximate = PATTERNS[name]
    model, feeds = build(pattern, opset=opset)
    converted = convert(model)
    fused = converted.model
    ops = [n.op_type for n in fused.graph.node]
    want = "Gelu" if opset >= 20 else CONTRIB_OP[approximate]
    assert ops.count(want) == 1 and not {"Erf", "Tanh", "Pow", "Div", "Mul"} & set(ops), ops
    gelu = next(n for n in fused.graph.node if n.op_type == want)
    if opset >= 20:
        assert helper.get_attribute_value(gelu.attribute[0]).decode() == approximate
    else:
        assert gelu.domain == "com.microsoft"
    assert len(fused.graph.initializer) == (1 if name == "erf_torch" else 0)  # only the bias
    onnx.checker.check_model(fused)
    expected = ort_run(model, feeds)
    assert_close(ort_run(fused, feeds)[0], expected[0], what="onnxruntime on the fused model")
    content = tflite_bytes(converted.result)
    assert_close(tf_run(converted, feeds)[0], expected[0], what="TF")
    assert_close(tflite_run(converted, feeds, content)[0], expected[0], what="TFLite")
    assert count_tflite_ops(content).get("GELU") == 1


def test_opset13_model_fuses_and_converts():
    model, feeds = build(erf_torch, opset=13)
    converted = convert(model)
    assert [n.op_type for n in converted.model.graph.node] == ["Add", "Gelu"]
    assert_close(tf_run(converted, feeds)[0], ort_run(model, feeds)[0], what="TF")


def _unchanged(model):
    before = [n.op_type for n in model.graph.node]
    after = [n.op_type for n in fuse_patterns(copy.deepcopy(model)).graph.node]
    return before == after


def test_intermediate_graph_output_is_not_fused():
    model, _ = build(erf_torch, outputs=("y", "a"))
    assert _unchanged(model)


def test_intermediate_with_another_consumer_is_not_fused():
    nodes, scalars = erf_half_first()
    nodes.append(helper.make_node("Neg", ["e"], ["other"]))
    model, _ = build(lambda: (nodes, scalars), outputs=("y", "other"))
    assert _unchanged(model)


@pytest.mark.parametrize("constant,value", [("sqrt2", 1.5), ("half", 0.6), ("kappa", 0.05)])
def test_other_functions_are_not_fused(constant, value):
    pattern = tanh_pow if constant == "kappa" else erf_torch
    nodes, scalars = pattern()
    model, _ = build(lambda: (nodes, {**scalars, constant: value}))
    assert _unchanged(model)


def test_consecutive_gelus_both_fuse():
    first, scalars = erf_torch()
    second = [copy.deepcopy(n) for n in first[1:]]
    for n in second:
        n.input[:] = ["y" if i == "x" else i if i in scalars else f"{i}2" for i in n.input]
        n.output[:] = [f"{n.output[0]}2"]
    model, _ = build(lambda: (first + second, scalars), outputs=("y2",))
    fused = fuse_patterns(copy.deepcopy(model))
    assert [n.op_type for n in fused.graph.node] == ["Add", "Gelu", "Gelu"]
    assert [n.input[0] for n in fused.graph.node[1:]] == ["x", "y"]
