import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from harness import (
    assert_close,
    assert_keras_reloads,
    check_node,
    check_nodes,
    convert,
    make_model,
    node,
    tf_run,
    tflite_run,
)

rng = np.random.default_rng(0)
SHAPE = (2, 3, 5, 7)


def _unary_input(op, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 2
    if op in ("Log", "Sqrt"):
        return np.abs(x) + 0.05
    if op == "Reciprocal":
        return np.sign(x) * (np.abs(x) + 0.2)
    if op in ("Asin", "Acos", "Atanh"):
        return rng.uniform(-0.95, 0.95, shape).astype(np.float32)
    if op == "Acosh":
        return 1 + np.abs(x)
    if op == "Tan":
        return rng.uniform(-1.4, 1.4, shape).astype(np.float32)
    if op in ("Round", "Floor", "Ceil", "Sign"):
        return (np.round(x * 4) / 2).astype(np.float32)  # many exact halves and zeros
    return x


FLOAT_UNARY = [
    "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Sin",
    "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf",
    "IsNaN", "Identity",
]


def test_float_unary_ops(tmp_path):
    feeds = {f"x_{op}": _unary_input(op, SHAPE) for op in FLOAT_UNARY}
    nodes = [node(op, [f"x_{op}"], f"y_{op}") for op in FLOAT_UNARY]
    converted, _ = check_nodes(nodes, feeds)
    assert_keras_reloads(converted, feeds, tmp_path)


def test_erf_accuracy():
    """The composed erf stays within 1e-6 of onnxruntime over its whole float32 range."""
    x = np.linspace(-6, 6, 24000, dtype=np.float32).reshape(3, 8000, 1)
    check_node("Erf", {"x": x}, tol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_unary_ops(dtype):
    ops = ["Neg", "Abs", "Sign", "Identity"]
    x = rng.integers(-100, 100, SHAPE).astype(dtype)
    check_nodes([node(op, ["x"], f"y_{op}") for op in ops], {"x": x})


BROADCASTS = [  # (a, b): scalar, (C,1,1), (1,W), lower rank, both ways, a lower
    (SHAPE, ()),
    (SHAPE, (3, 1, 1)),
    (SHAPE, (1, 7)),
    ((2, 1, 5, 1), (3, 1, 7)),
    ((5, 7), SHAPE),
]
FLOAT_BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"]


def _nonzero(shape, dtype, low=-9, high=10):
    b = rng.integers(low, high, shape)
    return np.where(b == 0, 3, b).astype(dtype)


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_float_binary_broadcast(shapes):
    """Each op with the second operand as a runtime input and as a constant."""
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = np.asarray(rng.standard_normal(shapes[1]) + 3, np.float32)
    nodes = [node(op, ["a", "b"], f"{op}_input") for op in FLOAT_BINARY]
    nodes += [node(op, ["a", "c"], f"{op}_const") for op in FLOAT_BINARY]
    check_nodes(nodes, {"a": a, "b": b}, {"c": b + 1})


INT_BINARY = [("Add", {}), ("Sub", {}), ("Mul", {}), ("Div", {}), ("Max", {}), ("Min", {}),
              ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})]


@pytest.mark.parametrize(
    "dtype,shapes",
    [(np.int32, BROADCASTS[1]), (np.int32, BROADCASTS[3]), (np.int64, BROADCASTS[3])],
    ids=["int32-C11", "int32-both", "int64-both"],
)
def test_integer_binary(dtype, shapes):
    """Negative operands: division truncates toward zero, Mod signs follow fmod."""
    a = rng.integers(-50, 50, shapes[0]).astype(dtype)
    b = _nonzero(shapes[1], dtype)
    nodes = [node(op, ["a", "b"], f"{op}{i}", **attrs) for i, (op, attrs) in enumerate(INT_BINARY)]
    check_nodes(nodes, {"a": a, "b": b})


def test_int64_division_large_values(tmp_path):
    """The whole int64 range, divisors of every magnitude and both signs."""
    a = rng.integers(-(2**63) + 1, 2**63 - 1, (4, 33), dtype=np.int64)
    b = rng.integers(1, 2**62, (4, 33), dtype=np.int64) >> rng.integers(0, 62, (4, 33))
    b = (b + 1) * rng.choice([-1, 1], (4, 33))
    nodes = [node("Div", ["a", "b"], "div"), node("Mod", ["a", "b"], "mod", fmod=1),
             node("Mod", ["a", "b"], "floor_mod")]
    converted, _ = check_nodes(nodes, {"a": a, "b": b})
    assert_keras_reloads(converted, {"a": a, "b": b}, tmp_path)


def no_flex(census):
    assert not any(name.startswith("Flex") for name in census), census


