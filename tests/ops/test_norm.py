"""Normalization ops against onnxruntime, through the TF model and the float32 TFLite."""

import numpy as np
import onnx
import pytest
import tf_keras
from onnx import helper, numpy_helper

from onnx2tf_alt.errors import ConversionError
from onnx2tf_alt.tflite.lowering import tflite_bytes

from harness import (
    Rng,
    assert_close,
    check_model,
    check_node,
    convert,
    count_tflite_ops,
    make_model,
    ort_run,
    tensor_info,
    tf_run,
    tflite_run,
    to_physical,
)

rng = Rng(0)


def positive(*shape):
    return rng.uniform(0.2, 2.0, shape).astype(np.float32)


def bn_params(*shape):
    return {"scale": rng.randn(*shape), "bias": rng.randn(*shape), "mean": rng.randn(*shape),
            "var": positive(*shape)}


def conv_weights(out_ch, in_ch):
    return rng.randn(out_ch, in_ch, 3, 3), rng.randn(out_ch)


def tflite_census(converted) -> dict[str, int]:
    """TFLite op counts, asserting the channel-last path needed no TRANSPOSE and no Flex op."""
    counts = count_tflite_ops(tflite_bytes(converted.result))
    assert "TRANSPOSE" not in counts, counts
    assert not any(name.startswith("Flex") for name in counts), counts
    return counts


def check_against(model, reference, feeds):
    """Convert `model`; compare with onnxruntime running an equivalent `reference` model
    (for cases onnxruntime's own kernel does not cover)."""
    expected = ort_run(reference, feeds)
    converted = convert(model)
    for run, what in ((tf_run, "TF"), (tflite_run, "TFLite")):
        for i, (a, e) in enumerate(zip(run(converted, feeds), expected)):
            assert_close(a, e, what=f"{what} output {i}")


# --- BatchNormalization ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3), (2, 5, 7), (2, 3, 5, 7), (2, 3, 4, 5, 3)])
@pytest.mark.parametrize("epsilon", [1e-5, 0.1])
def test_batch_norm(shape, epsilon):
    check_node("BatchNormalization", {"x": rng.randn(*shape)}, {"epsilon": epsilon},
               bn_params(shape[1]), opset=15)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5, 7), (3, 2, 4, 5, 3)])
@pytest.mark.parametrize("momentum", [0.9, 0.4])
def test_batch_norm_training_mode(shape, momentum):
    """Batch statistics normalize; running mean and variance come back updated."""
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["y", "running_mean", "running_var"], training_mode=1,
                              momentum=momentum)]
    feeds = {"x": rng.randn(*shape) * 2 + 0.5}
    params = bn_params(shape[1])
    model = make_model(nodes, feeds, ["y", "running_mean", "running_var"], params, opset=15)
    check_model(model, feeds)


@pytest.mark.parametrize("opset", [7, 9, 14])
def test_batch_norm_opsets(opset):
    check_node("BatchNormalization", {"x": rng.randn(2, 4, 3, 5)}, {}, bn_params(4), opset=opset)


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5)])
def test_batch_norm_not_spatial(shape):
    check_node("BatchNormalization", {"x": rng.randn(*shape)}, {"spatial": 0},
               bn_params(*shape[1:]), opset=7)


def test_batch_norm_runtime_params():
    inputs = {"x": rng.randn(2, 3, 5, 4), **bn_params(3)}
    check_node("BatchNormalization", inputs, {"epsilon": 1e-3}, opset=15)


def test_batch_norm_runtime_params_not_spatial():
    inputs = {"x": rng.randn(2, 3, 5, 4), **bn_params(3, 5, 4)}
    check_node("BatchNormalization", inputs, {"spatial": 0}, opset=7)


def test_batch_norm_saved_statistics_are_reported():
    """Opset 9 training outputs (saved mean / variance) are refused with a clear reason."""
    outputs = ["y", "running_mean", "running_var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], outputs)
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [node], "bn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, [2, 3, 4, 4] if o == "y" else [3])
         for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in bn_params(3).items()],
    ), opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(ConversionError, match="saved-statistics outputs"):
        convert(model)


def test_conv_batch_norm_relu_conv_chain():
    w1, b1 = conv_weights(6, 3)
    w2, b2 = conv_weights(4, 6)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"]),
    ]
    inits = {"w1": w1, "b1": b1, **bn_params(6), "w2": w2, "b2": b2}
    feeds = {"x": rng.randn(2, 3, 9, 7)}
    converted = check_model(make_model(nodes, feeds, ["y"], inits, opset=15), feeds)
    counts = tflite_census(converted)
    assert "MUL" not in counts and "ADD" not in counts, counts  # folded into the first conv


