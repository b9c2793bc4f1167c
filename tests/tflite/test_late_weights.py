"""Large weights bound after TF's converter has run (onnx2tf_alt/tflite/late_weights.py):
the bound file has the same ops as the file TF's converter writes when it sees every
weight, the same outputs, and onnxruntime's; past 2 GB its buffers follow the flatbuffer;
an op on weights that is not computed here falls back to TF's converter."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from onnx import helper

from onnx2tf_alt.tflite import late_weights
from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model
from onnx2tf_alt.tflite.late_weights import Unbindable, bind
from onnx2tf_alt.tflite.lowering import LATE_ELEMENTS, _tflite_flat, late_bound

from harness import assert_close, check_model, make_model, ort_run, to_logical, to_physical
from models import tiny_cnn

rng = np.random.default_rng(11)
VOCAB, WIDTH, HIDDEN = 300, 64, 320


def _weights(*shape) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def decoder_like(seq=None) -> tuple:
    """Embedding, a MatMul scaled and shifted per channel, a weight read by two MatMuls,
    logits against the embedding table (tied weights)."""
    table, up, down = _weights(VOCAB, WIDTH), _weights(WIDTH, HIDDEN), _weights(HIDDEN, WIDTH)
    assert min(table.size, up.size, down.size) >= LATE_ELEMENTS
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "up"], ["u"]),
        helper.make_node("Mul", ["u", "scale"], ["s"]),
        helper.make_node("Add", ["s", "shift"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "down"], ["d"]),
        helper.make_node("Relu", ["u"], ["r2"]),
        helper.make_node("MatMul", ["r2", "down"], ["d2"]),
        helper.make_node("Add", ["d", "d2"], ["h"]),
        helper.make_node("Transpose", ["table"], ["tied"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "tied"], ["logits"]),
    ]
    ids = rng.integers(0, VOCAB, (2, 7)).astype(np.int64)
    initializers = {"table": table, "up": up, "down": down,
                    "scale": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
                    "shift": rng.standard_normal(HIDDEN).astype(np.float32)}
    shapes = {"ids": [2, seq]} if seq else None
    model = make_model(nodes, {"ids": ids}, ["logits"], initializers, input_shapes=shapes)
    return model, {"ids": ids}


def conv_like() -> tuple:
    """A Conv followed by a per-channel Mul and Add (a BatchNormalization left unfolded),
    a HardSigmoid (a scalar Mul and Add), and a Gemm with transB and a bias."""
    x = rng.standard_normal((2, 32, 9, 11)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "gamma"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["n"]),
        helper.make_node("HardSigmoid", ["n"], ["h"]),
        helper.make_node("Mul", ["n", "h"], ["hs"]),
        helper.make_node("Flatten", ["hs"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    initializers = {
        "w": _weights(64, 32, 3, 3), "b": rng.standard_normal(64).astype(np.float32),
        "gamma": rng.uniform(0.5, 1.5, (1, 64, 1, 1)).astype(np.float32),
        "beta": rng.standard_normal((1, 64, 1, 1)).astype(np.float32),
        "fc": _weights(10, 64 * 9 * 11), "fcb": rng.standard_normal(10).astype(np.float32),
    }
    return make_model(nodes, {"x": x}, ["y"], initializers), {"x": x}


def scaled_input() -> tuple:
    """A per-channel Mul, a scalar Mul and a scalar Add before a 1x1 Conv (TF's converter
    computes the scalar ones into the filter and bias, not the per-channel one)."""
    x = rng.standard_normal((2, 128, 5, 7)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "gamma"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["a"]),
        helper.make_node("Conv", ["a", "w", "b"], ["y"]),
    ]
    initializers = {"gamma": rng.uniform(0.5, 1.5, (1, 128, 1, 1)).astype(np.float32),
                    "half": np.array(0.5, np.float32), "beta": np.array(0.25, np.float32),
                    "w": _weights(128, 128, 1, 1),
                    "b": rng.standard_normal(128).astype(np.float32)}
    return make_model(nodes, {"x": x}, ["y"], initializers), {"x": x}


def windowed() -> tuple:
    """A product between two Reshapes that keep its last axis (Swin's windows)."""
    x = rng.standard_normal((2, 49, 4, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "flat"], ["f"]),
        helper.make_node("MatMul", ["f", "w"], ["p"]),
        helper.make_node("Reshape", ["p", "grid"], ["y"]),
    ]
    initializers = {"flat": np.array([2, 49, 64], np.int64), "w": _weights(64, HIDDEN),
                    "grid": np.array([2, 7, 7, HIDDEN], np.int64)}
    return make_model(nodes, {"x": x}, ["y"], initializers), {"x": x}