def test_uint64_division_whole_range(tmp_path):
    """Dividends and divisors of every magnitude up to 2^64 - 1 (divisors at and above 2^63
    too), through TFLite builtins only."""
    info = np.iinfo(np.uint64)
    a = rng.integers(0, info.max, (4, 40), dtype=np.uint64, endpoint=True)
    a.flat[:6] = [info.max, info.max - 1, 2**63, 2**63 - 1, 0, 1]
    b = rng.integers(1, info.max, (4, 40), dtype=np.uint64, endpoint=True)
    b >>= rng.integers(0, 64, (4, 40)).astype(np.uint64)
    b = np.maximum(b, np.uint64(1))
    b.flat[:8] = [info.max, 2**63, 2**63 - 1, 3, 1, 2**63 + 1, 2, info.max]
    nodes = [node("Div", ["a", "b"], "div"), node("Mod", ["a", "b"], "mod"),
             node("Mod", ["a", "b"], "fmod", fmod=1), node("Div", ["a", "c"], "div_row")]
    feeds = {"a": a, "b": b, "c": b[:1]}
    converted, census = check_nodes(nodes, feeds)
    no_flex(census)
    assert_keras_reloads(converted, feeds, tmp_path)


def test_float_mod():
    a = (rng.standard_normal(SHAPE) * 10).astype(np.float32)
    b = np.sign(rng.standard_normal((1, 7))) * rng.uniform(0.5, 4, (1, 7))
    check_node("Mod", {"a": a, "b": b.astype(np.float32)}, {"fmod": 1})


def test_variadic():
    xs = {
        "x0": rng.standard_normal(SHAPE).astype(np.float32),
        "x1": rng.standard_normal((3, 1, 1)).astype(np.float32),
        "x2": rng.standard_normal((7,)).astype(np.float32),
    }
    nodes = []
    for op in ("Sum", "Max", "Min", "Mean"):
        nodes.append(node(op, ["x0"], f"{op}_1"))
        nodes.append(node(op, ["x0", "x1", "x2"], f"{op}_3"))
        nodes.append(node(op, ["x1", "x2"], f"{op}_2"))
    check_nodes(nodes, xs)


def test_pow(tmp_path):
    base = np.abs(rng.standard_normal(SHAPE)).astype(np.float32) + 0.1
    signed = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    feeds = {
        "base": base,
        "signed": signed,
        "e_float": rng.uniform(-2, 2, (1, 7)).astype(np.float32),
        "e_int": rng.integers(-3, 4, (3, 1, 1)).astype(np.int64),
        "i_base": _nonzero(SHAPE, np.int32, -4, 5),  # 0 ** negative is undefined
        "i_exp": rng.integers(-2, 5, (7,)).astype(np.int32),
        "i_positive": rng.integers(1, 9, SHAPE).astype(np.int32),
        "l_base": _nonzero(SHAPE, np.int64, -9, 10),
        "l_exp": rng.integers(-2, 17, (5, 1)).astype(np.int64),  # 9**16 < 2**53: onnxruntime computes in float64
    }
    consts = {f"k{i}": np.array(v, np.float32) for i, v in enumerate([2, 0.5, 3, -1, 1])}
    nodes = [
        node("Pow", ["base", "e_float"], "float_exponent"),
        node("Pow", ["signed", "e_int"], "int_exponent"),
        node("Pow", ["i_base", "i_exp"], "int_base"),
        node("Pow", ["l_base", "l_exp"], "int64_base"),
        node("Pow", ["i_positive", "e_float"], "int_base_float_exponent"),
        node("Pow", ["signed", "k0"], "square"),
        node("Pow", ["base", "k1"], "sqrt"),
        node("Pow", ["signed", "k2"], "cube"),
        node("Pow", ["base", "k3"], "reciprocal"),
        node("Pow", ["signed", "k4"], "one"),
    ]
    converted, _ = check_nodes(nodes, feeds, consts)
    assert_keras_reloads(converted, feeds, tmp_path)


def test_is_nan_is_inf():
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x.flat[::3] = np.inf
    x.flat[1::5] = -np.inf
    x.flat[2::7] = np.nan
    nodes = [
        node("IsNaN", ["x"], "nan"),
        node("IsInf", ["x"], "inf"),
        node("IsInf", ["x"], "positive", detect_negative=0),
        node("IsInf", ["x"], "negative", detect_positive=0),
    ]
    check_nodes(nodes, {"x": x})


CAST_TARGETS = {
    "float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "double": TensorProto.DOUBLE,
    "int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32,
    "int64": TensorProto.INT64, "uint8": TensorProto.UINT8, "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32, "bool": TensorProto.BOOL,
}