# --- InstanceNormalization ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 4, 5, 3), (2, 3, 4, 5, 3)])
@pytest.mark.parametrize("opset", [7, 22])
def test_instance_norm(shape, opset):
    c = shape[1]
    check_node("InstanceNormalization", {"x": rng.randn(*shape)}, {"epsilon": 1e-3},
               {"scale": rng.randn(c), "bias": rng.randn(c)}, opset=opset)


def test_instance_norm_runtime_params():
    inputs = {"x": rng.randn(2, 5, 4, 3), "scale": rng.randn(5), "bias": rng.randn(5)}
    check_node("InstanceNormalization", inputs)


def test_conv_instance_norm_conv_chain():
    w1, b1 = conv_weights(5, 3)
    w2, b2 = conv_weights(4, 5)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("InstanceNormalization", ["c1", "scale", "bias"], ["n"]),
        helper.make_node("Conv", ["n", "w2", "b2"], ["y"]),
    ]
    inits = {"w1": w1, "b1": b1, "scale": rng.randn(5), "bias": rng.randn(5), "w2": w2, "b2": b2}
    feeds = {"x": rng.randn(2, 3, 9, 8)}
    tflite_census(check_model(make_model(nodes, feeds, ["y"], inits), feeds))


# --- LayerNormalization ------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, axis, bias",
    [
        ((2, 5, 7), -1, True),
        ((2, 3, 4, 5), 1, True),
        ((2, 3, 4, 5), 2, False),
        ((2, 3, 4, 5), -3, True),
        ((2, 3, 4, 5), 0, True),
        ((3, 7), 1, False),
        ((2, 3, 2, 3, 4), 3, True),
    ],
)
def test_layer_norm(shape, axis, bias):
    norm_shape = shape[axis:]
    inits = {"scale": rng.randn(*norm_shape)}
    if bias:
        inits["bias"] = rng.randn(*norm_shape)
    check_node("LayerNormalization", {"x": rng.randn(*shape)}, {"axis": axis, "epsilon": 1e-3},
               inits, num_outputs=3, opset=17)


def test_layer_norm_broadcast_scale_runtime():
    """Scale and bias of lower rank than the normalized shape, given at run time."""
    inputs = {"x": rng.randn(2, 3, 4, 5), "scale": rng.randn(5), "bias": rng.randn(4, 1)}
    check_node("LayerNormalization", inputs, {"axis": 2}, opset=17)


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_conv_layer_norm_conv_chain(axis):
    """LayerNormalization on a channel-last tensor: its axes and scale follow the perm."""
    w1, b1 = conv_weights(6, 3)
    w2, b2 = conv_weights(4, 6)
    norm_shape = (6, 7, 5)[axis - 1 if axis > 0 else axis:]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("LayerNormalization", ["c1", "scale", "bias"], ["n", "mean", "inv"],
                         axis=axis),
        helper.make_node("Conv", ["n", "w2", "b2"], ["y"]),
    ]
    inits = {"w1": w1, "b1": b1, "scale": rng.randn(*norm_shape), "bias": rng.randn(*norm_shape),
             "w2": w2, "b2": b2}
    feeds = {"x": rng.randn(2, 3, 9, 7)}
    model = make_model(nodes, feeds, ["y", "mean", "inv"], inits, opset=17)
    tflite_census(check_model(model, feeds))


# --- GroupNormalization ------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, groups",
    [((2, 6, 7), 3), ((2, 6, 5, 3), 2), ((2, 4, 5, 3), 1), ((2, 4, 3, 5), 4),
     ((2, 6, 3, 4, 2), 3)],
)
def test_group_norm(shape, groups):
    c = shape[1]
    check_node("GroupNormalization", {"x": rng.randn(*shape)},
               {"num_groups": groups, "epsilon": 1e-3},
               {"scale": rng.randn(c), "bias": rng.randn(c)}, opset=21)


def test_group_norm_runtime_params():
    inputs = {"x": rng.randn(2, 6, 5, 4), "scale": rng.randn(6), "bias": rng.randn(6)}
    check_node("GroupNormalization", inputs, {"num_groups": 3}, opset=21)


@pytest.fixture
def tolerate_deprecated_ops(monkeypatch):
    """GroupNormalization-18 is deprecated, so today's onnx checker rejects models that use
    it; they still exist and onnxruntime runs them."""
    strict = onnx.checker.check_model

    def check_model_tolerant(model, *args, **kwargs):
        try:
            strict(model, *args, **kwargs)
        except onnx.checker.ValidationError as exc:
            if "deprecated" not in str(exc):
                raise

    monkeypatch.setattr(onnx.checker, "check_model", check_model_tolerant)


