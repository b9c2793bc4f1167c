"""Inline weights read where they lie in the model file (onnx2tf_alt/ir/in_place.py): the
proto is parsed without them, each large raw_data becomes external data of the file itself,
and everything downstream (memory maps, onnxruntime, the conversion) reads the same values
onnx.load reads."""

import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.ir import weights
from onnx2tf_alt.ir.in_place import IN_PLACE_BYTES, read_in_place
from onnx2tf_alt.ir.loader import external_data_paths, load_model

from harness import Rng, assert_close

rng = Rng(31)


def inline_model(folder) -> tuple[str, dict[str, np.ndarray]]:
    """One file, every tensor inline: x [2, 96] @ w [96, 256] (96 KB: read in place), + b
    (1 KB: stays in the proto), reshaped by a shape constant, and @ an int8 [256, 300]
    matrix (75 KB: in place) cast to float."""
    values = {"w": rng.randn(96, 256), "b": rng.randn(256),
              "shape": np.array([2, 16, 16], np.int64),
              "codes": np.random.default_rng(5).integers(-127, 128, (256, 300)).astype(np.int8)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["s"]),
         helper.make_node("Reshape", ["s", "shape"], ["y"]),
         helper.make_node("Cast", ["codes"], ["codes_f"], to=onnx.TensorProto.FLOAT),
         helper.make_node("MatMul", ["s", "codes_f"], ["z"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 96])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 16, 16]),
         helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, 300])],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path)
    return path, values


def test_large_inline_weights_are_read_where_they_lie_in_the_file(tmp_path, monkeypatch):
    """The proto carries no large weight, nothing is copied to a temporary file (spill finds
    nothing to move), and each weight is a memory map of the model file itself."""
    monkeypatch.setattr(weights, "SPILL_BYTES", 1)  # would move any large inline weight
    weights.remove_spilled()
    path, values = inline_model(tmp_path / "model")
    model = load_model(path)
    tensors = {t.name: t for t in model.graph.initializer}
    in_place = {n for n, t in tensors.items() if weights.is_external(t)}
    assert in_place == {"w", "codes"}, in_place
    assert not weights.SPILLED
    assert external_data_paths(path) == []  # the model file is not its own data file
    assert model.ByteSize() < IN_PLACE_BYTES
    for name in ("w", "codes"):
        mapped = weights.to_array(tensors[name])
        assert isinstance(mapped, np.memmap) and os.path.samefile(mapped.filename, path)
    for name, value in values.items():
        np.testing.assert_array_equal(weights.to_array(tensors[name]), value)
        assert weights.to_array(tensors[name]).dtype == value.dtype


def test_the_model_read_in_place_is_the_one_onnx_reads(tmp_path):
    """Nodes, inputs, outputs, opsets and every initializer's name, type, shape and value as
    onnx.load gives them; only where the large values are stored differs."""
    path, _ = inline_model(tmp_path)
    model, left = read_in_place(path)
    reference = onnx.load(path)
    assert left == 96 * 256 * 4 + 256 * 300
    for field in ("node", "input", "output"):
        assert list(getattr(model.graph, field)) == list(getattr(reference.graph, field))
    assert list(model.opset_import) == list(reference.opset_import)
    assert model.ir_version == reference.ir_version
    ours = {t.name: t for t in model.graph.initializer}
    for tensor in reference.graph.initializer:
        mine = ours[tensor.name]
        assert (list(mine.dims), mine.data_type) == (list(tensor.dims), tensor.data_type)
        if weights.is_external(mine):
            entries = {e.key: e.value for e in mine.external_data}
            assert entries["location"] == "m.onnx"
            mine = onnx.TensorProto()
            mine.CopyFrom(ours[tensor.name])
            onnx.external_data_helper.load_external_data_for_tensor(mine, str(tmp_path))
        np.testing.assert_array_equal(numpy_helper.to_array(mine),
                                      numpy_helper.to_array(tensor))


