"""QuantizeLinear -> DequantizeLinear pairs computed as one float op (passes/qdq_pairs.py):
bit for bit what onnxruntime computes, through TF, the float32 TFLite and the direct writer,
with no CAST left in the file (TFLite's CAST runs outside XNNPACK)."""

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.passes.prepare import infer_shapes
from onnx2tf_alt.passes.qdq_pairs import FUSED, fuse_quant_pairs

from harness import both_routes, check_model, count_tflite_ops, make_model

INT = {np.int8: onnx.TensorProto.INT8, np.uint8: onnx.TensorProto.UINT8,
       np.int16: onnx.TensorProto.INT16, np.uint16: onnx.TensorProto.UINT16}


def feeds_for(shape, scale, seed, ties=False):
    """Normal values and values far outside the integer range (saturation); with `ties`, a
    quarter of them exact rounding ties (k + 1/2) * scale."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 40 * float(np.max(scale))
    flat = x.reshape(-1)
    if ties:
        flat[: flat.size // 4] = (rng.integers(-60, 60, flat.size // 4) + 0.5) * float(scale)
    flat[-3:] = [1e6, -1e6, 0.0]
    return {"x": x}


def qdq_model(shape, dtype, axis=None, readers=1, opset=13, seed=0, ties=False):
    """x -> Q -> DQ (x readers) -> Mul by a constant -> outputs; per-axis along `axis` when
    given, else per-tensor."""
    rng = np.random.default_rng(seed)
    if axis is None:
        scale = np.float32(rng.uniform(0.01, 0.1))
        zp = np.asarray(rng.integers(0, 20), dtype)
    else:
        n = shape[axis]
        scale = rng.uniform(0.01, 0.1, n).astype(np.float32)
        zp = rng.integers(0, 20, n).astype(dtype)
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], **attrs)]
    outputs = []
    for k in range(readers):
        nodes += [helper.make_node("DequantizeLinear", ["q", "s", "zp"], [f"d{k}"], **attrs),
                  helper.make_node("Mul", [f"d{k}", "c"], [f"y{k}"])]
        outputs.append(f"y{k}")
    feeds = feeds_for(shape, scale, seed, ties)
    inits = {"s": np.asarray(scale, np.float32), "zp": zp,
             "c": np.float32(1.5)}
    return make_model(nodes, feeds, outputs, inits, opset=opset), feeds


def fused(model):
    copy = infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    return fuse_quant_pairs(copy), copy


CASES = [
    ((2, 3, 5, 7), np.int8, None),
    ((2, 3, 5, 7), np.uint8, 1),
    ((3, 4, 9), np.int8, -1),
    ((1, 6, 4, 4), np.int16, None),
    ((2, 5), np.uint16, 1),
]


@pytest.mark.parametrize("shape, dtype, axis", CASES,
                         ids=["int8", "uint8_per_channel", "int8_last_axis", "int16",
                              "uint16_per_axis"])
def test_pair_equals_onnxruntime_bit_for_bit(shape, dtype, axis):
    opset = 21 if np.dtype(dtype).itemsize == 2 else 13  # 16-bit types since opset 21
    model, feeds = qdq_model(shape, dtype, axis, opset=opset, seed=len(shape))
    count, after = fused(model)
    assert count == 1
    assert [n.op_type for n in after.graph.node] == [FUSED, "Mul"]
    converted = check_model(model, feeds, tol=0.0)
    ops = count_tflite_ops(converted.tflite)
    assert "CAST" not in ops and ops["ROUND"] == 1, ops
    both_routes(model, feeds, tol=0.0)


def test_ties_round_half_to_even_in_the_direct_file():
    """x / s exactly k + 1/2 rounds to the even k as in onnxruntime. The direct writer (the
    default writer of such files) keeps the DIV; TF's converter multiplies by the rounded
    reciprocal instead, which moves ties (docs/quantization.md), so only the TF model and
    the direct file are held to 0 here."""
    from dataclasses import replace

    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded, translate
    from onnx2tf_alt.tflite.direct import DirectResult, write_direct

    from harness import assert_close, ort_run, tf_run, tflite_run

    model, feeds = qdq_model((2, 3, 5, 7), np.int8, seed=9, ties=True)
    expected = ort_run(model, feeds)
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, DirectResult), str(result)
    assert "DIV" in count_tflite_ops(result.content)
    converted = translate(planned)
    assert_close(tf_run(converted, feeds)[0], expected[0], 0.0, "TF")
    direct = replace(converted, result=result, _tflite_result=result)
    assert_close(tflite_run(direct, feeds, result.content)[0], expected[0], 0.0, "direct")


def test_shared_quantize_read_by_two_dequantizers():
    model, feeds = qdq_model((2, 3, 4, 4), np.int8, readers=2, seed=5)
    count, after = fused(model)
    assert count == 1
    assert [n.op_type for n in after.graph.node] == [FUSED, "Mul", "Mul"]
    converted = check_model(model, feeds, tol=0.0)
    assert count_tflite_ops(converted.tflite)["ROUND"] == 1


def _not_fused(model, feeds):
    count, after = fused(model)
    assert count == 0
    assert FUSED not in [n.op_type for n in after.graph.node]
    check_model(model, feeds, tol=0.0)


def test_quantized_graph_output_is_not_fused():
    model, feeds = qdq_model((2, 3, 4), np.uint8, seed=6)
    model.graph.output.append(helper.make_tensor_value_info("q", onnx.TensorProto.UINT8,
                                                            [2, 3, 4]))
    _not_fused(model, feeds)


def test_quantized_value_read_by_another_op_is_not_fused():
    model, feeds = qdq_model((2, 3, 4), np.int8, seed=7)
    model.graph.node.append(helper.make_node("Cast", ["q"], ["i"], to=onnx.TensorProto.INT32))
    model.graph.output.append(helper.make_tensor_value_info("i", onnx.TensorProto.INT32,
                                                            [2, 3, 4]))
    _not_fused(model, feeds)


def test_dequantizer_with_other_parameters_is_not_fused():
    model, feeds = qdq_model((2, 3, 4), np.int8, seed=8)
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.asarray(0.05, np.float32), "s2"))
    model.graph.node[1].input[1] = "s2"
    _not_fused(model, feeds)