@pytest.mark.parametrize("shape, groups", [((2, 6, 5, 3), 3), ((2, 4, 7), 2)])
def test_group_norm_18_per_group_scale(tolerate_deprecated_ops, shape, groups):
    x = rng.randn(*shape)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"],
                            num_groups=groups, epsilon=1e-4)
    inits = [numpy_helper.from_array(rng.randn(groups), "scale"),
             numpy_helper.from_array(rng.randn(groups), "bias")]
    graph = helper.make_graph([node], "test", [tensor_info("x", x)], [tensor_info("y", x)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    check_model(model, {"x": x})


def test_conv_group_norm_conv_chain():
    w1, b1 = conv_weights(6, 3)
    w2, b2 = conv_weights(4, 6)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("GroupNormalization", ["c1", "scale", "bias"], ["n"], num_groups=2),
        helper.make_node("Conv", ["n", "w2", "b2"], ["y"]),
    ]
    inits = {"w1": w1, "b1": b1, "scale": rng.randn(6), "bias": rng.randn(6), "w2": w2, "b2": b2}
    feeds = {"x": rng.randn(2, 3, 8, 9)}
    model = make_model(nodes, feeds, ["y"], inits, opset=21)
    # ONNX has no shape inference for GroupNormalization-21; exporters write value_info.
    model.graph.value_info.append(tensor_info("n", np.float32, (2, 6, 6, 7)))
    tflite_census(check_model(model, feeds))


# --- LRN ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [{"size": 3}, {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, {"size": 1},
     {"size": 7, "alpha": 0.3, "beta": 1.0, "bias": 1.5}],
)
def test_lrn(attrs):
    check_node("LRN", {"x": rng.randn(2, 6, 5, 3)}, attrs, opset=13)