def test_external_data_and_weights_in_place_in_one_model(tmp_path):
    """A model with one weight in an external-data file and one inline: each read where it
    lies (the data file, the model file), both values as onnx.load's."""
    from onnx import external_data_helper

    path, values = inline_model(tmp_path)
    model = onnx.load(path)
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="m.bin", size_threshold=0)
    codes = next(t for t in model.graph.initializer if t.name == "codes")
    codes.data_location = onnx.TensorProto.DEFAULT  # back in the proto, written inline
    del codes.external_data[:]
    codes.raw_data = values["codes"].tobytes()
    onnx.save(model, path)
    tensors = {t.name: t for t in load_model(path).graph.initializer}
    locations = {n: os.path.basename(t.external_data[0].value) for n, t in tensors.items()
                 if weights.is_external(t)}
    assert locations == {"w": "m.bin", "codes": "m.onnx"}, locations
    for name, value in values.items():
        np.testing.assert_array_equal(weights.to_array(tensors[name]), value)
    assert external_data_paths(path) == [str(tmp_path / "m.bin")]


def test_onnxruntime_reads_the_weights_in_place(tmp_path):
    """The light proto, serialized as the checks serialize it (kv_check, -cotof), runs in
    onnxruntime with weights.ort_options as the file itself runs."""
    import onnxruntime as ort

    path, _ = inline_model(tmp_path)
    x = rng.randn(2, 96)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    light = load_model(path)
    got = ort.InferenceSession(light.SerializeToString(), weights.ort_options(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_raw_data_of_another_length_than_its_shape_is_left_to_onnx(tmp_path):
    """A tensor whose raw_data does not hold exactly its shape's bytes is not pointed at (a
    map of its shape would read its neighbours' bytes): it stays in the proto, as onnx.load
    reads it."""
    tensor = numpy_helper.from_array(rng.randn(96, 256), "w")
    tensor.raw_data += b"\0" * 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 96])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 256])], [tensor])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, left = read_in_place(path)
    assert left == 0 and not weights.is_external(model.graph.initializer[0])
    assert model.graph.initializer[0].raw_data == tensor.raw_data


def test_a_file_that_is_not_a_model_is_refused_as_before(tmp_path):
    path = tmp_path / "not_a_model.onnx"
    path.write_bytes(np.random.default_rng(3).bytes(3 * IN_PLACE_BYTES))
    with pytest.raises(InputError, match="could not be read as an ONNX model"):
        load_model(str(path))


def test_a_model_read_in_place_converts_and_its_folder_stays_as_it_was(tmp_path):
    """The direct writer's float32 file of the in-place model computes onnxruntime's outputs,
    and nothing is written beside the model."""
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    import onnx2tf_alt

    path, _ = inline_model(tmp_path / "model")
    before = os.path.getmtime(path), os.path.getsize(path)
    out = tmp_path / "out"
    onnx2tf_alt.convert(input_onnx_file_path=path, output_folder_path=str(out),
                        non_verbose=True)
    x = rng.randn(2, 96)
    want = dict(zip(["y", "z"], ort.InferenceSession(path).run(None, {"x": x})))
    layout = json.loads((out / "m_io_layout.json").read_text())
    names = {e["onnx_name"]: e["tflite_name"] for e in layout["inputs"] + layout["outputs"]}
    runner = Interpreter(model_path=str(out / "m_float32.tflite")).get_signature_runner()
    got = runner(**{names["x"]: x})
    for name, value in want.items():
        assert_close(got[names[name]], value, 1e-5, name)
    assert sorted(os.listdir(tmp_path / "model")) == ["m.onnx"]
    assert (os.path.getmtime(path), os.path.getsize(path)) == before


def test_an_integer_table_read_in_place_converts(tmp_path):
    """An int64 table of 20,000 entries (160 KB: read in place) gathered at run-time ids:
    the direct writer's file gives onnxruntime's values (shape passes pass it by: it holds
    no shape)."""
    from ai_edge_litert.interpreter import Interpreter

    import onnx2tf_alt

    table = np.arange(20000, dtype=np.int64) * 3 - 7
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("Cast", ["rows"], ["y"], to=onnx.TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5])],
        [numpy_helper.from_array(table, "table")])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert read_in_place(path)[1] == table.nbytes
    onnx2tf_alt.convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / "out"),
                        non_verbose=True)
    runner = Interpreter(model_path=str(tmp_path / "out" / "m_float32.tflite")
                         ).get_signature_runner()
    ids = np.array([0, 5, 19999, 7, 12345], np.int64)
    (got,) = runner(**{next(iter(runner.get_input_details())): ids}).values()
    np.testing.assert_array_equal(got, table[ids].astype(np.float32))
