"""The float16 .tflite derived from the float32 one (export/float16.py) against the file TF's
float16 converter writes for the same model: same ops, same float16 constants, the same
outputs bit for bit, under XNNPACK and on the builtin kernels; and against onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness import assert_close, convert, make_model, ort_run, tflite_run
from models import tiny_cnn


def _gemm_and_shared_constant():
    """A Gemm, a constant read by three ops, a scalar constant; batch 3."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
             helper.make_node("Mul", ["g", "b"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Mul", ["a", "s"], ["y"])]
    inits = {"w": rng.standard_normal((7, 5)).astype(np.float32),
             "b": rng.standard_normal(5).astype(np.float32), "s": np.float32(0.37)}
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _if_with_constants_in_branches():
    """A run-time If whose branches each multiply by their own constant vector."""
    rng = np.random.default_rng(2)

    def branch(name):
        c = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), f"{name}_c")
        node = helper.make_node("Mul", ["x", f"{name}_c"], [f"{name}_y"])
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(
            f"{name}_y", TensorProto.FLOAT, [2, 6])], [c])

    x = np.abs(rng.standard_normal((2, 6))).astype(np.float32)
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch("then"),
                              else_branch=branch("else"))]
    model = make_model(nodes, {"x": x}, ["y"], {"zero": np.float32(0)})
    return model, [{"x": x}, {"x": -x}]


def _unrolled_gru():
    """A GRU of 5 steps, batch 2: unrolled, its FULLY_CONNECTEDs share one weight tensor."""
    rng = np.random.default_rng(3)
    hidden, features = 6, 4
    x = rng.standard_normal((5, 2, features)).astype(np.float32)
    inits = {"W": rng.standard_normal((1, 3 * hidden, features)).astype(np.float32) * 0.5,
             "R": rng.standard_normal((1, 3 * hidden, hidden)).astype(np.float32) * 0.5,
             "B": rng.standard_normal((1, 6 * hidden)).astype(np.float32)}
    node = helper.make_node("GRU", ["x", "W", "R", "B"], ["y"], hidden_size=hidden,
                            linear_before_reset=1)
    return make_model([node], {"x": x}, ["y"], inits), {"x": x}


def _cases():
    model, feeds = tiny_cnn()
    gemm, gemm_feeds = _gemm_and_shared_constant()
    branchy, branch_feeds = _if_with_constants_in_branches()
    gru, gru_feeds = _unrolled_gru()
    return {"conv": (model, [feeds]), "gemm_shared_constant": (gemm, [gemm_feeds]),
            "if_branches": (branchy, branch_feeds), "unrolled_gru": (gru, [gru_feeds])}


CASES = _cases()


def _census(content: bytes) -> list[Counter]:
    """Op census of every subgraph, and the float16 constants' shapes."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    result = []
    for subgraph in model.subgraphs:
        ops = Counter(model.operatorCodes[op.opcodeIndex].builtinCode
                      for op in subgraph.operators)
        halves = Counter(tuple(t.shape) for t in subgraph.tensors
                         if t.type == schema.TensorType.FLOAT16)
        result.append((ops, halves))
    return result


def _metadata(content: bytes) -> dict[bytes, bytes]:
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    return {m.name: bytes(model.buffers[m.buffer].data) for m in model.metadata}


@pytest.fixture(scope="module", params=sorted(CASES))
def files(request):
    from onnx2tf_alt.export.float16 import float16_from_float32
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    model, feeds = CASES[request.param]
    converted = convert(model)
    float32 = tflite_bytes(converted.tflite_result())
    by_tf = tflite_bytes(converted.tflite_result(), float16=True)
    return model, feeds, converted, float32, by_tf, float16_from_float32(float32)


def test_derived_file_has_the_ops_and_float16_constants_of_tfs(files):
    _, _, _, float32, by_tf, derived = files
    assert derived is not None
    assert _census(derived) == _census(by_tf)
    ops32 = _census(float32)
    assert any(halves for _, halves in _census(derived))
    for (ops, _), (ops16, halves) in zip(ops32, _census(derived)):
        assert ops16 - ops == Counter({6: sum(halves.values())})  # one DEQUANTIZE each
    assert len(derived) < 0.75 * len(float32) or len(float32) < 20000


def test_derived_file_computes_what_tfs_computes_bit_for_bit(files):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from onnx2tf_alt.tflite.run import run_signature

    model, feeds, converted, _, by_tf, derived = files
    for feed in feeds:
        physical = converted.result.to_physical(feed)
        for resolver in (OpResolverType.AUTO,
                         OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
            want = run_signature(Interpreter(model_content=by_tf,
                                             experimental_op_resolver_type=resolver), physical)
            got = run_signature(Interpreter(model_content=derived,
                                            experimental_op_resolver_type=resolver), physical)
            assert want.keys() == got.keys()
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])
        expected = ort_run(model, feed)
        for got, ref in zip(tflite_run(converted, feed, derived), expected):
            assert_close(got, ref, tol=2e-2, what="float16 file vs onnxruntime")


def test_derived_file_declares_float16_weights_as_tf_does(files):
    _, _, _, _, by_tf, derived = files
    ours, theirs = _metadata(derived), _metadata(by_tf)
    assert ours[b"min_runtime_version"] == theirs[b"min_runtime_version"]
    assert ours[b"reduced_precision_support"] == theirs[b"reduced_precision_support"]
    from tensorflow.lite.python import conversion_metadata_schema_py_generated as conversion

    modes = [conversion.ConversionMetadataT.InitFromObj(
        conversion.ConversionMetadata.GetRootAsConversionMetadata(m[b"CONVERSION_METADATA"], 0)
    ).options.modelOptimizationModes for m in (ours, theirs)]
    assert list(modes[0]) == list(modes[1])


def test_a_model_without_float_constants_is_left_to_tf():
    from onnx2tf_alt.export.float16 import float16_from_float32
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    x = np.ones((2, 3), np.float32)
    model = make_model([helper.make_node("Add", ["x", "x"], ["y"])], {"x": x}, ["y"])
    assert float16_from_float32(tflite_bytes(convert(model).tflite_result())) is None


def test_the_written_float16_file_is_the_derived_one(tmp_path):
    """The CLI's float16 file is the float32 file with float16 constants: derived, not a
    second TF conversion (which traces the model and runs the converter again)."""
    import onnx2tf_alt
    from onnx2tf_alt.export.float16 import float16_from_float32

    model, _ = CASES["conv"]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    onnx2tf_alt.convert(input_onnx_file_path=str(path), output_folder_path=str(tmp_path / "o"),
                        non_verbose=True)
    float32 = (tmp_path / "o" / "m_float32.tflite").read_bytes()
    assert (tmp_path / "o" / "m_float16.tflite").read_bytes() == float16_from_float32(float32)


def _with_stored_buffers(content: bytes) -> bytes:
    """`content` rewritten in the form TF's converter writes past 2 GB: every buffer's bytes
    after the flatbuffer, found by the schema's Buffer.offset / size."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model

    model = unpack_model(content)
    blobs = [(b, bytes(np.asarray(b.data, np.uint8))) for b in model.buffers
             if b.data is not None and len(b.data)]
    for buffer, blob in blobs:  # placeholders of the final width, so the size is known
        buffer.data, buffer.offset, buffer.size = None, 2**40, len(blob)
    position = (len(pack_model(model)) + 15) // 16 * 16
    for buffer, blob in blobs:
        buffer.offset = position
        position = (position + len(blob) + 15) // 16 * 16
    head = pack_model(model)
    tail = bytearray(position - blobs[0][0].offset)
    for buffer, blob in blobs:
        start = buffer.offset - blobs[0][0].offset
        tail[start:start + len(blob)] = blob
    return head + bytes(blobs[0][0].offset - len(head)) + bytes(tail)


