"""Every output format is written, reloads, and reproduces onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import onnx2tf_alt

from harness import assert_close, ort_run
from models import tiny_cnn


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    model, feeds = tiny_cnn()
    out = tmp_path_factory.mktemp("out") / "saved_model"
    path = out.parent / "cnn.onnx"
    import onnx

    onnx.save(model, path)
    keras_model = onnx2tf_alt.convert(
        input_onnx_file_path=str(path),
        output_folder_path=str(out),
        output_h5=True,
        output_keras_v3=True,
        output_saved_model=True,
        non_verbose=True,
    )
    layout = json.loads((out / "cnn_io_layout.json").read_text())
    return out, keras_model, layout, feeds, ort_run(model, feeds)[0]


def physical_input(layout, feeds, batch=None):
    entry = layout["inputs"][0]
    x = feeds[entry["onnx_name"]]
    if batch is not None:
        x = np.concatenate([x] * batch, axis=0)[:batch]
    return entry["tf_name"], np.transpose(x, entry["perm"])


def test_written_files(converted):
    out, _, layout, _, _ = converted
    names = sorted(p.name for p in out.iterdir())
    for expected in [
        "saved_model.pb",
        "variables",
        "cnn_float32.tflite",
        "cnn_float16.tflite",
        "cnn.h5",
        "cnn.keras",
        "cnn_io_layout.json",
    ]:
        assert expected in names
    assert not any(n.name.startswith(".onnx2tf_alt_") for n in out.parent.iterdir())
    assert layout["inputs"][0]["perm"] == [0, 2, 3, 1]
    assert layout["inputs"][0]["shape"] == [None, 16, 16, 3]
    assert layout["outputs"][0]["onnx_name"] == "logits"


def test_saved_model_reloads(converted):
    out, _, layout, feeds, expected = converted
    loaded = tf.saved_model.load(str(out))
    serve = loaded.signatures["serving_default"]
    name, x = physical_input(layout, feeds)
    result = serve(**{name: tf.constant(x)})
    assert_close(result[layout["outputs"][0]["tf_name"]].numpy(), expected)


@pytest.mark.parametrize("suffix", ["h5", "keras"])
def test_keras_files_reload(converted, suffix):
    out, _, layout, feeds, expected = converted
    model = tf_keras.models.load_model(
        str(out / f"cnn.{suffix}"), custom_objects=onnx2tf_alt.custom_objects()
    )
    _, x = physical_input(layout, feeds)
    result = model(x)
    assert_close(result[layout["outputs"][0]["tf_name"]].numpy(), expected)


def test_h5_keeps_weights_out_of_config(converted):
    import h5py

    out = converted[0]
    with h5py.File(out / "cnn.h5", "r") as f:
        config = f.attrs["model_config"]
    assert len(config) < 64_000, len(config)


@pytest.mark.parametrize("variant, tol", [("float32", 1e-4), ("float16", 2e-2)])
def test_tflite_runs_with_dynamic_batch(converted, variant, tol):
    from ai_edge_litert.interpreter import Interpreter

    out, _, layout, feeds, _ = converted
    interpreter = Interpreter(model_path=str(out / f"cnn_{variant}.tflite"))
    assert interpreter.get_input_details()[0]["shape_signature"][0] == -1
    runner = interpreter.get_signature_runner("serving_default")
    name, x = physical_input(layout, feeds, batch=3)
    result = runner(**{name: x})[layout["outputs"][0]["tf_name"]]
    x_logical = np.concatenate([feeds["input"]] * 3)[:3]
    expected = ort_run(tiny_cnn()[0], {"input": x_logical})[0]
    assert_close(result, expected, tol)


def test_keras_model_keeps_dynamic_batch(converted):
    _, keras_model, _, _, _ = converted
    assert keras_model.inputs[0].shape[0] is None


def test_batch_size_flag_fixes_batch(tmp_path):
    model, _ = tiny_cnn()
    keras_model = onnx2tf_alt.convert(
        onnx_graph=model, output_folder_path=str(tmp_path / "o"), batch_size=1,
        non_verbose=True, output_tflite=False, output_saved_model=True,
    )
    assert keras_model.inputs[0].shape.as_list() == [1, 16, 16, 3]


def test_keep_nchw_input(tmp_path):
    model, feeds = tiny_cnn()
    keras_model = onnx2tf_alt.convert(
        onnx_graph=model, output_folder_path=str(tmp_path / "o"), non_verbose=True,
        keep_ncw_or_nchw_or_ncdhw_input_names=["input"], output_tflite=False, output_saved_model=True,
    )
    assert keras_model.inputs[0].shape.as_list() == [None, 3, 16, 16]
    result = keras_model(feeds["input"])
    assert_close(next(iter(result.values())).numpy(), ort_run(model, feeds)[0])


def test_input_file_untouched(tmp_path):
    import hashlib

    import onnx

    model, _ = tiny_cnn()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    onnx2tf_alt.convert(
        input_onnx_file_path=str(path), output_folder_path=str(tmp_path / "o"),
        non_verbose=True, output_tflite=False, output_saved_model=True,
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