def _ops(content: bytes) -> collections.Counter:
    model = unpack_model(content)
    return collections.Counter(op_name(model, op) for op in model.subgraphs[0].operators)


def _run(converted, content: bytes | None = None, path: str | None = None, feeds=None):
    from onnx2tf_alt.tflite.run import run_signature

    interpreter = Interpreter(model_content=content, model_path=path)
    return to_logical(converted, run_signature(interpreter, to_physical(converted, feeds)))


# Where the bound file differs from TF's converter's by design: the converter clones the
# product `u` that a Mul and a Relu both read, to compute the Mul into its weights (a second
# product); the bound file computes `u` once and keeps the Mul, the Add after it and the
# Relu after that (which the clone took as its fused activation).
_NOT_CLONED = {"FULLY_CONNECTED": -1, "MUL": 1, "ADD": 1, "RELU": 1}


@pytest.mark.parametrize("make, differs", [(decoder_like, _NOT_CLONED), (conv_like, {}),
                                           (windowed, {}), (scaled_input, {})],
                         ids=["decoder", "conv", "windows", "scaled_input"])
def test_bound_file_equals_the_converters_file(make, differs):
    model, feeds = make()
    converted = check_model(model, feeds)  # through TF and the (bound) float32 TFLite
    result = converted.tflite_result()
    bound = late_bound(result)
    assert bound is not None and bound.recipes
    reference = _tflite_flat(result, False, True, None).content
    expected = _ops(reference)
    expected.update(differs)
    assert _ops(converted.tflite) == +expected
    for late, ref in zip(_run(converted, converted.tflite, feeds=feeds),
                         _run(converted, reference, feeds=feeds)):
        assert_close(late, ref, 1e-6, "bound vs converter")


def test_dynamic_sequence_axis():
    model, feeds = decoder_like(seq="seq")
    converted = check_model(model, feeds)
    longer = {"ids": rng.integers(0, VOCAB, (2, 12)).astype(np.int64)}
    (expected,) = ort_run(model, longer)
    (actual,) = _run(converted, converted.tflite, feeds=longer)
    assert_close(actual, expected, 1e-4, "12 tokens")


def test_weights_after_the_flatbuffer_and_float16(tmp_path, monkeypatch):
    from onnx2tf_alt.export.float16 import float16_model
    from onnx2tf_alt.tflite.flatbuffer import read_model

    model, feeds = decoder_like()
    converted = check_model(model, feeds)
    (expected,) = ort_run(model, feeds)
    monkeypatch.setattr(late_weights, "MAX_INLINE", 0)  # every bound weight stored after
    bound = late_bound(converted.tflite_result())
    path = str(tmp_path / "model_float32.tflite")
    bound.write(path)
    with open(path, "rb") as f:
        flat = read_model(f.read())
    stored = [flat.Buffers(i) for i in range(flat.BuffersLength())]
    assert sum(b.Offset() > 1 for b in stored) == len(bound.recipes)
    (actual,) = _run(converted, path=path, feeds=feeds)
    assert_close(actual, expected, 1e-4, "offset-form float32")
    assert float16_model(bound.model)
    half = str(tmp_path / "model_float16.tflite")
    bound.write(half)
    (actual,) = _run(converted, path=half, feeds=feeds)
    assert_close(actual, expected, 1e-2, "offset-form float16")
    with open(half, "rb") as f:
        assert _ops(f.read())["DEQUANTIZE"] >= len(bound.recipes) - 1


def test_an_op_on_weights_alone_is_left_to_the_converter():
    weight = _weights(WIDTH, HIDDEN)

    @tf.function(input_signature=[tf.TensorSpec([2, WIDTH], tf.float32, name="x"),
                                  tf.TensorSpec(weight.shape, tf.float32, name="w")])
    def serve(x, w):
        return {"y": tf.matmul(x, tf.sin(w))}

    holder = tf.Module()
    holder.serve = serve
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [serve.get_concrete_function()], holder)
    content = converter.convert()
    with pytest.raises(Unbindable, match="SIN"):
        bind(content, {"w": (weight.shape, "float32", lambda: weight)})


