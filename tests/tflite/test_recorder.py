"""The direct writer runs a handler's own code on its Recorder (onnx2tf_alt/tflite/recorder.py)
where the op has no `@direct` writer or its values are integers or booleans: token ids,
masks, integer arithmetic and comparisons, written without TensorFlow, checked against
onnxruntime and against the TF route's file of the same plan (test_direct.both_routes)."""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import pytest
from onnx import numpy_helper

from onnx2tf_alt.ir.loader import load_model
from onnx2tf_alt.pipeline import plan_loaded
from onnx2tf_alt.tflite.direct import NotCovered, write_direct

from cli_runner import cli_env
from harness import both_routes, count_tflite_ops, ints, make_model, node

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _values_of_this_test(request):
    """Each test draws its own values, seeded by its name, whatever ran before it."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def token_model(batch: int, length: int):
    """Token ids and an attention mask as a transformer's first nodes take them: embedding
    rows gathered at the ids, the mask cast to float and broadcast over the width, padding
    (id 0) replaced by a constant, and the mask's count per row as an int64 output."""
    ids = RNG.integers(0, 50, (batch, length)).astype(np.int64)
    ids[0, :2] = 0
    mask = RNG.integers(0, 2, (batch, length)).astype(np.int64)
    nodes = [node("Gather", ["emb", "ids"], "e"),
             node("Cast", ["mask"], "mf", to=1),
             node("Unsqueeze", ["mf", "at2"], "mf3"),
             node("Mul", ["e", "mf3"], "em"),
             node("Equal", ["ids", "zero"], "pad"),
             node("Not", ["pad"], "real"),
             node("Unsqueeze", ["pad", "at2"], "pad3"),
             node("Where", ["pad3", "fill", "em"], "y"),
             node("ReduceSum", ["mask", "at1"], "count", keepdims=0),
             node("Cast", ["real"], "real_count", to=7)]
    inits = {"emb": RNG.standard_normal((50, 6)).astype(np.float32), "at2": ints(2),
             "at1": ints(1), "zero": np.array(0, np.int64), "fill": np.float32(-1.0)}
    return make_model(nodes, {"ids": ids, "mask": mask}, ["y", "count", "real_count"],
                      inits), {"ids": ids, "mask": mask}


@pytest.mark.parametrize(("batch", "length"), [(1, 8), (3, 7)])
def test_token_ids_and_masks_are_written_directly(batch, length):
    model, feeds = token_model(batch, length)
    result = both_routes(model, feeds)
    assert {"GATHER", "CAST", "EQUAL", "SELECT_V2", "SUM"} <= set(count_tflite_ops(
        result.content))


INTEGER_OPS = ["Add", "Sub", "Mul", "Max", "Min", "Greater", "Less", "Equal"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", INTEGER_OPS)
def test_integer_arithmetic_and_comparisons_broadcast(op, dtype):
    a = RNG.integers(-20, 20, (2, 1, 5)).astype(dtype)
    b = RNG.integers(-20, 20, (4, 1)).astype(dtype)
    model = make_model([node(op, ["a", "b"], "y")], {"a": a, "b": b}, ["y"])
    both_routes(model, {"a": a, "b": b})


def test_expand_tile_and_stepped_slices_of_integers():
    x = RNG.integers(0, 100, (2, 1, 6)).astype(np.int64)
    nodes = [node("Expand", ["x", "shape"], "wide"),
             node("Tile", ["wide", "reps"], "tiled"),
             node("Slice", ["tiled", "starts", "ends", "axes", "steps"], "y")]
    inits = {"shape": ints(2, 3, 6), "reps": ints(1, 2, 1), "starts": ints(1, 0),
             "ends": ints(6, 5), "axes": ints(1, 2), "steps": ints(2, 2)}
    model = make_model(nodes, {"x": x}, ["y"], inits)
    both_routes(model, {"x": x})


def test_casts_of_one_value_to_two_types_stay_two():
    """Two CASTs of one tensor differ by their outputs' types only: the writer's merge of
    duplicate ops (direct_rewrites.merge_duplicates) must not merge them."""
    x = np.abs(RNG.standard_normal((3, 4))).astype(np.float32) * 10  # uint8 holds them
    nodes = [node("Cast", ["x"], "i32", to=6), node("Cast", ["x"], "u8", to=2),
             node("Cast", ["i32"], "f1", to=1), node("Cast", ["u8"], "f2", to=1),
             node("Add", ["f1", "f2"], "y")]
    model = make_model(nodes, {"x": x}, ["y"])
    result = both_routes(model, {"x": x})
    assert count_tflite_ops(result.content)["CAST"] == 4


@pytest.mark.parametrize("op", ["Erf", "Softplus", "Tan"])
def test_a_float_op_without_a_direct_writer_is_written_from_its_handler(op):
    """No `@direct` writer: the handler's composition of builtins, recorded."""
    x = (RNG.standard_normal((3, 2, 5)) * 0.7).astype(np.float32)
    model = make_model([node(op, ["x"], "y")], {"x": x}, ["y"])
    both_routes(model, {"x": x})


def test_a_function_the_recorder_lacks_is_named_and_left_to_tf():
    """CumProd over an axis longer than its handler unrolls calls tf.math.cumprod (a Select
    TF op in TFLite), which the Recorder does not have: the model is not written directly,
    and the reason names the node and the function."""
    x = RNG.uniform(0.9, 1.1, (2, 80)).astype(np.float32)
    model = make_model([node("CumProd", ["x", "axis"], "y")], {"x": x}, ["y"],
                       {"axis": np.array(1, np.int64)}, opset=26)
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, NotCovered)
    assert "(CumProd): tf.math.cumprod in the direct writer" in str(result), str(result)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_positions_from_a_mask_by_cumulative_sum(exclusive, reverse):
    """position_ids = cumsum(attention_mask) - 1, as transformers computes them where a
    decoder is called without them (int64, CUMSUM), beside a float CumSum on axis 2."""
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], np.int64)
    x = RNG.standard_normal((3, 2, 6)).astype(np.float32)
    nodes = [node("CumSum", ["mask", "one"], "count", exclusive=exclusive, reverse=reverse),
             node("Sub", ["count", "one"], "positions"),
             node("CumSum", ["x", "two"], "y", exclusive=exclusive, reverse=reverse)]
    model = make_model(nodes, {"mask": mask, "x": x}, ["positions", "y"],
                       {"one": np.array(1, np.int64), "two": np.array(2, np.int64)})
    ops = count_tflite_ops(both_routes(model, {"mask": mask, "x": x}).content)
    assert ops["CUMSUM"] == 2, ops


