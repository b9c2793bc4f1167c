"""Per-channel range equalization for the INT8 files (quant_rewrites.equalize_channels):
exact in float (checked against onnxruntime through the TF model and the float32 TFLite),
and the channels of every equalized value end up with comparable ranges."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.passes.quant_rewrites import (
    MAX_CHANNEL_GAIN,
    channel_peaks,
    equalizable_chains,
    equalize_channels,
)

from harness import check_model, make_model, ort_run

C = 6


def _skewed(rng, shape, loud: int) -> np.ndarray:
    """Random weights whose output channel `loud` is 30x the others'."""
    w = rng.standard_normal(shape).astype(np.float32) * 0.3
    w[loud] *= 30
    return w


def chain_model(reader: str = "Conv") -> onnx.ModelProto:
    """Conv -> BatchNormalization -> padded depthwise Conv (linear chain) -> scalar affine ->
    hard-swish x * Clip(x + 3, 0, 6) / 6 -> scalar affine -> a padded depthwise Conv and a
    1x1 Conv (`reader`: the op type of the second reader)."""
    rng = np.random.default_rng(0)
    init = {
        "w0": _skewed(rng, (C, 3, 3, 3), 1), "b0": rng.standard_normal(C).astype(np.float32),
        "gamma": rng.uniform(0.5, 2, C).astype(np.float32),
        "beta": rng.standard_normal(C).astype(np.float32),
        "mean": rng.standard_normal(C).astype(np.float32),
        "var": rng.uniform(0.5, 2, C).astype(np.float32),
        "w1": _skewed(rng, (C, 1, 3, 3), 4), "b1": rng.standard_normal(C).astype(np.float32),
        "a": np.array(1.3, np.float32), "b": np.array([0.4], np.float32),
        "three": np.array(3, np.float32), "zero": np.array(0, np.float32),
        "six": np.array(6, np.float32),
        "c": np.array(0.7, np.float32), "d": np.array(-0.2, np.float32),
        "w2": rng.standard_normal((C, 1, 3, 3)).astype(np.float32),
        "b2": rng.standard_normal(C).astype(np.float32),
        "w3": rng.standard_normal((4, C, 1, 1)).astype(np.float32),
    }
    second = (helper.make_node("Conv", ["l1", "w3"], ["y2"]) if reader == "Conv"
              else helper.make_node(reader, ["l1"], ["y2"]))
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "gamma", "beta", "mean", "var"], ["n0"]),
        helper.make_node("Conv", ["n0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=C),
        helper.make_node("Mul", ["a", "c1"], ["m1"]),
        helper.make_node("Add", ["m1", "b"], ["x1"]),
        helper.make_node("Add", ["x1", "three"], ["s1"]),
        helper.make_node("Clip", ["s1", "zero", "six"], ["g1"]),
        helper.make_node("Mul", ["x1", "g1"], ["p1"]),
        helper.make_node("Div", ["p1", "six"], ["h1"]),
        helper.make_node("Mul", ["h1", "c"], ["k1"]),
        helper.make_node("Add", ["k1", "d"], ["l1"]),
        helper.make_node("Conv", ["l1", "w2", "b2"], ["y1"], pads=[1, 1, 1, 1], group=C),
        second,
    ]
    feeds = {"x": np.zeros((1, 3, 12, 10), np.float32)}
    return make_model(nodes, feeds, ["y1", "y2"], init, opset=13)


def _samples(n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.uniform(-1, 1, (1, 3, 12, 10)).astype(np.float32)} for _ in range(n)]


def _equalized(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    chains = equalizable_chains(model)
    return equalize_channels(model, channel_peaks(model, _samples(),
                                                  [c.value for c in chains]))


def test_chains_found():
    chains = {c.value: c for c in equalizable_chains(chain_model())}
    assert set(chains) == {"n0", "x1"}
    assert chains["n0"].gate is None and chains["x1"].gate is not None
    assert [c.output[0] for c in chains["x1"].consumers] == ["y1", "y2"]
    assert [a.output[0] for a in chains["x1"].adds] == ["x1", "l1"]


def test_equalization_is_exact_in_float():
    model = chain_model()
    equalized, count = _equalized(model)
    assert count == 2
    onnx.checker.check_model(equalized)
    # the gate Clip(x + 3) reads the scaled x through a 1x1 depthwise Conv
    assert [n.op_type for n in equalized.graph.node].count("Conv") == 5
    feeds = _samples(1)[0]
    for a, b in zip(ort_run(equalized, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    check_model(equalized, feeds, tol=1e-3)


def test_equalized_channels_share_the_range():
    model = chain_model()
    before = channel_peaks(model, _samples(), ["n0", "x1"])
    after = channel_peaks(_equalized(model)[0], _samples(), ["n0", "x1"])
    for name in ("n0", "x1"):
        spread = before[name].max() / before[name].min()
        assert spread > 4  # the skewed weights make one channel loud
        assert after[name].max() / after[name].min() < 1.01 * max(1, spread / MAX_CHANNEL_GAIN)
        np.testing.assert_allclose(after[name].max(), before[name].max(), rtol=1e-5)


def test_other_readers_stop_the_chain():
    """A value some op other than a Conv reads keeps its scale (that op would see it)."""
    model = chain_model(reader="Relu")
    assert {c.value for c in equalizable_chains(model)} == {"n0"}
    equalized, count = _equalized(model)
    assert count == 1
    feeds = _samples(1)[0]
    for a, b in zip(ort_run(equalized, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
