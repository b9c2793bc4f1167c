"""The flatten-before-dense rewrite: same numbers, no TRANSPOSE, applied only where it helps."""

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.passes.dense_flatten import flatten_channel_last

from harness import check_model, count_tflite_ops, make_model, ort_run

rng = np.random.default_rng(3)


def classifier(flatten: str, gemm_trans_b: int, source: str = "Conv"):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    inits = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "shape": np.array([0, -1], np.int64),
        "fc": rng.standard_normal((10, 4 * 4 * 3) if gemm_trans_b else (4 * 4 * 3, 10))
        .astype(np.float32),
    }
    first = (helper.make_node("Conv", ["x", "w"], ["c"]) if source == "Conv"
             else helper.make_node("Slice", ["x", "s0", "s1", "s2"], ["c"]))
    if source != "Conv":
        inits.update(s0=np.array([0], np.int64), s1=np.array([4], np.int64),
                     s2=np.array([3], np.int64))
        inits["fc"] = rng.standard_normal((10, 3 * 6 * 4) if gemm_trans_b else (3 * 6 * 4, 10)
                                          ).astype(np.float32)
    nodes = [
        first,
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]) if flatten == "Flatten"
        else helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=gemm_trans_b),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits, opset=13), {"x": x}


@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_rewrite_keeps_values_and_drops_transposes(flatten, trans_b):
    model, feeds = classifier(flatten, trans_b)
    rewritten = onnx.shape_inference.infer_shapes(model)  # as prepare does before the pass
    assert flatten_channel_last(rewritten)
    np.testing.assert_allclose(
        ort_run(rewritten, feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5
    )
    converted = check_model(model, feeds)
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == 0


def test_not_applied_without_a_channel_last_producer():
    model, _ = classifier("Flatten", 1, source="Slice")
    assert not flatten_channel_last(onnx.shape_inference.infer_shapes(model))


@pytest.mark.parametrize("spill_one", [0, 1 << 30])
def test_a_large_permuted_weight_is_made_in_a_temporary_file(tmp_path, monkeypatch, spill_one):
    """From SPILL_ONE bytes the permuted weight goes to a temporary file (protobuf would
    keep it in the model's memory for the whole conversion: VGG-19's 392 MB), below it
    into the proto; the same values either way, and a conversion removes its file."""
    import onnxruntime as ort

    import onnx2tf_alt
    from onnx2tf_alt.ir import weights

    monkeypatch.setattr(weights, "SPILL_ONE", spill_one)
    weights.remove_spilled()
    model, feeds = classifier("Flatten", 1)
    rewritten = onnx.shape_inference.infer_shapes(model)
    assert flatten_channel_last(rewritten)
    permuted = next(t for t in rewritten.graph.initializer if "__rows_for_" in t.name)
    assert weights.is_external(permuted) == (spill_one == 0)
    assert len(weights.SPILLED) == (spill_one == 0)
    session = ort.InferenceSession(rewritten.SerializeToString(), weights.ort_options(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feeds)[0], ort_run(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    weights.remove_spilled()

    onnx.save(model, str(tmp_path / "m.onnx"))
    result = onnx2tf_alt.convert(input_onnx_file_path=str(tmp_path / "m.onnx"),
                                 output_folder_path=str(tmp_path / "out"),
                                 check_onnx_tf_outputs_elementwise_close=True, non_verbose=True,
                                 output_saved_model=True)
    assert result.onnx2tf_alt_report.passed  # TF and float32 TFLite against onnxruntime
    assert not weights.SPILLED