def fresh_process(script: str) -> str:
    """`script` run by a new Python (no TensorFlow loaded); its stdout. It must exit 0."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=cli_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("make", [lambda: token_model(2, 5), lambda: if_model(1),
                                  lambda: loop_model(3)], ids=["tokens", "if", "loop"])
def test_a_dms_run_imports_no_tensorflow(tmp_path, make):
    """Token ids, an If and a Loop by run-time values: written without TensorFlow."""
    import onnx

    model, _ = make()
    path = tmp_path / "tokens.onnx"
    onnx.save(model, path)
    script = (
        "import sys\n"
        "from onnx2tf_alt.cli.main import main\n"
        f"code = main(['-i', {str(path)!r}, '-o', {str(tmp_path / 'out')!r}, '-dms', '-n', "
        "'--tflite_writer', 'direct'])\n"
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
        "sys.exit(code)\n"
    )
    fresh_process(script)
    assert (tmp_path / "out" / "tokens_float32.tflite").is_file()


def test_tensorflow_cannot_be_imported_while_recording():
    """A handler that imports TensorFlow itself is not written by the Recorder, and the
    import does not happen (in a fresh process: this one may have TF loaded)."""
    script = (
        "import sys\n"
        "from onnx2tf_alt.tflite.flatgraph import NotCovered\n"
        "from onnx2tf_alt.tflite.recorder import _tensorflow_not_imported\n"
        "try:\n"
        "    with _tensorflow_not_imported():\n"
        "        import tensorflow\n"
        "except NotCovered as error:\n"
        "    print(error)\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    assert "its handler's code imports tensorflow" in fresh_process(script)


def test_attention_with_run_time_operands_and_top_k():
    """Products of two run-time values (BATCH_MATMUL), a softmax over scores, and the
    indices of the best ones (TOPK_V2, ARG_MAX): a detector's or a decoder's tail."""
    q = RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)
    k = RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)
    nodes = [node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], "scores"),
             node("Softmax", ["scores"], "p", axis=-1),
             node("TopK", ["p", "two"], ["best", "where"], axis=-1),
             node("ArgMax", ["scores"], "first", axis=-1, keepdims=0)]
    model = make_model(nodes, {"q": q, "k": k}, ["best", "where", "first"],
                       {"two": ints(2)})
    ops = count_tflite_ops(both_routes(model, {"q": q, "k": k}).content)
    assert {"BATCH_MATMUL", "TOPK_V2", "ARG_MAX"} <= set(ops), ops


@pytest.mark.parametrize("keepdims", [0, 1])
def test_sizes_known_only_at_run_time(keepdims):
    """Axes, shapes, counts and bounds fed as inputs: SUM over run-time axes, RESHAPE to a
    run-time shape, RANGE, FILL, TOPK_V2 by a run-time k and STRIDED_SLICE by run-time
    bounds, each value's dims computed by the interpreter; the planned shape of a node's
    output is kept, so the Relu after the reduction is written by its own writer."""
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    feeds = {"x": x, "axes": ints(1, 3), "shape": ints(6, 20), "n": np.array(7, np.int64),
             "k": ints(3), "ends": ints(2, 4)}
    nodes = [node("ReduceSum", ["x", "axes"], "s", keepdims=keepdims),
             node("Relu", ["s"], "r"),
             node("Reshape", ["x", "shape"], "flat"),
             node("Range", ["zero", "n", "one"], "positions"),
             node("ConstantOfShape", ["shape"], "filled",
                  value=numpy_helper.from_array(np.array([1.5], np.float32))),
             node("TopK", ["flat", "k"], ["best", "where"], axis=-1),
             node("Slice", ["x", "starts", "ends", "axes"], "part")]
    model = make_model(nodes, feeds, ["r", "positions", "filled", "best", "where", "part"],
                       {"zero": np.array(0, np.int64), "one": np.array(1, np.int64),
                        "starts": ints(0, 1)})
    ops = count_tflite_ops(both_routes(model, feeds).content)
    assert {"SUM", "RANGE", "FILL", "TOPK_V2", "STRIDED_SLICE"} <= set(ops), ops


@pytest.mark.parametrize(("group", "kernel"), [(1, (3, 3)), (2, (1, 3)), (4, (3, 3))])
def test_convolution_by_run_time_weights(group, kernel):
    """Weights fed as an input (a hypernetwork's, a dynamic filter's): CONV_2D or
    DEPTHWISE_CONV_2D reading them through a TRANSPOSE, as TF's converter writes them."""
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 4 // group, *kernel)).astype(np.float32)
    feeds = {"x": x, "w": w}
    model = make_model([node("Conv", ["x", "w"], "y", group=group, pads=[1, 1, 1, 1],
                             strides=[1, 2])], feeds, ["y"])
    ops = count_tflite_ops(both_routes(model, feeds).content)
    assert ops.get("CONV_2D", 0) + ops.get("DEPTHWISE_CONV_2D", 0) == 1, ops