@pytest.mark.parametrize("activation", ["Relu", "Clip"])
def test_an_activation_after_a_rank_2_product_is_kept(activation):
    """TF's converter drops a Relu / Relu6 / clip after a rank-2 product whose weight is an
    input (it fuses it into a FULLY_CONNECTED, then rewrites that as BATCH_MATMUL): such a
    model goes through the converter with its weights, and keeps the activation."""
    weight = _weights(WIDTH, HIDDEN)
    x = rng.standard_normal((3, WIDTH)).astype(np.float32)
    extra = {"Clip": {"low": np.array(-0.5, np.float32), "high": np.array(0.5, np.float32)}}
    inputs = ["m", "low", "high"] if activation == "Clip" else ["m"]
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node(activation, inputs, ["y"])],
                       {"x": x}, ["y"], {"w": weight, **extra.get(activation, {})})
    converted = check_model(model, {"x": x})
    assert late_bound(converted.tflite_result()) is None
    ops = collections.Counter(op_name(m, op) for m in [unpack_model(converted.tflite)]
                              for op in m.subgraphs[0].operators)
    assert ops["FULLY_CONNECTED"] == 1


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize(("activation", "bound"), [("Relu", True), ("Clip6", True),
                                                   ("Clip", False)])
def test_an_activation_after_a_dense_layer_with_bias_is_kept(activation, bound, frozen,
                                                             monkeypatch):
    """After Gemm's (zero) bias add, TF's converter writes the FULLY_CONNECTED of an input weight
    without its Relu / Relu6 (vgg11_bn's classifier, converted through a saved_model: max|err|
    0.85); the bound file gives it back (found by the fused tensor's name), and a clip sends
    the model to the converter with its weights."""
    if not frozen:  # the route of models above FROZEN_BYTES of weights
        monkeypatch.setattr("onnx2tf_alt.tflite.lowering.FROZEN_BYTES", 0)
    weight, bias = _weights(HIDDEN, WIDTH), np.zeros(HIDDEN, np.float32)  # VGG's init
    x = rng.standard_normal((1, WIDTH)).astype(np.float32)
    bounds = {"Clip6": (0.0, 6.0), "Clip": (-0.5, 0.5)}
    extra = {}
    if activation in bounds:
        extra = {"low": np.array(bounds[activation][0], np.float32),
                 "high": np.array(bounds[activation][1], np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["d"], transB=1),
             helper.make_node("Relu" if activation == "Relu" else "Clip",
                              ["d", *extra], ["y"]),
             helper.make_node("Gemm", ["y", "w2"], ["z"])]
    model = make_model(nodes, {"x": x}, ["z"],
                       {"w": weight, "b": bias, "w2": _weights(HIDDEN, 8), **extra})
    converted = check_model(model, {"x": x})
    assert (late_bound(converted.tflite_result()) is not None) == bound


def test_cli_files_of_a_model_with_bound_weights(tmp_path):
    import onnx

    import onnx2tf_alt

    model, feeds = decoder_like()
    source = tmp_path / "decoder.onnx"
    onnx.save(model, source)
    converted_model = onnx2tf_alt.convert(str(source), output_folder_path=str(tmp_path / "out"),
                                          non_verbose=True, output_saved_model=True)
    assert converted_model is not None
    (expected,) = ort_run(model, feeds)
    for suffix, tol in (("float32", 1e-4), ("float16", 1e-2)):
        interpreter = Interpreter(model_path=str(tmp_path / "out" / f"decoder_{suffix}.tflite"))
        runner = interpreter.get_signature_runner()
        (value,) = runner(ids=feeds["ids"]).values()
        assert_close(value, expected, tol, suffix)


@pytest.mark.parametrize("make, differs", [(decoder_like, _NOT_CLONED), (conv_like, {})],
                         ids=["decoder", "conv"])
