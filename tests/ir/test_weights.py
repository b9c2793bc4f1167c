"""Weights kept on disk (onnx2tf_alt/ir/weights.py): a model's large external tensors stay
in their file and are read through memory maps, its small ones are read into the model, and
the conversion of such a model matches onnxruntime through TF and the float32 TFLite."""

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir import weights
from onnx2tf_alt.ir.loader import load_model

from harness import Rng

rng = Rng(29)


def external_model(folder, size_threshold: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    """x [2, 96] @ w [96, 80] (7,680 elements: kept on disk), scaled by a [1, 80] row and
    reshaped by a 3-element shape constant (both read into the model); every tensor of at
    least `size_threshold` bytes external."""
    values = {"w": rng.randn(96, 80), "shape": np.array([2, 8, 10], np.int64),
              "row": rng.randn(1, 80)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Mul", ["m", "row"], ["s"]),
         helper.make_node("Reshape", ["s", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 96])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8, 10])],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="m.bin",
              size_threshold=size_threshold)
    return path, values


def test_large_tensors_stay_on_disk_small_ones_are_read_in(tmp_path):
    path, values = external_model(tmp_path / "model")
    model = load_model(path)
    tensors = {t.name: t for t in model.graph.initializer}
    assert weights.is_external(tensors["w"])
    assert not weights.is_external(tensors["shape"]) and not weights.is_external(tensors["row"])
    assert model.ByteSize() < values["w"].nbytes  # the proto does not carry the weight
    mapped = weights.to_array(tensors["w"])
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    np.testing.assert_array_equal(mapped, values["w"])
    for name in ("shape", "row"):
        np.testing.assert_array_equal(weights.to_array(tensors[name]), values[name])


def test_released_pages_read_again(tmp_path):
    path, values = external_model(tmp_path / "model")
    tensor = next(t for t in load_model(path).graph.initializer if t.name == "w")
    mapped = weights.to_array(tensor)
    np.testing.assert_array_equal(mapped, values["w"])  # its pages are resident now
    weights.release(mapped.T)  # through a view too
    np.testing.assert_array_equal(mapped, values["w"])  # and read again
    weights.release(np.ones(3))  # an array of its own: nothing to drop


def test_a_model_with_weights_on_disk_converts_and_checks(tmp_path):
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    import onnx2tf_alt

    # onnxruntime itself cannot read a Reshape's shape from external data: that stays inline
    path, _ = external_model(tmp_path / "model", size_threshold=1024)
    out = tmp_path / "out"
    model = onnx2tf_alt.convert(input_onnx_file_path=path, output_folder_path=str(out),
                                check_onnx_tf_outputs_elementwise_close=True, non_verbose=True,
                                output_saved_model=True)
    assert model.onnx2tf_alt_report.passed  # TF and float32 TFLite against onnxruntime
    x = rng.randn(2, 96)
    (expected,) = ort.InferenceSession(path).run(None, {"x": x})
    runner = Interpreter(model_path=str(out / "m_float32.tflite")).get_signature_runner()
    (got,) = runner(**{next(iter(runner.get_input_details())): x}).values()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert sorted(os.listdir(tmp_path / "model")) == ["m.bin", "m.onnx"]  # nothing written there


def test_inline_weights_move_to_a_temporary_file_for_the_conversion(tmp_path, monkeypatch):
    import onnx2tf_alt

    monkeypatch.setattr(weights, "SPILL_BYTES", 1)  # every large inline weight moves
    weights.remove_spilled()
    path, values = external_model(tmp_path / "model", size_threshold=1 << 30)  # all inline
    model = load_model(path)
    tensors = {t.name: t for t in model.graph.initializer}
    assert weights.is_external(tensors["w"]) and not weights.is_external(tensors["shape"])
    assert len(weights.SPILLED) == 1 and os.path.isfile(weights.SPILLED[0])
    assert model.ByteSize() < values["w"].nbytes
    np.testing.assert_array_equal(weights.to_array(tensors["w"]), values["w"])
    weights.remove_spilled()
    assert not weights.SPILLED

    out = tmp_path / "out"
    result = onnx2tf_alt.convert(input_onnx_file_path=path, output_folder_path=str(out),
                                 check_onnx_tf_outputs_elementwise_close=True, non_verbose=True,
                                 output_saved_model=True)
    assert result.onnx2tf_alt_report.passed  # TF and float32 TFLite against onnxruntime
    assert not weights.SPILLED  # the conversion removed its file
    assert sorted(os.listdir(tmp_path / "model")) == ["m.onnx"]  # the user's folder untouched


def test_a_large_folded_constant_is_made_in_a_temporary_file(monkeypatch):
    """Constant folding (Transpose of a weight, a Cast of it) makes its large results in a
    temporary file from SPILL_ONE bytes (ir/weights.add_spilled) and its small ones in the
    proto; onnxruntime computes the same from either."""
    import onnxruntime as ort

    from onnx2tf_alt.passes.prepare import fold_constants

    w = rng.randn(80, 96)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "wt"], ["m"]),
         helper.make_node("Cast", ["k"], ["kf"], to=onnx.TensorProto.FLOAT),
         helper.make_node("Add", ["m", "kf"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 96])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 80])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.arange(80, dtype=np.int32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.randn(3, 96)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    monkeypatch.setattr(weights, "SPILL_ONE", 80 * 4 + 1)  # the Cast's 320 bytes stay inline
    weights.remove_spilled()
    assert fold_constants(model)
    tensors = {t.name: t for t in model.graph.initializer}
    assert weights.is_external(tensors["wt"]) and len(weights.SPILLED) == 1
    assert not weights.is_external(tensors["kf"])
    np.testing.assert_array_equal(weights.to_array(tensors["wt"]), w.T)
    session = ort.InferenceSession(model.SerializeToString(), weights.ort_options(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected[0],
                               rtol=1e-6, atol=1e-6)
    weights.remove_spilled()