def if_model(sign: int):
    """An If whose condition is computed at run time (the sign of x's sum): its then branch
    computes from x and a constant of the enclosing graph, its else branch from x alone."""
    from onnx import TensorProto, helper

    x = np.abs(RNG.standard_normal((2, 3)).astype(np.float32)) * sign
    then_branch = helper.make_graph(
        [node("Mul", ["x", "x"], "sq"), node("Add", ["sq", "bias"], "t_out")], "then", [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2, 3])])
    else_branch = helper.make_graph(
        [node("Neg", ["x"], "e_out")], "else", [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2, 3])])
    nodes = [node("ReduceSum", ["x"], "total", keepdims=0),
             node("Greater", ["total", "zero"], "positive"),
             node("If", ["positive"], "y", then_branch=then_branch, else_branch=else_branch),
             node("Relu", ["y"], "z")]
    inits = {"zero": np.array(0, np.float32), "bias": np.full((2, 3), 0.5, np.float32)}
    return make_model(nodes, {"x": x}, ["z"], inits), {"x": x}


@pytest.mark.parametrize("sign", [1, -1])
def test_if_by_a_run_time_condition_runs_branch_subgraphs(sign):
    """IF with two subgraphs, each reading the enclosing graph's values it needs as inputs
    (the form of torchvision's `boxes.numel() == 0` branch in batched NMS); both conditions
    against onnxruntime and the TF route."""
    ops = count_tflite_ops(both_routes(*if_model(sign)).content)
    assert ops["IF"] == 1, ops


def loop_model(steps: int):
    """A Loop whose trip count is an input, its body reading a weight and a value of the
    enclosing graph, carrying a state and stacking a scan output (a greedy decoder's form)."""
    from onnx import TensorProto, helper

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    body = helper.make_graph(
        [node("MatMul", ["state", "w"], "mixed"), node("Add", ["mixed", "x"], "summed"),
         node("Tanh", ["summed"], "next"), node("Identity", ["cond_in"], "cond_out"),
         node("ReduceMax", ["next"], "best", axes=[1], keepdims=0)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("next", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("best", TensorProto.FLOAT, [2])])
    nodes = [node("Loop", ["steps", "go", "x"], ["final", "bests"], body=body)]
    inits = {"go": np.array(True), "w": RNG.standard_normal((3, 3)).astype(np.float32)}
    feeds = {"x": x, "steps": np.array(steps, np.int64)}
    return make_model(nodes, feeds, ["final", "bests"], inits, opset=13), feeds


@pytest.mark.parametrize("steps", [1, 4])
def test_loop_by_a_run_time_trip_count_runs_a_while_subgraph(steps):
    """WHILE with a condition and a body subgraph, the enclosing values the body reads
    passed through each step; against onnxruntime and the TF route."""
    ops = count_tflite_ops(both_routes(*loop_model(steps)).content)
    assert ops["WHILE"] == 1, ops
