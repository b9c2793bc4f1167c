"""Control flow: If, Loop and Scan, inlined at conversion time where their course is known
(onnx2tf_alt/passes/control_flow.py) and run as tf.cond / tf.while_loop otherwise (ops/control.py).
Every case is compared with onnxruntime through TF and the float32 TFLite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.passes.control_flow import MAX_UNROLL, inline_control_flow

from harness import (
    assert_close,
    assert_keras_reloads,
    convert,
    count_tflite_ops,
    make_model,
    ort_run,
    tf_run,
    tflite_run,
)

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def _rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _check_feeds(model: onnx.ModelProto, feeds_list: list[dict], tflite: bool = True):
    """One conversion, compared with onnxruntime on several feeds (TF and TFLite)."""
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    converted = convert(model)
    content = tflite_bytes(converted.result) if tflite else None
    for feeds in feeds_list:
        expected = ort_run(model, feeds)
        for i, (a, e) in enumerate(zip(tf_run(converted, feeds), expected)):
            assert_close(a, e, what=f"TF output {i} {list(feeds)}")
        if tflite:
            for i, (a, e) in enumerate(zip(tflite_run(converted, feeds, content), expected)):
                assert_close(a, e, what=f"TFLite output {i}")
    converted.tflite = content
    return converted


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def _subgraph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def _graph(nodes, name, inputs, outputs, initializers=()):
    return helper.make_graph(nodes, name, inputs, outputs, list(initializers))


def _vi(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _branches(x: str = "x"):
    """then: x + c and a branch initializer as the second output; else: x * 3, relu(x)."""
    then = _graph(
        [helper.make_node("Add", [x, "c"], ["t_out"])],
        "then", [], [_vi("t_out", F), _vi("t_const", F, [2, 3, 4])],
        [numpy_helper.from_array(np.float32(1.5), "c"),
         numpy_helper.from_array(_rand(2, 3, 4), "t_const")],
    )
    other = _graph(
        [helper.make_node("Constant", [], ["three"], value_float=3.0),
         helper.make_node("Mul", [x, "three"], ["e_out"]),
         helper.make_node("Relu", [x], ["e_relu"])],
        "else", [], [_vi("e_out", F), _vi("e_relu", F)],
    )
    return then, other


# --- If -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cond", [True, False])
def test_if_constant_condition_is_inlined(cond):
    then, other = _branches()
    node = helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=other)
    x = _rand(2, 3, 4)
    model = make_model([node], {"x": x}, ["y", "z"], {"cond": np.array(cond)})
    converted = _check_feeds(model, [{"x": x}])
    assert "If" not in _op_types(converted.model)


def test_if_condition_folded_from_shape():
    then, other = _branches("xr")
    nodes = [
        helper.make_node("Relu", ["x"], ["xr"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["dim1"], axis=0),
        helper.make_node("Greater", ["dim1", "two"], ["cond"]),
        helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=other),
    ]
    x = _rand(2, 3, 4)
    inits = {"one": np.array(1, np.int64), "two": np.array(2, np.int64)}
    model = make_model(nodes, {"x": x}, ["y", "z"], inits)
    converted = _check_feeds(model, [{"x": x}])
    assert not _op_types(converted.model) & {"If", "Shape", "Greater"}


def test_if_runtime_condition_and_reload(tmp_path):
    weight = _rand(40, 40)  # large enough to become a layer weight
    then = _graph(
        [helper.make_node("MatMul", ["x", "w"], ["t_mm"]),
         helper.make_node("Add", ["t_mm", "bias"], ["t_out"])],
        "then", [], [_vi("t_out", F)],
    )
    other = _graph([helper.make_node("Sigmoid", ["x"], ["e_out"])], "else", [], [_vi("e_out", F)])
    nodes = [
        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Mul", ["y", "x"], ["out"]),
    ]
    x = _rand(3, 40)
    feeds = [{"x": x, "flag": np.array(v)} for v in (True, False)]
    model = make_model(nodes, feeds[0], ["out"], {"w": weight, "bias": _rand(40)})
    converted = _check_feeds(model, feeds)
    assert count_tflite_ops(converted.tflite).get("IF") == 1
    assert_keras_reloads(converted, feeds[1], tmp_path)


def test_if_runtime_condition_from_data_with_channel_last_neighbours():
    """cond = mean(x) > 0 at run time; the branches read a Conv output kept channel-last."""
    w = _rand(4, 3, 3, 3)
    then = _graph([helper.make_node("Relu", ["c"], ["t_out"])], "then", [], [_vi("t_out", F)])
    other = _graph([helper.make_node("Neg", ["c"], ["e_out"])], "else", [], [_vi("e_out", F)])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Conv", ["y", "w2"], ["out"]),
    ]
    x = _rand(1, 3, 6, 5)
    feeds = [{"x": x}, {"x": -np.abs(x)}, {"x": np.abs(x)}]
    inits = {"w": w, "w2": _rand(2, 4, 1, 1), "zero": np.float32(0)}
    _check_feeds(make_model(nodes, {"x": x}, ["out"], inits), feeds)


# --- Loop ---------------------------------------------------------------------------------
def _sum_body(extra_nodes=(), scan_name="s_scan"):
    """acc_out = acc_in + x * i; scan output acc_out * 2."""
    return _graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["x", "i_f"], ["xi"]),
            helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
            helper.make_node("Mul", ["acc_out", "two_f"], [scan_name]),
            *extra_nodes,
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [2, 3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [2, 3]), _vi(scan_name, F, [2, 3])],
        [numpy_helper.from_array(np.float32(2), "two_f")],
    )


def test_loop_constant_trip_count_is_unrolled():
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc", "scan"], body=_sum_body())
    x = _rand(2, 3)
    inits = {"trip": np.array(5, np.int64), "acc0": _rand(2, 3)}
    model = make_model([node], {"x": x}, ["acc", "scan"], inits)
    converted = _check_feeds(model, [{"x": x}])
    assert "Loop" not in _op_types(converted.model)


def test_unrolled_loop_between_convs_stays_channel_last():
    """acc += relu(c) * 0.5 three times on a Conv output: no TRANSPOSE after unrolling."""
    body = _graph(
        [
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Mul", ["r", "half"], ["rh"]),
            helper.make_node("Add", ["acc_in", "rh"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, None)],
        [_vi("cond_out", B, []), _vi("acc_out", F, None)],
        [numpy_helper.from_array(np.float32(0.5), "half")],
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Loop", ["trip", "", "c"], ["acc"], body=body),
        helper.make_node("Conv", ["acc", "w2"], ["out"]),
    ]
    x = _rand(2, 3, 6, 5)
    inits = {"w1": _rand(4, 3, 3, 3), "w2": _rand(2, 4, 1, 1), "trip": np.array(3, np.int64)}
    converted = _check_feeds(make_model(nodes, {"x": x}, ["out"], inits), [{"x": x}])
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)


def test_loop_runtime_trip_count(tmp_path):
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc", "scan"], body=_sum_body())
    x = _rand(2, 3)
    feeds = [{"x": x, "trip": np.array(n, np.int64)} for n in (1, 3, 6)]
    model = make_model([node], feeds[0], ["acc", "scan"], {"acc0": _rand(2, 3)})
    converted = _check_feeds(model, feeds)
    assert count_tflite_ops(converted.tflite).get("WHILE") == 1


@pytest.mark.parametrize("trip", [20, None])
def test_loop_runtime_condition_computed_in_body(trip):
    """while (sum < limit [and i < trip]): sum += |x|; scan output: the running sum."""
    body = _graph(
        [
            helper.make_node("Abs", ["x"], ["ax"]),
            helper.make_node("Add", ["acc_in", "ax"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["acc_scan"]),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [4])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [4]), _vi("acc_scan", F, [4])],
    )
    trip_name = "" if trip is None else "trip"
    node = helper.make_node("Loop", [trip_name, "go", "acc0"], ["acc", "sums"], body=body)
    x = np.abs(_rand(4)) + 0.1
    feeds = [{"x": x, "limit": np.array(v, np.float32), "go": np.array(True)}
             for v in (5.0, 0.5, 100.0)]
    inits = {"acc0": np.zeros(4, np.float32)}
    if trip is not None:
        inits["trip"] = np.array(trip, np.int64)
    converted = _check_feeds(make_model([node], feeds[0], ["acc", "sums"], inits), feeds)
    assert count_tflite_ops(converted.tflite).get("WHILE") == 1


def test_loop_constant_trip_count_above_unroll_limit():
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc", "scan"], body=_sum_body())
    x = _rand(2, 3) * 1e-3
    inits = {"trip": np.array(MAX_UNROLL + 4, np.int64), "acc0": _rand(2, 3)}
    converted = _check_feeds(make_model([node], {"x": x}, ["acc", "scan"], inits), [{"x": x}])
    assert "Loop" in _op_types(converted.model)


def test_constant_loop_above_unroll_limit_is_evaluated_at_conversion():
    """Everything the loop reads is constant: it runs once, at conversion time."""
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc", "scan"], body=_sum_body())
    nodes = [node, helper.make_node("Add", ["acc", "z"], ["y"])]
    inits = {"trip": np.array(MAX_UNROLL + 1, np.int64), "acc0": _rand(2, 3),
             "x": _rand(2, 3) * 1e-3}
    z = _rand(2, 3)
    converted = _check_feeds(make_model(nodes, {"z": z}, ["y", "scan"], inits), [{"z": z}])
    assert "WHILE" not in count_tflite_ops(converted.tflite)


def _growing_body(rows_in: list, rows_out: list) -> onnx.GraphProto:
    """A Loop body appending row * i to the carried rows (declared `rows_in` / `rows_out`)."""
    return _graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["row", "i_f"], ["new_row"]),
            helper.make_node("Concat", ["rows_in", "new_row"], ["rows_out"], axis=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("rows_in", F, rows_in)],
        [_vi("cond_out", B, []), _vi("rows_out", F, rows_out)],
    )


def test_loop_with_growing_carried_value():
    """The carried value grows by one row per iteration (a concatenation)."""
    body = _growing_body(["n", 3], ["n", 3])
    node = helper.make_node("Loop", ["trip", "", "rows0"], ["rows"], body=body)
    row = _rand(1, 3)
    feeds = [{"row": row, "trip": np.array(n, np.int64)} for n in (2, 4)]
    _check_feeds(make_model([node], feeds[0], ["rows"], {"rows0": row}), feeds)


def test_loop_growing_from_an_empty_constant_keeps_its_rank():
    """torchvision's Mask/Keypoint R-CNN paste one result per box onto a (0, ...) constant
    by concatenation in a Loop: ONNX inference leaves that output without any shape (its
    first dim differs between the initial value and the body), and ops after it that need
    the rank (Gather of one column, Unsqueeze) failed to convert."""
    body = _growing_body([None, 3], ["n_rows", "n_columns"])  # symbolic dims as torch writes
    nodes = [
        helper.make_node("Constant", [], ["rows0"], value=numpy_helper.from_array(
            np.zeros((0, 3), np.float32))),
        helper.make_node("Loop", ["trip", "", "rows0"], ["rows"], body=body),
        helper.make_node("Gather", ["rows", "one"], ["column"], axis=1),
        helper.make_node("Unsqueeze", ["column", "zero"], ["y"]),
    ]
    inits = {"one": np.array(1, np.int64), "zero": np.array([0], np.int64)}
    feeds = [{"row": _rand(1, 3), "trip": np.array(n, np.int64)} for n in (3, 1, 0)]
    model = make_model(nodes, feeds[0], ["y"], inits)
    model.graph.output[0].CopyFrom(_vi("y", F, [1, "n"]))
    _check_feeds(model, feeds)


def test_if_output_sliced_past_its_run_time_length():
    """torchvision's batched_nms returns an empty constant in one branch and the kept
    boxes in the other, then keeps the first post_nms_top_n: fewer kept than that must
    give them all (TFLite's IF output has no shape, so the slice became a SLICE of static
    size that the builtin kernel refuses)."""
    then = _graph([helper.make_node("Constant", [], ["t_out"], value=numpy_helper.from_array(
        np.zeros(0, np.int64)))], "then", [], [_vi("t_out", I64, [0])])
    other = _graph([helper.make_node("NonZero", ["x"], ["nz"]),
                    helper.make_node("Reshape", ["nz", "flat"], ["e_out"])],
                   "else", [], [_vi("e_out", I64, [None])])
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
        helper.make_node("Less", ["top", "limit"], ["empty"]),
        helper.make_node("If", ["empty"], ["kept"], then_branch=then, else_branch=other),
        helper.make_node("Slice", ["kept", "start", "end"], ["y"]),
    ]
    inits = {"limit": np.array(0.5, np.float32), "flat": np.array([-1], np.int64),
             "start": np.array([0], np.int64), "end": np.array([6], np.int64)}
    sparse, dense = np.zeros(20, np.float32), np.ones(20, np.float32)
    sparse[[2, 5, 11]] = 1.0
    feeds = [{"x": x} for x in (sparse, dense, np.zeros(20, np.float32))]
    _check_feeds(make_model(nodes, feeds[0], ["y"], inits), feeds)


def _parity_if(name: str):
    """An If on (i % 2 == 0): even iterations add x, odd ones subtract it."""
    then = _graph([helper.make_node("Add", ["acc_in", "x"], [f"{name}_t"])], "then", [],
                  [_vi(f"{name}_t", F)])
    other = _graph([helper.make_node("Sub", ["acc_in", "x"], [f"{name}_e"])], "else", [],
                   [_vi(f"{name}_e", F)])
    return [
        helper.make_node("Mod", ["i", "two_i"], ["parity"]),
        helper.make_node("Equal", ["parity", "zero_i"], ["even"]),
        helper.make_node("If", ["even"], ["acc_out"], then_branch=then, else_branch=other),
    ]


def _parity_body(cond_nodes):
    return _graph(
        [*_parity_if("p"), *cond_nodes],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [2, 3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [2, 3])],
        [numpy_helper.from_array(np.array(2, np.int64), "two_i"),
         numpy_helper.from_array(np.array(0, np.int64), "zero_i")],
    )


def test_nested_if_in_constant_loop_is_inlined():
    true = numpy_helper.from_array(np.array(True), "true")
    body = _parity_body([helper.make_node("Constant", [], ["cond_out"], value=true)])
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc"], body=body)
    x = _rand(2, 3)
    inits = {"trip": np.array(5, np.int64), "acc0": _rand(2, 3)}
    converted = _check_feeds(make_model([node], {"x": x}, ["acc"], inits), [{"x": x}])
    assert not _op_types(converted.model) & {"If", "Loop"}


def test_nested_if_in_runtime_loop():
    body = _parity_body([helper.make_node("Identity", ["cond_in"], ["cond_out"])])
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["acc"], body=body)
    x = _rand(2, 3)
    feeds = [{"x": x, "trip": np.array(n, np.int64)} for n in (1, 4, 7)]
    converted = _check_feeds(make_model([node], feeds[0], ["acc"], {"acc0": _rand(2, 3)}), feeds)
    assert count_tflite_ops(converted.tflite).get("WHILE") == 1


# --- Scan ---------------------------------------------------------------------------------
def _scan_model(directions, length_dim):
    """state += a_t * b_t; scan outputs: the state (axis 0) and a_t - b_t (last axis)."""
    body = _graph(
        [
            helper.make_node("Mul", ["a_t", "b_t"], ["ab"]),
            helper.make_node("Add", ["state_in", "ab"], ["state_out"]),
            helper.make_node("Sub", ["a_t", "b_t"], ["diff"]),
            helper.make_node("Identity", ["state_out"], ["state_copy"]),
        ],
        "body",
        [_vi("state_in", F, [3]), _vi("a_t", F, [3]), _vi("b_t", F, [3])],
        [_vi("state_out", F, [3]), _vi("state_copy", F, [3]), _vi("diff", F, [3])],
    )
    node = helper.make_node(
        "Scan", ["s0", "a", "b"], ["state", "states", "diffs"], body=body, num_scan_inputs=2,
        scan_input_axes=[0, 1], scan_input_directions=list(directions),
        scan_output_axes=[0, -1], scan_output_directions=[directions[1], 0],
    )
    feeds = {"s0": _rand(3), "a": _rand(5, 3), "b": _rand(3, 5)}
    shapes = {"a": [length_dim, 3], "b": [3, length_dim]}
    return make_model([node], feeds, ["state", "states", "diffs"], input_shapes=shapes), feeds


@pytest.mark.parametrize("directions", [(0, 0), (0, 1), (1, 1)])
def test_scan_static_length_is_unrolled(directions):
    model, feeds = _scan_model(directions, 5)
    converted = _check_feeds(model, [feeds])
    assert "Scan" not in _op_types(converted.model)


@pytest.mark.parametrize("directions", [(0, 1), (1, 0)])
def test_scan_runtime_length(directions):
    model, feeds = _scan_model(directions, "T")
    shorter = {"s0": feeds["s0"], "a": feeds["a"][:2], "b": feeds["b"][:, :2]}
    converted = _check_feeds(model, [feeds, shorter])
    assert count_tflite_ops(converted.tflite).get("WHILE") == 1


@pytest.mark.parametrize("directions", [[0, 0], [1, 0]])
def test_scan8_batched_is_unrolled(directions):
    """Scan-8: batch axis first, the body sees one batch entry; no sequence_lens."""
    model, _ = _scan_model((0, 0), 5)
    body = _subgraph(model.graph.node[0], "body")
    node = helper.make_node("Scan", ["", "s0", "a", "b"], ["state", "states", "diffs"],
                            body=body, num_scan_inputs=2, directions=directions)
    feeds = {"s0": _rand(2, 3), "a": _rand(2, 4, 3), "b": _rand(2, 4, 3)}
    model = make_model([node], feeds, ["state", "states", "diffs"], opset=8)
    converted = _check_feeds(model, [feeds])
    assert "Scan" not in _op_types(converted.model)


# --- the pass on its own ------------------------------------------------------------------
def test_pass_keeps_runtime_control_flow_and_renames_uniquely():
    """A constant loop inside a runtime If is unrolled in place; names stay unique."""
    node = helper.make_node("Loop", ["trip", "", "acc0"], ["l_acc", "l_scan"], body=_sum_body())
    then = _graph([node], "then", [], [_vi("l_acc", F)])
    other = _graph([helper.make_node("Neg", ["x"], ["neg"])], "else", [], [_vi("neg", F)])
    top = helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)
    x = _rand(2, 3)
    feeds = {"x": x, "flag": np.array(True)}
    inits = {"trip": np.array(3, np.int64), "acc0": _rand(2, 3)}
    model = make_model([top], feeds, ["y"], inits)
    before = ort_run(model, feeds)
    assert inline_control_flow(model)
    assert [n.op_type for n in model.graph.node] == ["If"]
    inner = _subgraph(model.graph.node[0], "then_branch").node
    assert "Loop" not in {n.op_type for n in inner} and not inline_control_flow(model)
    outputs = [o for n in inner for o in n.output]
    assert len(outputs) == len(set(outputs))
    assert_close(ort_run(model, feeds)[0], before[0])


# --- PyTorch ------------------------------------------------------------------------------
def test_torch_scripted_loop(tmp_path):
    torch = pytest.importorskip("torch")

    def accumulate(x, n: int):
        acc = torch.zeros_like(x)
        for i in range(n):
            acc = acc * 0.5 + torch.tanh(x + float(i))
        return acc

    scripted = torch.jit.script(accumulate)

    class Wrapper(torch.nn.Module):
        def forward(self, x):
            return scripted(x, 4)

    path = tmp_path / "loop.onnx"
    x = _rand(2, 5)
    torch.onnx.export(Wrapper(), (torch.from_numpy(x),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], opset_version=17)
    model = onnx.load(str(path))
    assert "Loop" in _op_types(model)
    converted = _check_feeds(model, [{"x": x}])
    assert "Loop" not in _op_types(converted.model)
