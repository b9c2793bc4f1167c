import numpy as np
import pytest

from harness import assert_keras_reloads, check_nodes, node

rng = np.random.default_rng(0)
SHAPE = (2, 3, 5, 7)
COMPARISONS = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]


def _values(dtype, shape):
    if np.dtype(dtype).kind == "f":
        return np.round(rng.standard_normal(shape) * 2).astype(dtype)  # many ties
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -4), min(info.max, 4), shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8, np.int8])
def test_comparisons(dtype):
    """Runtime (C,1,1) and constant (1,W) right-hand sides."""
    feeds = {"a": _values(dtype, SHAPE), "b": _values(dtype, (3, 1, 1))}
    nodes = [node(op, ["a", "b"], f"{op}_input") for op in COMPARISONS]
    nodes += [node(op, ["a", "c"], f"{op}_const") for op in COMPARISONS]
    check_nodes(nodes, feeds, {"c": _values(dtype, (1, 7))})


def test_boolean_logic():
    feeds = {"a": rng.random(SHAPE) > 0.5, "b": rng.random((5, 1)) > 0.5,
             "c": rng.random((2, 1, 1, 1)) > 0.5}
    nodes = [node(op, ["a", "b"], op) for op in ("And", "Or", "Xor", "Equal")]
    nodes += [node("Not", ["a"], "Not"), node("And", ["c", "b"], "both_broadcast")]
    check_nodes(nodes, feeds, opset=11)


def test_where():
    feeds = {
        "cond": rng.random((3, 1, 7)) > 0.5,
        "x": rng.standard_normal(SHAPE).astype(np.float32),
        "y": rng.standard_normal((5, 1)).astype(np.float32),
        "i": rng.integers(-9, 9, (2, 1, 1, 1)).astype(np.int64),
        "j": rng.integers(-9, 9, (7,)).astype(np.int64),
        "p": rng.random(SHAPE) > 0.5,
        "k": rng.integers(-9, 9, SHAPE).astype(np.int32),
        "u": rng.integers(0, 256, SHAPE).astype(np.uint8),
    }
    nodes = [
        node("Where", ["cond", "x", "y"], "float"),
        node("Where", ["cond", "i", "j"], "int64"),
        node("Where", ["cond", "u", "u0"], "uint8"),
        node("Where", ["p", "k", "k0"], "int32"),
        node("Where", ["p", "x", "zero"], "const_scalar"),
    ]
    consts = {"k0": np.array(7, np.int32), "u0": np.array(200, np.uint8),
              "zero": np.array(0, np.float32)}
    check_nodes(nodes, feeds, consts)


BITWISE = ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int16, np.uint32,
                                   np.uint64])
def test_bitwise(dtype, tmp_path):
    """All bit patterns: signed extremes, sign bits, and broadcasting lane pairs."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, SHAPE, dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (1, 5, 1), dtype=dtype, endpoint=True)
    a.flat[:4] = [info.min, info.max, 0, 1]
    nodes = [node(op, ["a", "b"], op) for op in BITWISE] + [node("BitwiseNot", ["a"], "Not")]
    converted, _ = check_nodes(nodes, {"a": a, "b": b})
    if dtype == np.int64:
        assert_keras_reloads(converted, {"a": a, "b": b}, tmp_path)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bit_shift(dtype, tmp_path):
    """Shifts up to and beyond the width (those give 0, as in onnxruntime); TFLite
    builtins only (uint64 too)."""
    bits = np.dtype(dtype).itemsize * 8
    x = rng.integers(0, np.iinfo(dtype).max, SHAPE, dtype=dtype, endpoint=True)
    x.flat[:3] = [np.iinfo(dtype).max, 1, 0]
    shift = rng.integers(0, bits + 3, (5, 7)).astype(dtype)
    shift.flat[:4] = [0, 1, bits - 1, bits]
    nodes = [node("BitShift", ["x", "s"], "left", direction="LEFT"),
             node("BitShift", ["x", "s"], "right", direction="RIGHT"),
             node("BitShift", ["x", "k"], "left_const", direction="LEFT")]
    converted, census = check_nodes(nodes, {"x": x, "s": shift}, {"k": np.array([3], dtype)})
    assert not any(name.startswith("Flex") for name in census), census
    if dtype in (np.uint8, np.uint64):
        assert_keras_reloads(converted, {"x": x, "s": shift}, tmp_path)
