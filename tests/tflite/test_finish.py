"""TF's converter's last passes made on our unpacked model (onnx2tf_alt/tflite/finish.py):
the files are byte for byte those TF's own passes give."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from test_shared_weights import _gru

from onnx2tf_alt.tflite import lowering
from onnx2tf_alt.tflite.finish import Finish, share_read_only_buffers
from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model
from onnx2tf_alt.tflite.shared_weights import fold_runtime_biases, fold_runtime_biases_model

from harness import convert
from models import tiny_cnn


def _tf_finished(result, route: str, folder=None) -> bytes:
    """The float32 file as lowering made it with TF's own last passes (before finish.py)."""
    if route == "saved_model":
        return fold_runtime_biases(lowering._converted(folder, None, False, True))
    holder = lowering.serving_module(result)
    concrete = holder.serve.get_concrete_function()
    if route == "concrete":
        return fold_runtime_biases(lowering._converted(concrete, holder, False, True))
    signature = lowering.Signature.of(concrete, lowering.SIGNATURE,
                                      list(result.input_names.values()), result.output_keys)
    model = unpack_model(lowering._converted(concrete, holder, False, True, frozen=True))
    signature.write(model)
    fold_runtime_biases_model(model)
    return pack_model(model)


@pytest.mark.parametrize("name,route", [("gru", "saved_model"), ("gru", "concrete"),
                                        ("cnn", "frozen"), ("cnn", "saved_model")])
def test_the_last_passes_give_the_file_tf_gives(tmp_path, monkeypatch, name, route):
    """The float32 file from our unpacked model (buffers read in from after the flatbuffer,
    equal read-only buffers shared, CONVERSION_METADATA) is TF's file byte for byte: through
    a saved_model, a concrete function with several outputs, and a frozen graph (one
    output); the unpacked model that comes with it is that file's. TF unpacked nothing."""
    from tensorflow.lite.tools import flatbuffer_utils

    from onnx2tf_alt.export.saved_model import save_saved_model

    unpacked, unpack = [], flatbuffer_utils.convert_bytearray_to_object

    def counted(content):
        unpacked.append(len(content))
        return unpack(content)

    model = _gru(batch=1)[0] if name == "gru" else tiny_cnn(batch=2)[0]
    result = convert(model).tflite_result()
    folder = None
    if route == "saved_model":
        folder = str(tmp_path / "saved_model")
        save_saved_model(result, folder)
    monkeypatch.setattr(flatbuffer_utils, "convert_bytearray_to_object", counted)
    flat = lowering._tflite_flat(result, False, True, folder)
    assert unpacked == []
    monkeypatch.undo()
    assert flat.content == _tf_finished(result, route, folder)
    assert pack_model(flat.model) == flat.content
    entries = {m.name for m in unpack_model(flat.content).metadata}
    assert entries == {b"min_runtime_version", b"CONVERSION_METADATA"}, entries


def test_equal_read_only_buffers_are_shared_as_tf_shares_them():
    """Two weights made equal in a converted file: one buffer serves both tensors, the other
    is emptied, as TF's deduplicate_readonly_buffers does it; the file computes the same."""
    from tensorflow.lite.python.convert import deduplicate_readonly_buffers

    model, feeds = tiny_cnn(batch=1)
    result = convert(model).tflite_result()
    content = lowering._tflite_flat(result, False, True, None).content
    unpacked = unpack_model(content)
    graph = unpacked.subgraphs[0]
    weights = sorted((t for t in graph.tensors
                      if unpacked.buffers[t.buffer].data is not None
                      and len(unpacked.buffers[t.buffer].data) == 8 * 4),
                     key=lambda t: t.buffer)  # the two float32 biases of 8 channels
    assert len(weights) == 2, [t.name for t in weights]
    first, second = (unpacked.buffers[t.buffer] for t in weights)
    second.data = first.data.copy()
    duplicated = pack_model(unpacked)
    share_read_only_buffers(unpacked)
    assert weights[0].buffer == weights[1].buffer
    assert pack_model(unpacked) == deduplicate_readonly_buffers(duplicated)

    def run(content):
        interpreter = Interpreter(model_content=content)
        runner = interpreter.get_signature_runner()
        name = next(iter(runner.get_input_details()))
        x = result.to_physical(feeds)[name]
        return next(iter(runner(**{name: x}).values()))

    np.testing.assert_array_equal(run(pack_model(unpacked)), run(duplicated))


def test_a_tf_without_the_switch_finishes_its_own_file():
    """A converter without the switch (another TF) keeps its own last passes: Finish
    leaves it as it is and only unpacks what it gives."""
    class Converter:
        pass

    converter, finish = Converter(), Finish()
    finish.prepare(converter)
    assert finish.converter is None and vars(converter) == {}


def test_a_model_past_finish_bytes_keeps_tf_s_own_passes(monkeypatch):
    """A model of more than FINISH_BYTES of weights (its file may pass flatbuffers' 2 GB,
    which TF then writes with its buffers after the flatbuffer) is finished by TF itself;
    the file is the same."""
    from tensorflow.lite.tools import flatbuffer_utils

    result = convert(tiny_cnn(batch=2)[0]).tflite_result()
    unpacked, unpack = [], flatbuffer_utils.convert_bytearray_to_object

    def counted(content):
        unpacked.append(len(content))
        return unpack(content)

    monkeypatch.setattr(lowering, "FINISH_BYTES", 0)
    monkeypatch.setattr(flatbuffer_utils, "convert_bytearray_to_object", counted)
    flat = lowering._tflite_flat(result, False, True, None)
    assert len(unpacked) == 3, unpacked  # TF's buffer sharing (2) and metadata (1)
    monkeypatch.undo()
    assert flat.content == _tf_finished(result, "frozen")
