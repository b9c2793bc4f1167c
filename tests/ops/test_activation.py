import numpy as np
import pytest
from onnx import helper

from harness import (
    Rng,
    assert_keras_reloads,
    check_node,
    check_nodes,
    check_with_reference,
    count_tflite_ops,
    make_model,
    node,
)

rng = Rng(0)
SHAPE = (2, 3, 5, 7)


PLAIN = ["Relu", "Sigmoid", "Tanh", "Softplus", "Softsign", "HardSwish", "Mish", "LeakyRelu",
         "Elu", "Selu", "Celu", "HardSigmoid", "ThresholdedRelu", "Shrink"]
ATTRIBUTES = {
    "LeakyRelu": {"alpha": 0.25},
    "Elu": {"alpha": 0.5},
    "Selu": {"alpha": 1.5, "gamma": 0.9},
    "Celu": {"alpha": 2.0},
    "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "ThresholdedRelu": {"alpha": 0.5},
    "Shrink": {"bias": 0.3, "lambd": 0.8},
}


def test_activations_default_attributes():
    """Plus every op on far tails (|x| 30..700), where exp-based forms could overflow."""
    feeds = {
        "x": (rng.standard_normal(SHAPE) * 4).astype(np.float32),
        "tail": (rng.choice([-1, 1], SHAPE) * rng.uniform(30, 700, SHAPE)).astype(np.float32),
    }
    nodes = [node(op, ["x"], op) for op in PLAIN]
    nodes += [node(op, ["tail"], f"{op}_tail") for op in PLAIN]
    check_nodes(nodes, feeds)


def test_activations_with_attributes(tmp_path):
    x = (rng.standard_normal((2, 5, 9)) * 4).astype(np.float32)
    nodes = [node(op, ["x"], op, **attrs) for op, attrs in ATTRIBUTES.items()]
    converted, _ = check_nodes(nodes, {"x": x})
    assert_keras_reloads(converted, {"x": x}, tmp_path)


def test_integer_activations():
    """Relu (opset 14) and Shrink take integers; Shrink truncates its float result."""
    nodes = [node("Relu", ["i32"], "relu32"), node("Relu", ["i64"], "relu64"),
             node("Shrink", ["i32"], "shrink", bias=1.5, lambd=2.0)]
    feeds = {"i32": rng.integers(-9, 9, SHAPE).astype(np.int32),
             "i64": rng.integers(-9, 9, SHAPE).astype(np.int64)}
    check_nodes(nodes, feeds)


def test_gelu():
    """Separate inputs: TF would share x * 0.5 between the two and TFLite fuse neither."""
    feeds = {name: (rng.standard_normal(SHAPE) * 3).astype(np.float32) for name in "ab"}
    nodes = [node("Gelu", ["a"], "exact"), node("Gelu", ["b"], "tanh", approximate="tanh")]
    _, census = check_nodes(nodes, feeds, opset=20)
    assert census.get("GELU") == 2, census


PRELU_SLOPES = {  # slope shape -> is it a TFLite PRELU (constant, no batch axis)?
    (3, 1, 1): True,
    (3, 5, 7): True,
    (7,): True,
    (1,): True,
    (2, 3, 1, 1): False,
}


def test_prelu_constant_slopes():
    """One input per node: a shared relu(x) would stop TFLite from fusing PRELU."""
    slopes = {f"s{i}": rng.uniform(0, 0.5, s).astype(np.float32)
              for i, s in enumerate(PRELU_SLOPES)}
    feeds = {f"x{i}": rng.standard_normal(SHAPE).astype(np.float32) for i in range(len(slopes))}
    nodes = [node("PRelu", [f"x{i}", s], f"prelu_{s}") for i, s in enumerate(slopes)]
    _, census = check_nodes(nodes, feeds, slopes)
    assert census.get("PRELU") == sum(PRELU_SLOPES.values()), census


def test_prelu_runtime_and_integer_slopes():
    feeds = {
        "x": rng.standard_normal(SHAPE).astype(np.float32),
        "slope": rng.uniform(0, 0.5, (3, 1, 1)).astype(np.float32),
        "ix": rng.integers(-9, 9, SHAPE).astype(np.int32),
        "islope": rng.integers(0, 4, (7,)).astype(np.int32),
    }
    nodes = [node("PRelu", ["x", "slope"], "runtime"), node("PRelu", ["ix", "islope"], "int")]
    check_nodes(nodes, feeds, opset=16)