def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float):
    """LRN written with ops onnxruntime runs for every rank and size: the channel window
    sum is an AveragePool over channels with the spec's padding, times the window size."""
    rank = x.ndim
    to_last = [0, *range(2, rank), 1]
    back = list(np.argsort(to_last))
    before = (size - 1) // 2
    consts = {
        "flat": np.array([-1, 1, x.shape[1]], np.int64),
        "n": np.array(size, np.float32),
        "bias": np.array(bias, np.float32),
        "k": np.array(alpha / size, np.float32),
        "beta": np.array(beta, np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Transpose", ["sq"], ["sq_last"], perm=to_last),
        helper.make_node("Shape", ["sq_last"], ["last_shape"]),
        helper.make_node("Reshape", ["sq_last", "flat"], ["rows"]),
        helper.make_node("AveragePool", ["rows"], ["avg"], kernel_shape=[size],
                         pads=[before, size - 1 - before], count_include_pad=1),
        helper.make_node("Mul", ["avg", "n"], ["sums"]),
        helper.make_node("Reshape", ["sums", "last_shape"], ["sums_last"]),
        helper.make_node("Transpose", ["sums_last"], ["window_sum"], perm=back),
        helper.make_node("Mul", ["window_sum", "k"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["base"]),
        helper.make_node("Pow", ["base", "beta"], ["den"]),
        helper.make_node("Div", ["x", "den"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], consts, opset=13)


def lrn_node_model(x, size, alpha, beta, bias):
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    return make_model([node], {"x": x}, ["y"], opset=13)


def test_lrn_reference_matches_onnxruntime_kernel():
    x = rng.randn(2, 7, 4, 3)
    args = (5, 0.2, 0.8, 1.5)
    expected = ort_run(lrn_node_model(x, *args), {"x": x})[0]
    assert_close(ort_run(lrn_reference(x, *args), {"x": x})[0], expected)


@pytest.mark.parametrize(
    "shape, size",
    [((2, 6, 5, 3), 2), ((2, 7, 4, 3), 4), ((2, 5, 7), 3), ((2, 6, 7), 2),
     ((2, 5, 3, 4, 2), 3), ((2, 6, 3, 2, 3), 4)],
)
def test_lrn_even_sizes_and_other_ranks(shape, size):
    """Cases onnxruntime's LRN kernel rejects (it needs 4-D input and an odd size)."""
    x = rng.randn(*shape)
    args = (size, 0.3, 0.75, 1.2)
    check_against(lrn_node_model(x, *args), lrn_reference(x, *args), {"x": x})


# --- MeanVarianceNormalization and LpNormalization ---------------------------------------


@pytest.mark.parametrize(
    "shape, axes",
    [((2, 3, 5, 4), None), ((2, 3, 5, 4), [2, 3]), ((2, 3, 5, 4), [1]), ((2, 5, 7), [0, 2]),
     ((2, 3, 4, 3, 2), [2, 3, 4]), ((2, 3, 5, 4), [-1, -2])],
)
def test_mean_variance_norm(shape, axes):
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", {"x": rng.randn(*shape)}, attrs, opset=13)


@pytest.mark.parametrize("opset", [9, 18])
def test_mean_variance_norm_opsets(opset):
    check_node("MeanVarianceNormalization", {"x": rng.randn(2, 4, 3, 5)}, opset=opset)


@pytest.mark.parametrize(
    "shape, axis, p",
    [((3, 7), -1, 2), ((3, 7), 0, 1), ((2, 5, 7), 1, 2), ((2, 3, 5, 4), 1, 1),
     ((2, 3, 5, 4), -1, 2), ((2, 3, 4, 3, 2), 2, 2)],
)
def test_lp_norm(shape, axis, p):
    check_node("LpNormalization", {"x": rng.randn(*shape)}, {"axis": axis, "p": p}, opset=22)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_norm_all_zero_slice_gives_zeros(p):
    x = rng.randn(3, 4, 5)
    x[1, :, 2] = 0
    check_node("LpNormalization", {"x": x}, {"axis": 1, "p": p}, opset=22)


@pytest.mark.parametrize(
    "op, attrs",
    [("LpNormalization", {"axis": 1, "p": 2}), ("MeanVarianceNormalization", {"axes": [0, 2]})],
)
def test_conv_axis_norm_conv_chain(op, attrs):
    w1, b1 = conv_weights(5, 3)
    w2, b2 = conv_weights(4, 5)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node(op, ["c1"], ["n"], **attrs),
        helper.make_node("Conv", ["n", "w2", "b2"], ["y"]),
    ]
    inits = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    feeds = {"x": rng.randn(2, 3, 8, 7)}
    tflite_census(check_model(make_model(nodes, feeds, ["y"], inits), feeds))


# --- unknown dimensions ------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs, params, dims, opset",
    [
        ("GroupNormalization", {"num_groups": 3}, (6,), ["N", 6, "H", "W"], 21),
        ("GroupNormalization", {"num_groups": 2}, (6,), [2, 6, "H", 5], 21),
        ("GroupNormalization", {"num_groups": 3}, (6,), ["N", 6, 4, 5], 21),
        ("InstanceNormalization", {}, (6,), ["N", 6, "H", "W"], 18),
        ("LayerNormalization", {"axis": 1}, (6, 4, 5), ["N", 6, 4, 5], 17),
        ("LRN", {"size": 2}, None, ["N", 6, "H", "W"], 13),
    ],
)
def test_unknown_dims(op, attrs, params, dims, opset):
    x = rng.randn(2, 6, 4, 5)
    inits = {} if params is None else {"scale": rng.randn(*params), "bias": rng.randn(*params)}
    if op == "LRN":
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        model = make_model([node], {"x": x}, ["y"], opset=opset, input_shapes={"x": dims})
        reference = lrn_reference(x, 2, 1e-4, 0.75, 1.0)
        check_against(model, reference, {"x": x})
    else:
        check_node(op, {"x": x}, attrs, inits, opset=opset, input_shapes={"x": dims})


@pytest.mark.parametrize("fmt, suffix", [("h5", ".h5"), ("keras_v3", ".keras")])
def test_keras_files_reload(tmp_path, fmt, suffix):
    """The run-time reshapes of GroupNormalization and LRN's band matrix survive a reload."""
    x = rng.randn(2, 6, 4, 5)
    nodes = [
        helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["g"], num_groups=3),
        helper.make_node("LRN", ["g"], ["y"], size=4),
    ]
    dims = ["N", 6, "H", "W"]
    inits = [numpy_helper.from_array(rng.randn(6), n) for n in ("scale", "bias")]
    graph = helper.make_graph(nodes, "test", [tensor_info("x", np.float32, dims)],
                              [tensor_info("y", np.float32, dims)], inits,
                              value_info=[tensor_info("g", np.float32, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    converted = convert(model)
    path = str(tmp_path / f"model{suffix}")
    converted.result.model.save(path, save_format=fmt)
    reloaded = tf_keras.models.load_model(path)
    feed = list(to_physical(converted, {"x": x}).values())
    expected = converted.result.model(feed)
    actual = reloaded(feed)
    for name in expected:
        assert_close(actual[name].numpy(), expected[name].numpy(), what=name)
