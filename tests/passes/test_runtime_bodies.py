"""Handlers inside Loop bodies whose shapes, axes and sizes are known only at run time.

Each case is one op in the body of a Loop with a run-time trip count: the body reads the
loop-carried `x` and parameters (axes, shapes, sizes, pads, k) that are model inputs, so
nothing about them is constant; the body declares no value_info, as exporters write them.
The op's output is a scan output, so every step's value is compared. Checked against
onnxruntime through the TF model and the float32 TFLite (see tests/harness.py), on two sets
of inputs each.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from harness import Rng, check_model, ints, make_model, node, ort_run, tensor_info, tflite_run

rng = Rng(32)
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _loop_model(op_nodes: list, x: np.ndarray, params: dict[str, np.ndarray], opset: int = 18):
    """Loop(trip, x) whose body computes `y` from `x_in` and the outer `params` (each step),
    and passes `x_in` on; outputs the final x and the stacked ys."""
    body = helper.make_graph(
        [*op_nodes,
         node("Identity", ["cond_in"], "cond_out"),
         node("Identity", ["x_in"], "x_out")],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("x_in", F, None)],
        [helper.make_value_info("cond_out", onnx.TypeProto()),
         helper.make_value_info("x_out", onnx.TypeProto()),
         helper.make_value_info("y", onnx.TypeProto())],
    )
    loop = node("Loop", ["trip", "", "x"], ["x_final", "ys"], body=body)
    inputs = {"trip": np.array(2, np.int64), "x": x, **params}
    return make_model([loop], inputs, ["x_final", "ys"], opset=opset), inputs


def _typed_model(nodes, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, int]]):
    """A model whose outputs have an element type and a rank, each dim unknown (ONNX cannot
    infer them): `outputs` maps names to (element type, rank)."""
    graph = helper.make_graph(
        nodes, "test", [tensor_info(n, a) for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, t, [f"{n}_{k}" for k in range(rank)])
         for n, (t, rank) in outputs.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _check(op_nodes, x, params, second: dict | None = None, opset: int = 18):
    """Compare with onnxruntime on the inputs given, then on `second` (other values of the
    same shapes, e.g. other axes) through the same TFLite file."""
    model, feeds = _loop_model(op_nodes, x, params, opset)
    converted = check_model(model, feeds)
    if second:
        feeds = {**feeds, **second}
        expected = ort_run(model, feeds)
        for got, want in zip(tflite_run(converted, feeds, converted.tflite), expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return converted


@pytest.mark.parametrize("axes,second", [(ints(1), ints(0)), (ints(0, -1), ints(1, 3))])
def test_unsqueeze_run_time_axes(axes, second):
    _check([node("Unsqueeze", ["x_in", "axes"], "y")], rng.randn(2, 3, 4), {"axes": axes},
           {"axes": second})


@pytest.mark.parametrize("axes,second", [(ints(1), ints(3)), (ints(1, -1), ints(-1, 1))])
def test_squeeze_run_time_axes(axes, second):
    _check([node("Squeeze", ["x_in", "axes"], "y")], rng.randn(2, 1, 3, 1), {"axes": axes},
           {"axes": second})


@pytest.mark.parametrize("shape,second", [(ints(0, -1), ints(-1, 4)), (ints(3, 0, 0), ints(0, 4, 3))])
def test_reshape_run_time_shape(shape, second):
    _check([node("Reshape", ["x_in", "shape"], "y")], rng.randn(3, 4, 3), {"shape": shape},
           {"shape": second})


def test_expand_run_time_shape():
    _check([node("Expand", ["x_in", "shape"], "y")], rng.randn(3, 1), {"shape": ints(2, 3, 4)},
           {"shape": ints(2, 1, 5)})


def test_tile_run_time_repeats():
    _check([node("Tile", ["x_in", "repeats"], "y")], rng.randn(2, 3, 4),
           {"repeats": ints(1, 2, 3)}, {"repeats": ints(3, 1, 2)})


def test_slice_run_time_starts_ends_axes_steps():
    params = {"starts": ints(1, -1), "ends": ints(4, -100), "axes": ints(2, 1),
              "steps": ints(2, -1)}
    second = {"starts": ints(0, 0), "ends": ints(2, 3), "axes": ints(0, 2), "steps": ints(1, 2)}
    _check([node("Slice", ["x_in", "starts", "ends", "axes", "steps"], "y")], rng.randn(2, 3, 5),
           params, second)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMean"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_run_time_axes(op, keepdims):
    _check([node(op, ["x_in", "axes"], "y", keepdims=keepdims)], rng.randn(2, 3, 4),
           {"axes": ints(1)}, {"axes": ints(-1)})


def test_split_run_time_sizes():
    nodes = [node("Split", ["x_in", "split"], ["a", "b"], axis=1),
             node("Concat", ["b", "a"], "y", axis=1)]
    _check(nodes, rng.randn(2, 5, 3), {"split": ints(2, 3)}, {"split": ints(4, 1)})


def test_pad_run_time_pads():
    _check([node("Pad", ["x_in", "pads"], "y")], rng.randn(2, 3, 4),
           {"pads": ints(0, 1, 2, 1, 0, 1)}, {"pads": ints(1, 0, 0, 0, 2, 1)})


def test_topk_run_time_k():
    nodes = [node("TopK", ["x_in", "k"], ["y", "idx"], axis=-1)]
    _check(nodes, rng.randn(2, 3, 6), {"k": ints(3)}, {"k": ints(2)})


def test_constant_of_shape_and_range_run_time():
    nodes = [node("ConstantOfShape", ["shape"], "zeros",
                  value=helper.make_tensor("v", F, [1], [1.5])),
             node("Cast", ["limit"], "limit_f", to=F),
             node("Range", ["start", "limit_f", "delta"], "r"),
             node("Add", ["zeros", "r"], "y")]
    params = {"shape": ints(2, 4), "start": np.array(0.5, np.float32),
              "limit": np.array(4, np.int64), "delta": np.array(1.0, np.float32)}
    _check(nodes, rng.randn(2, 3), params)


def test_gather_and_concat_after_run_time_unsqueeze():
    """Values after an Unsqueeze with run-time axes have no ONNX shape; Gather, Concat and
    Shape after them work from the shape TF knows."""
    nodes = [node("Unsqueeze", ["x_in", "axes"], "u"),
             node("Gather", ["u", "idx"], "g", axis=2),
             node("Concat", ["g", "g"], "c", axis=-1),
             node("Shape", ["c"], "s"),
             node("Cast", ["s"], "s_f", to=F),
             node("ReduceSum", ["s_f"], "total", keepdims=1),
             node("Mul", ["c", "total"], "y")]
    _check(nodes, rng.randn(2, 3, 4), {"axes": ints(0), "idx": ints(1, 0)})


def test_attention_gru_greedy_decoder_with_early_exit():
    """A greedy decoder Loop (tests/models.py): 51 steps, then the end token stops it; the
    same TFLite file then decodes another encoder output, which stops elsewhere."""
    from models import attention_gru_decoder

    model, feeds = attention_gru_decoder(end_token=36, seed=1)
    _, tokens = ort_run(model, feeds)
    assert 50 <= len(tokens) < 80 and tokens[-1, 0] == 36  # an early exit after >= 50 steps
    converted = check_model(model, feeds, tol=1e-4)
    other = {"enc": Rng(7).randn(1, 12, 32)}
    want = ort_run(model, other)
    got = tflite_run(converted, other, converted.tflite)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_carried_tokens_grow_each_step():
    """A carried int64 vector gets one token (ArgMax of x + i) per step; no value_info."""
    body = helper.make_graph(
        [node("Cast", ["i"], "i_f", to=F),
         node("Add", ["x", "i_f"], "shifted"),
         node("ArgMax", ["shifted"], "tok", axis=1, keepdims=0),
         node("Concat", ["toks_in", "tok"], "toks_out", axis=0),
         node("Identity", ["cond_in"], "cond_out")],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("toks_in", I64, None)],
        [helper.make_value_info(n, onnx.TypeProto()) for n in ("cond_out", "toks_out")],
    )
    loop = node("Loop", ["trip", "", "start"], ["toks"], body=body)
    feeds = {"trip": np.array(7, np.int64), "x": rng.randn(2, 5) * 3,
             "start": ints(9)}
    model = _typed_model([loop], feeds, {"toks": (I64, 1)})
    converted = check_model(model, feeds)
    second = {**feeds, "trip": np.array(3, np.int64)}
    np.testing.assert_array_equal(tflite_run(converted, second, converted.tflite)[0],
                                  ort_run(model, second)[0])


def test_scan_body_with_run_time_shape():
    """A Scan body (no value_info) reshapes each row to a run-time shape and sums it into the
    state."""
    body = helper.make_graph(
        [node("Reshape", ["row", "shape"], "block"),
         node("Add", ["acc_in", "block"], "acc_out"),
         node("ReduceSum", ["block"], "total", keepdims=0)],
        "body",
        [helper.make_tensor_value_info("acc_in", F, None),
         helper.make_tensor_value_info("row", F, None)],
        [helper.make_value_info(n, onnx.TypeProto()) for n in ("acc_out", "total")],
    )
    scan = node("Scan", ["acc0", "rows"], ["acc", "totals"], body=body, num_scan_inputs=1)
    feeds = {"acc0": np.zeros((3, 4), np.float32), "rows": rng.randn(5, 12),
             "shape": ints(3, -1)}
    check_model(make_model([scan], feeds, ["acc", "totals"], input_shapes={"rows": ["n", 12]}),
                feeds)


def test_if_branches_with_run_time_shapes():
    """If on a run-time condition whose branches Expand / Tile by run-time shapes."""
    then = helper.make_graph([node("Expand", ["x", "shape"], "y")], "then", [],
                             [helper.make_tensor_value_info("y", F, ["a", "b", "c"])])
    other = helper.make_graph([node("Tile", ["x", "shape"], "y")], "other", [],
                              [helper.make_tensor_value_info("y", F, ["a", "b", "c"])])
    nodes = [node("ReduceSum", ["x"], "s", keepdims=0),
             node("Greater", ["s", "zero"], "positive"),
             node("If", ["positive"], "out", then_branch=then, else_branch=other)]
    x = np.abs(rng.randn(2, 1, 3))
    feeds = {"x": x, "shape": ints(2, 4, 3), "zero": np.array(0, np.float32)}
    model = _typed_model(nodes, feeds, {"out": (F, 3)})
    converted = check_model(model, feeds)
    second = {**feeds, "x": -x}  # the other branch
    np.testing.assert_allclose(tflite_run(converted, second, converted.tflite)[0],
                               ort_run(model, second)[0], rtol=1e-5, atol=1e-5)


def test_body_passing_carried_weights_through_keeps_its_shapes():
    """Paddle2ONNX carries weights through a Loop as outputs named like the body's inputs;
    ONNX inference of such a body used to drop every shape in it (a shapeless copy of the
    input's type), and an Unsqueeze with constant axes then had no rank to work with. The
    body prepared for the step has its shapes from ONNX inference, and the Loop converts."""
    import tensorflow as tf
    from onnx2tf_alt.ops.control import _prepared

    from onnx2tf_alt.ir.graph import graph_from_model

    body = helper.make_graph(
        [node("MatMul", ["h_in", "w"], "hw"),
         node("Unsqueeze", ["hw", "axis0"], "hw3"),
         node("Squeeze", ["hw3", "axis0"], "h_next"),
         node("Tanh", ["h_next"], "h_out"),
         node("Identity", ["cond_in"], "cond_out")],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("w", F, None),
         helper.make_tensor_value_info("h_in", F, None)],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("w", F, None),
         helper.make_tensor_value_info("h_out", F, None)],
        [onnx.numpy_helper.from_array(ints(0), "axis0")],
    )
    specs = [tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.bool),
             tf.TensorSpec([6, 6], tf.float32), tf.TensorSpec([2, 6], tf.float32)]
    prepared = graph_from_model(_prepared(body, {"": 18}, specs, {}))
    assert prepared.shapes["hw"] == (2, 6) and prepared.shapes["h_out"] == (2, 6)
    loop = node("Loop", ["trip", "", "w0", "h0"], ["w_last", "h_last"], body=body)
    feeds = {"trip": np.array(5, np.int64), "w0": rng.randn(6, 6) * 0.5, "h0": rng.randn(2, 6)}
    check_model(_typed_model([loop], feeds, {"w_last": (F, 2), "h_last": (F, 2)}), feeds)