def test_clip_attributes_before_opset_11():
    x = (rng.standard_normal(SHAPE) * 4).astype(np.float32)
    nodes = [node("Clip", ["x"], "both", min=-1.5, max=2.0), node("Clip", ["x"], "low", min=0.5),
             node("Clip", ["x"], "none"), node("Clip", ["x"], "relu6", min=0.0, max=6.0)]
    _, census = check_nodes(nodes, {"x": x}, opset=7)
    assert census.get("RELU6") == 1, census


def test_clip_inputs():
    """Either bound may be absent, constant or computed; min > max gives max."""
    x = (rng.standard_normal(SHAPE) * 4).astype(np.float32)
    feeds = {"x": x, "lo": np.array(-0.5, np.float32)}
    consts = {"zero": np.array(0, np.float32), "six": np.array(6, np.float32),
              "hi": np.array(1.5, np.float32), "big": np.array(3, np.float32)}
    nodes = [
        node("Clip", ["x", "zero", "six"], "relu6"),
        node("Clip", ["x", "zero"], "relu"),
        node("Clip", ["x", "", "hi"], "max_only"),
        node("Clip", ["x"], "none"),
        node("Clip", ["x", "lo", "hi"], "runtime_min"),
        node("Clip", ["x", "big", "hi"], "crossed"),
    ]
    _, census = check_nodes(nodes, feeds, consts, opset=13)
    assert census.get("RELU6") == 1, census


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_clip_integers(dtype):
    x = rng.integers(-20, 20, SHAPE).astype(dtype)
    consts = {"lo": np.array(-3, dtype), "hi": np.array(6, dtype)}
    nodes = [node("Clip", ["x", "lo", "hi"], "both"), node("Clip", ["x", "", "hi"], "max_only")]
    check_nodes(nodes, {"x": x}, consts, opset=13)


def test_channel_last_chain_has_no_transpose():
    """Conv -> activations -> Conv stays channel-last; PRelu and HardSwish stay builtins."""
    feeds = {"x": rng.standard_normal((2, 3, 9, 7)).astype(np.float32)}
    consts = {
        "w1": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "w2": rng.standard_normal((5, 4, 1, 1)).astype(np.float32),
        "slope": rng.uniform(0, 0.5, (4, 1, 1)).astype(np.float32),
        "lo": np.array(-2, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        node("PRelu", ["c1", "slope"], "t1"),
        node("HardSwish", ["t1"], "t2"),
        node("Clip", ["t2", "lo"], "t3"),
        node("Mish", ["t3"], "t4"),
        helper.make_node("Conv", ["t4", "w2"], ["y"]),
    ]
    _, census = check_nodes(nodes, feeds, consts, outputs=["y"])
    assert "TRANSPOSE" not in census, census
    assert census.get("PRELU") == 1 and census.get("HARD_SWISH") == 1, census


# --- Swish and SwiGLU -------------------------------------------------------------------
# onnxruntime has no SwiGLU (its function body needs Swish-24): it is compared with
# onnx.reference.ReferenceEvaluator instead, with the same tolerance.
@pytest.mark.parametrize("alpha", [None, 0.5])
def test_swish(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check_node("Swish", {"x": 3 * rng.randn(2, 3, 5)}, attrs, opset=24)


@pytest.mark.parametrize(
    "shape, alpha", [((2, 4), None), ((3, 5, 7), 0.5), ((1, 2, 3, 9), 1.702), ((7,), None)]
)
def test_swiglu(shape, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], **attrs)
    feeds = {"a": rng.randn(*shape, scale=3.0), "b": rng.randn(*shape)}
    check_with_reference(make_model([node], feeds, ["y"], opset=28), feeds)


def test_swiglu_between_convs_has_no_transpose():
    """Gate and value from two convs, the product into a third: all channel-last."""
    c = 4
    inits = {f"w{i}": rng.randn(c, c, 1, 1) for i in range(3)}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["gate"]),
        helper.make_node("Conv", ["x", "w1"], ["value"]),
        helper.make_node("SwiGLU", ["gate", "value"], ["h"], alpha=0.8),
        helper.make_node("Conv", ["h", "w2"], ["y"]),
    ]
    feeds = {"x": rng.randn(2, c, 5, 7)}
    model = make_model(nodes, feeds, ["y"], inits, opset=28)
    converted = check_with_reference(model, feeds)
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)