def _cast_source(dtype):
    if dtype == np.bool_:
        return rng.random(SHAPE) > 0.5
    if np.dtype(dtype).kind == "f":  # fractions of both signs truncate toward zero
        x = rng.uniform(-120, 120, SHAPE)
        x.flat[::4] = 0
        return x.astype(dtype)
    return rng.integers(-300 if dtype != np.uint8 else 0, 300, SHAPE).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.uint8])
def test_cast(dtype):
    """Every numeric and bool target; signed sources wrap into narrow integers as in C++."""
    x = _cast_source(dtype)
    positive = np.abs(x) if dtype != np.bool_ else x
    nodes = []
    for name, to in CAST_TARGETS.items():
        unsigned = name.startswith("uint")
        floats_to_unsigned = unsigned and np.dtype(dtype).kind == "f"
        nodes.append(node("Cast", ["p" if floats_to_unsigned else "x"], f"to_{name}", to=to))
    check_nodes(nodes, {"x": x, "p": positive})


def test_cast_like():
    x = rng.uniform(-20, 20, SHAPE).astype(np.float32)
    likes = {"int_like": np.zeros((1,), np.int64), "bool_like": np.zeros((2, 2), bool),
             "half_like": np.zeros((), np.float16)}
    nodes = [node("CastLike", ["x", name], f"as_{name}") for name in likes]
    check_nodes(nodes, {"x": x}, likes)


@pytest.mark.parametrize("opset", [7, 10, 13])
def test_dropout(opset):
    """Inference only; the mask is all False before opset 12 and all True from it."""
    x = rng.standard_normal(SHAPE).astype(np.float32)
    if opset < 12:
        nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.3)]
        check_nodes(nodes, {"x": x}, opset=opset)
        return
    consts = {"ratio": np.array(0.3, np.float32), "training": np.array(False)}
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"]),
             helper.make_node("Dropout", ["x"], ["y1"])]
    check_nodes(nodes, {"x": x}, consts, opset=opset)


def test_dropout_training_zero_ratio_is_identity():
    """Run-time ratio 0 and training true: no element dropped, exactly as onnxruntime."""
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"])]
    check_nodes(nodes, {"x": x, "ratio": np.array(0.0, np.float32), "training": np.array(True)})


@pytest.mark.parametrize("training", [True, False])
def test_dropout_training_draws_masks(training):
    """Kept elements are scaled by 1/(1-ratio), dropped ones are 0 and the mask says which;
    about `ratio` of them are dropped; with a run-time false flag the input passes through."""
    from harness import convert, make_model, tf_run, tflite_run

    x = rng.uniform(1, 2, (4, 50, 10)).astype(np.float32)
    feeds = {"x": x, "ratio": np.array(0.25, np.float32), "training": np.array(training)}
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"])]
    converted = convert(make_model(nodes, feeds, ["y", "mask"]))
    for run in (tf_run, tflite_run):
        y, mask = run(converted, feeds)
        assert mask.dtype == bool and y.shape == x.shape
        if not training:
            np.testing.assert_array_equal(y, x)
            assert mask.all()
            continue
        np.testing.assert_allclose(y[mask], x[mask] / 0.75, rtol=1e-6)
        assert (y[~mask] == 0).all()
        assert 0.2 < 1 - mask.mean() < 0.3, 1 - mask.mean()


def test_narrow_dtypes():
    """Types TFLite arithmetic lacks are widened; results wrap back as onnxruntime's."""
    def ints(dtype, low, high, shape=SHAPE):
        return rng.integers(low, high, shape).astype(dtype)

    feeds = {
        "u8": ints(np.uint8, 0, 256), "u8b": ints(np.uint8, 1, 256, (1, 7)),
        "i8": ints(np.int8, -128, 128), "i16": ints(np.int16, -300, 300),
        "u16": ints(np.uint16, 0, 60000), "u32": ints(np.uint32, 0, 2**32),
        "f16": rng.standard_normal(SHAPE).astype(np.float16),
    }
    nodes = [
        node("Add", ["u8", "u8b"], "add_u8"), node("Sub", ["u8", "u8b"], "sub_u8"),
        node("Div", ["u8", "u8b"], "div_u8"), node("Mul", ["i8", "i8"], "mul_i8"),
        node("Abs", ["i8"], "abs_i8"), node("Neg", ["i16"], "neg_i16"),
        node("Mul", ["i16", "i16"], "mul_i16"), node("Add", ["u16", "u16"], "add_u16"),
        node("Add", ["u32", "u32"], "add_u32"), node("Div", ["u32", "u8b_32"], "div_u32"),
        node("Add", ["f16", "f16"], "add_f16"), node("Exp", ["f16"], "exp_f16"),
    ]
    check_nodes(
        [node("Cast", ["u8b"], "u8b_32", to=TensorProto.UINT32), *nodes],
        feeds,
        outputs=[n.output[0] for n in nodes],
        tol=1e-3,  # float16 results are rounded to float16 (ulp 1e-3 at 1)
    )