def test_a_file_with_weights_after_the_flatbuffer_gives_the_same_float16_file(files):
    """A float32 file past 2 GB keeps its weights after the flatbuffer; its float16 file is
    derived as from the ordinary form, byte for byte."""
    from onnx2tf_alt.export.float16 import float16_from_float32

    _, feeds, converted, float32, _, derived = files
    stored = _with_stored_buffers(float32)
    assert len(stored) > len(float32)
    for feed in feeds:  # the runtime reads the stored form
        for got, want in zip(tflite_run(converted, feed, stored),
                             tflite_run(converted, feed, float32)):
            np.testing.assert_array_equal(got, want)
    assert float16_from_float32(stored) == derived


@pytest.mark.parametrize("epsilon", [1e-12, 1e-6])
def test_constants_float16_cannot_hold_stay_float32(tmp_path, epsilon):
    """BEiT's LayerNorm epsilon of 1e-12 is 0 in float16, and a mask fill of -1e9 is -inf:
    halved as TF's float16 files halve them, a row of zero variance gives inf * 0 = NaN.
    Such constants stay float32 in the float16 file (the other weights are halved), which
    then matches onnxruntime where the float32 file does."""
    import onnx2tf_alt
    from onnx2tf_alt.tflite.flatbuffer import schema, unpack_model

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    x[:, 0] = 0.25  # a constant row: variance 0
    inits = {"scale": rng.standard_normal(16).astype(np.float32),
             "bias": rng.standard_normal(16).astype(np.float32),
             "w": rng.standard_normal((16, 16)).astype(np.float32),
             "mask": np.where(np.arange(16) < 12, 0, -1e9).astype(np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1,
                              epsilon=epsilon),
             helper.make_node("MatMul", ["n", "w"], ["h"]),
             helper.make_node("Add", ["h", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    onnx2tf_alt.convert(input_onnx_file_path=str(path), output_folder_path=str(tmp_path / "o"),
                        non_verbose=True)
    content = (tmp_path / "o" / "m_float16.tflite").read_bytes()
    model16 = unpack_model(content)
    constants = {schema.TensorType.FLOAT16: [], schema.TensorType.FLOAT32: []}
    for t in model16.subgraphs[0].tensors:
        data = model16.buffers[t.buffer].data
        if t.type in constants and data is not None and len(data):
            dtype = "<f2" if t.type == schema.TensorType.FLOAT16 else "<f4"
            constants[t.type].append(np.frombuffer(bytes(data), dtype))
    halves, kept = constants[schema.TensorType.FLOAT16], constants[schema.TensorType.FLOAT32]
    assert any(h.size == 256 for h in halves)  # the weights are halved
    assert all(np.isfinite(h).all() and np.abs(h).max() > 0 for h in halves)
    assert any(k.min() <= -1e9 for k in kept)  # the mask (in the dense layer's bias)
    assert any(k.size == 1 and k[0] == np.float32(epsilon) for k in kept)
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature

    got = run_signature(Interpreter(model_content=content), {"x": x})
    expected = ort_run(model, {"x": x})[0]
    assert_close(next(iter(got.values())), expected, tol=2e-2, what="float16 file")