def test_weight_only_int8_as_tfs_converter_makes_it(make, differs):
    from onnx2tf_alt.quant.quantize import weight_only_tflite
    from onnx2tf_alt.tflite.lowering import serving_function

    model, feeds = make()
    converted = check_model(model, feeds, tflite=False)
    ours = bytes(weight_only_tflite(converted))
    concrete = serving_function(converted.result).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete],
                                                                converted.result.model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    theirs = converter.convert()
    expected = _ops(theirs)
    expected.update(differs)
    assert _ops(ours) == +expected
    (expected,) = ort_run(model, feeds)
    for content in (ours, theirs):
        (actual,) = _run(converted, content, feeds=feeds)
        cosine = np.dot(actual.ravel(), expected.ravel()) / (
            np.linalg.norm(actual) * np.linalg.norm(expected))
        assert cosine > 0.999, cosine
    (a,), (b,) = _run(converted, ours, feeds=feeds), _run(converted, theirs, feeds=feeds)
    assert_close(a, b, 2e-2, "ours vs TF's dynamic-range file")


def test_transposes_in_a_row_are_one_step():
    from onnx2tf_alt.tflite.late_weights import Recipe

    recipe = Recipe("w").then("transpose", (1, 2, 0)).then("transpose", (2, 0, 1))
    assert recipe == Recipe("w")  # they cancel: the same buffer as the weight itself
    value = np.arange(24.0).reshape(2, 3, 4)
    steps = Recipe("w").then("transpose", (1, 0, 2)).then("transpose", (0, 2, 1))
    assert len(steps.steps) == 1
    bound = late_weights.Bound(None, {"w": lambda: value})
    np.testing.assert_array_equal(bound.array(steps), value.transpose(1, 0, 2).transpose(0, 2, 1))


def test_disable_model_save_writes_the_tflite_files_only(tmp_path):
    import os

    import onnx

    import onnx2tf_alt

    model, feeds = decoder_like()
    source = tmp_path / "decoder.onnx"
    onnx.save(model, source)
    out = tmp_path / "out"
    onnx2tf_alt.convert(str(source), output_folder_path=str(out), disable_model_save=True,
                        non_verbose=True)
    names = sorted(os.listdir(out))
    assert "saved_model.pb" not in names and "variables" not in names, names
    assert {"decoder_float32.tflite", "decoder_float16.tflite"} <= set(names)
    (expected,) = ort_run(model, feeds)
    runner = Interpreter(model_path=str(out / "decoder_float32.tflite")).get_signature_runner()
    (value,) = runner(ids=feeds["ids"]).values()
    assert_close(value, expected, 1e-4, "float32")


def _io(content: bytes):
    """The signatures, and the main subgraph's input and output tensor names in order."""
    model = unpack_model(content)
    graph = model.subgraphs[0]
    signatures = [(s.signatureKey, [(m.name, graph.tensors[m.tensorIndex].name) for m in s.inputs],
                   [(m.name, graph.tensors[m.tensorIndex].name) for m in s.outputs])
                  for s in model.signatureDefs]
    return (signatures, [graph.tensors[i].name for i in graph.inputs],
            [graph.tensors[i].name for i in graph.outputs])


@pytest.mark.parametrize("make", [decoder_like, conv_like, tiny_cnn],
                         ids=["decoder", "conv", "no_large_weight"])
def test_one_output_converts_from_the_frozen_graph_as_through_a_saved_model(make, monkeypatch):
    """A model of one output is converted from its frozen graph: the file (bound, or with
    its weights where none is large enough to bind) has the signature, I/O tensor names and
    order, ops and outputs of TF's saved_model route."""
    from onnx2tf_alt.tflite import lowering

    model, feeds = make()
    converted = check_model(model, feeds)
    result = converted.tflite_result()
    bound = late_bound(result) is not None
    assert bound == (make is not tiny_cnn)

    def file():
        return late_bound(result).to_bytes() if bound else _tflite_flat(result, False, True, None).content

    routes = []
    real = lowering._converted

    def converted_and_recorded(*args, frozen=False, **kwargs):
        routes.append(frozen)
        return real(*args, frozen=frozen, **kwargs)

    monkeypatch.setattr(lowering, "_converted", converted_and_recorded)
    frozen = file()
    monkeypatch.setattr(lowering, "_converted",
                        lambda *args, frozen=False, **kwargs: real(*args, **kwargs))
    through_saved_model = file()
    assert routes == [True]
    assert _io(frozen) == _io(through_saved_model)
    assert _ops(frozen) == _ops(through_saved_model)
    for a, b in zip(_run(converted, frozen, feeds=feeds),
                    _run(converted, through_saved_model, feeds=feeds)):
        np.testing.assert_array_equal(a, b)