def test_opset7():
    """Binary ops broadcast from opset 7; the variadic ones only from opset 8."""
    a = np.abs(rng.standard_normal(SHAPE)).astype(np.float32)
    b = (rng.standard_normal((5, 7)) + 3).astype(np.float32)
    c = rng.standard_normal(SHAPE).astype(np.float32)
    nodes = [node(op, ["a", "b"], op) for op in ["Add", "Sub", "Mul", "Div", "Pow"]]
    nodes += [node(op, ["a", "c", "a"], op) for op in ["Max", "Min", "Sum", "Mean"]]
    check_nodes(nodes, {"a": a, "b": b, "c": c}, opset=7)


def test_add_broadcast():
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    check_node("Add", {"a": a, "b": b})


def test_channel_last_chain_has_no_transpose():
    """Conv -> broadcasting math on channel-last values -> Conv, without any TRANSPOSE."""
    feeds = {
        "x": rng.standard_normal((2, 3, 9, 7)).astype(np.float32),
        "row": rng.standard_normal((1, 7)).astype(np.float32),
        "full": rng.standard_normal((2, 4, 9, 7)).astype(np.float32),
    }
    consts = {
        "w1": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "w2": rng.standard_normal((5, 4, 1, 1)).astype(np.float32),
        "bias": rng.standard_normal((4, 1, 1)).astype(np.float32),
        "col": rng.standard_normal((9, 1)).astype(np.float32) + 3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        node("Add", ["c1", "bias"], "t1"),
        node("Mul", ["t1", "row"], "t2"),
        node("Div", ["t2", "col"], "t3"),
        node("Max", ["t3", "full", "bias"], "t4"),
        node("Erf", ["t4"], "t5"),
        node("Sub", ["bias", "t5"], "t6"),
        helper.make_node("Conv", ["t6", "w2"], ["y"]),
    ]
    _, census = check_nodes(nodes, feeds, consts, outputs=["y"])
    assert "TRANSPOSE" not in census, census



FOUR_BIT = {"int4": (TensorProto.INT4, TensorProto.INT8),
            "uint4": (TensorProto.UINT4, TensorProto.UINT8)}


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_cast_to_four_bit_integers_and_back(dtype):
    """Cast / CastLike to INT4 and UINT4 keep the low 4 bits (floats rounded half away from
    zero first); 4-bit values cast to 8-bit ints and to float. onnxruntime returns no 4-bit
    arrays, so each 4-bit value is read through a second Cast. TF only: TFLite has no 4-bit
    tensor type (its converter refuses them; the node suite excludes them for TFLite too)."""
    x = np.concatenate([np.arange(-20, 21), [2.5, -2.5, 0.5, -0.5, 7.5, 8.4, -8.5, 15.6]])
    x = x.astype(dtype).reshape(7, 7)
    nodes = []
    for name, (narrow, wide) in FOUR_BIT.items():
        nodes += [node("Cast", ["x"], f"{name}_q", to=narrow),
                  node("Cast", [f"{name}_q"], f"{name}_wide", to=wide),
                  node("Cast", [f"{name}_q"], f"{name}_float", to=TensorProto.FLOAT)]
    nodes += [node("CastLike", ["x", "like"], "like_q"),
              node("Cast", ["like_q"], "like_wide", to=TensorProto.INT8)]
    outputs = [n.output[0] for n in nodes if not n.output[0].endswith("_q")]
    check_nodes(nodes, {"x": x}, {"like": np.zeros((1,), ml_dtypes.int4)}, opset=21,
                outputs=outputs, tflite=False)


# --- BitCast ------------------------------------------------------------------------------
# Its own generator, seeded as before: drawing these cases at collection from `rng` would
# change the data of every test above.
bit_cases = np.random.default_rng(0)


@pytest.mark.parametrize(
    "x, to",
    [(bit_cases.standard_normal((2, 3)).astype(np.float32), TensorProto.INT32),
     (bit_cases.integers(-9, 9, (4,)).astype(np.int32), TensorProto.FLOAT),
     (bit_cases.integers(0, 255, (2, 3)).astype(np.uint8), TensorProto.INT8)],
)
def test_bitcast(x, to):
    check_node("BitCast", {"x": x}, {"to": to}, opset=26)


@pytest.mark.parametrize(
    "x, to",
    [(np.array([True, False, True]), TensorProto.UINT8),
     (np.array([[0, 1, 1]], np.uint8), TensorProto.BOOL)],
)
def test_bitcast_bool(x, to):
    """onnxruntime has no bool BitCast kernel: compared with onnx.reference instead."""
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=to)], {"x": x}, ["y"],
                       opset=26)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    converted = convert(model)
    for run in (tf_run, tflite_run):
        assert_close(run(converted, {"x": x})[0], expected)
