"""TF's saved_model converter without its Python loads (onnx2tf_alt/tflite/saved_model_reader.py):
the files are byte for byte those of TF's `from_saved_model` and `from_concrete_functions`,
and the saved_model is never loaded into Python objects."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.lite.python import lite
from test_shared_weights import _gru

from onnx2tf_alt.tflite import lowering
from onnx2tf_alt.tflite.saved_model_reader import saved_model_converter

from harness import convert
from models import tiny_cnn

MODELS = {"gru": lambda: _gru(batch=2)[0], "cnn": lambda: tiny_cnn(batch=3)[0]}


@pytest.fixture
def loads(monkeypatch):
    """The calls of TF's saved_model loader from its converter."""
    calls, load = [], lite._load

    def counted(*args, **kwargs):
        calls.append(args[0])
        return load(*args, **kwargs)

    monkeypatch.setattr(lite, "_load", counted)
    return calls


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_saved_model_converts_to_tf_s_file_without_being_loaded(tmp_path, loads, name):
    """Our saved_model (a GRU with two outputs, a CNN of batch 3) gives TF's
    from_saved_model file byte for byte; TF loads it twice, the reader never."""
    from onnx2tf_alt.export.saved_model import save_saved_model

    result = convert(MODELS[name]()).tflite_result()
    folder = str(tmp_path / "saved_model")
    save_saved_model(result, folder)
    ours = saved_model_converter(folder, [lowering.SIGNATURE]).convert()
    assert loads == []
    theirs = tf.lite.TFLiteConverter.from_saved_model(folder, [lowering.SIGNATURE]).convert()
    assert loads == [folder, folder]
    assert ours == theirs


@pytest.mark.parametrize("count", [1, 2])
def test_concrete_functions_convert_to_tf_s_file(loads, count):
    """One serving function with two outputs, and two signatures in one file (as
    late_bound_signatures converts them): the file TF's from_concrete_functions gives
    through its temporary saved_model, byte for byte, with nothing loaded."""
    result = convert(MODELS["gru"]()).tflite_result()
    holder = tf.Module()
    holder.weights = lowering.serving_weights(result.model)
    functions = []
    for k in range(count):
        serve = lowering.signature_function(result.model, list(result.input_names.values()),
                                            name=f"signature_{k}")
        setattr(holder, f"signature_{k}", serve)
        functions.append(serve.get_concrete_function())
    ours = lowering._converted(functions, holder, False, False)
    assert loads == []
    converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, holder)
    converter.experimental_lower_to_saved_model = True
    assert ours == converter.convert()
    assert len(loads) == 1


def test_debug_info_is_read_as_tf_s_loader_gives_it(tmp_path):
    """A folder saved with its debug info: TF's loader keeps only its file list (traces
    by id are dropped), which is what the reader gives the converter; the file is TF's. A
    folder with traces by name, which the loader renames, gets TF's own converter."""
    from tensorflow.core.framework.graph_debug_info_pb2 import GraphDebugInfo

    result = convert(MODELS["cnn"]()).tflite_result()
    holder = lowering.serving_module(result)
    folder = str(tmp_path / "debug_info")
    tf.saved_model.save(holder, folder, signatures={lowering.SIGNATURE: holder.serve},
                        options=tf.saved_model.SaveOptions(save_debug_info=True))
    converter = saved_model_converter(folder, [lowering.SIGNATURE])
    assert type(converter) is not lite.TFLiteSavedModelConverterV2
    theirs = tf.lite.TFLiteConverter.from_saved_model(folder, [lowering.SIGNATURE]).convert()
    assert converter.convert() == theirs

    path = tmp_path / "debug_info" / "debug" / "saved_model_debug_info.pb"
    debug_info = GraphDebugInfo.FromString(path.read_bytes())
    debug_info.traces["serve@serve"].file_line_cols.add(file_index=0, line=1)
    path.write_bytes(debug_info.SerializeToString())
    converter = saved_model_converter(folder, [lowering.SIGNATURE])
    assert type(converter) is lite.TFLiteSavedModelConverterV2
    assert converter.convert() == theirs
