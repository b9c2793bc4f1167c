"""FULLY_CONNECTED ops that share a weight tensor get their run-time bias folded in, so
that XNNPACK leaves them to the builtin kernel, which reads one copy of the weights
(onnx2tf_alt/tflite/shared_weights.py); an unrolled recurrence of one sequence is built that way
(ops/rnn.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from onnx import helper

from onnx2tf_alt.export.delegates import analyze
from onnx2tf_alt.tflite.shared_weights import fold_runtime_biases

from harness import check_model, make_model

rng = np.random.default_rng(3)
UNITS, WIDTH = 6, 5


def _ops(content: bytes) -> list[tuple[str, list[int]]]:
    """(op name, input tensor indices) of the main subgraph."""
    return [(o["op_name"], list(o["inputs"]))
            for o in Interpreter(model_content=content)._get_ops_details()]


def _run(content: bytes, x: np.ndarray) -> list[np.ndarray]:
    interpreter = Interpreter(
        model_content=content,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    runner = interpreter.get_signature_runner()
    outputs = runner(x=x)
    return [outputs[k] for k in sorted(outputs)]


def _tflite(fn) -> bytes:
    holder = tf.Module()
    holder.fn = tf.function(fn, input_signature=[tf.TensorSpec([1, WIDTH], tf.float32, name="x")])
    concrete = holder.fn.get_concrete_function()
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder).convert()


@pytest.fixture(scope="module")
def weights():
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in (("shared", (WIDTH, UNITS)), ("once", (WIDTH, UNITS)),
                                ("back", (UNITS, WIDTH)))}


def test_a_run_time_vector_after_shared_weights_becomes_their_bias(weights):
    """Two products with one weight matrix, each followed by the ADD of a run-time vector:
    both ADDs become FULLY_CONNECTED biases (a ReLU after the ADD moves with it); a product
    with weights of its own keeps its ADD. Values are unchanged."""
    shared, once, back = (tf.constant(weights[k]) for k in ("shared", "once", "back"))

    def fn(x):
        v1 = tf.reshape(tf.tanh(tf.matmul(x, back, transpose_b=True)), [UNITS])
        first = tf.matmul(x, shared) + v1
        second = tf.nn.relu(tf.matmul(tf.sin(x), shared) + v1 * 2.0)
        alone = tf.matmul(tf.cos(x), once) + v1
        return {"a": first, "b": second, "c": alone}

    content = _tflite(fn)
    folded = fold_runtime_biases(content)
    before, after = _ops(content), _ops(folded)
    assert [n for n, _ in before].count("ADD") == 3, before
    assert [n for n, _ in after].count("ADD") == 1, after
    with_bias = [inputs for name, inputs in after if name == "FULLY_CONNECTED"
                 and len(inputs) == 3 and inputs[2] >= 0]
    assert len(with_bias) == 2, after
    x = rng.standard_normal((1, WIDTH)).astype(np.float32)
    for got, expected in zip(_run(folded, x), _run(content, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    report = analyze(folded)
    assert [o.op for o in report.reference_ops] == ["FULLY_CONNECTED"] * 2, report.summary()


def test_nothing_to_fold_returns_the_same_bytes(weights):
    """Shared weights with a constant bias, a product read twice, or no shared weights at
    all: the flatbuffer is returned as it came."""
    shared = tf.constant(weights["shared"])

    def fn(x):
        p = tf.matmul(x, shared)
        q = tf.matmul(tf.sin(x), shared) + tf.constant(weights["shared"][0])
        return {"a": p + tf.reshape(p, [UNITS]), "b": q}

    content = _tflite(fn)
    assert fold_runtime_biases(content) is content
    alone = _tflite(lambda x: {"a": tf.matmul(x, shared)})
    assert fold_runtime_biases(alone) is alone


def _gru(batch: int, steps: int = 6, hidden: int = 4, inputs: int = 3):
    consts = {"w": rng.standard_normal((1, 3 * hidden, inputs)).astype(np.float32) * 0.5,
              "r": rng.standard_normal((1, 3 * hidden, hidden)).astype(np.float32) * 0.5,
              "b": rng.standard_normal((1, 6 * hidden)).astype(np.float32) * 0.5}
    feeds = {"x": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
             "h0": rng.standard_normal((1, batch, hidden)).astype(np.float32)}
    node = helper.make_node("GRU", ["x", "w", "r", "b", "", "h0"], ["y", "y_h"], name="gru",
                            hidden_size=hidden, linear_before_reset=1)
    return make_model([node], feeds, ["y", "y_h"], consts), feeds


def test_one_sequence_runs_its_recurrence_products_on_the_builtin_kernel():
    """A GRU of one sequence: each step's FULLY_CONNECTED has the step's projection as its
    run-time bias, runs on the builtin kernel (one copy of the weights), and everything
    else but the UNPACKs and the PACK stays on XNNPACK."""
    model, feeds = _gru(batch=1)
    converted = check_model(model, feeds)
    report = analyze(converted.tflite, converted.tflite_result(), converted.graph)
    off = [o.op for o in report.reference_ops]
    assert off.count("FULLY_CONNECTED") == 6, report.summary()
    assert set(off) <= {"FULLY_CONNECTED", "UNPACK", "PACK"}, report.summary()
    assert "FULLY_CONNECTED" in {o.op for o in report.ops if o.delegated}  # the projection


def test_several_sequences_get_a_run_time_bias_of_their_own():
    """Batch 2: a step's projection is a matrix, which no bias can hold; the recurrence
    products get R_h's bias as a vector computed at run time instead, and also run on the
    builtin kernel."""
    model, feeds = _gru(batch=2)
    converted = check_model(model, feeds)
    report = analyze(converted.tflite, converted.tflite_result(), converted.graph)
    off = [o.op for o in report.reference_ops]
    assert off.count("FULLY_CONNECTED") == 6, report.summary()


def test_a_converted_file_is_unpacked_once_for_its_report_and_float16(tmp_path, monkeypatch):
    """The float32 file of a model without bound weights is unpacked once on its way out of
    TF's converter (tflite/finish.py, then its run-time biases folded) or of the direct
    writer (export/direct_files.py, the route default flags take here); the delegate report
    reads that unpacked model and the float16 derivation changes it, instead of unpacking
    the file again each (0.45 s each for an unrolled 2-layer LSTM). Both come out as from
    the file itself."""
    import json

    import onnx

    import onnx2tf_alt
    from onnx2tf_alt.export import delegates, direct_files, float16
    from onnx2tf_alt.tflite import finish, flatbuffer, shared_weights

    unpacked, unpack = [], flatbuffer.unpack_model

    def counted(content):
        unpacked.append(len(content))
        return unpack(content)

    for module in (flatbuffer, shared_weights, finish, delegates, float16, direct_files):
        monkeypatch.setattr(module, "unpack_model", counted)
    model, _ = _gru(batch=1)
    source, out = tmp_path / "gru.onnx", tmp_path / "out"
    onnx.save(model, source)
    onnx2tf_alt.convert(input_onnx_file_path=str(source), output_folder_path=str(out),
                        non_verbose=True)
    assert len(unpacked) == 1, unpacked
    monkeypatch.undo()

    float32 = (out / "gru_float32.tflite").read_bytes()
    assert (out / "gru_float16.tflite").read_bytes() == float16.float16_from_float32(float32)
    report = json.loads((out / "gru_delegates.json").read_text())
    fresh = delegates.analyze(float32, path=str(out / "gru_float32.tflite"))
    assert [(o["op"], o["delegated"], o["gpu_issue"], o["outputs"]) for o in report["ops"]] == [
        (o.op, o.delegated, o.gpu_issue, o.outputs) for o in fresh.ops]
    assert report["xnnpack_partitions"] == fresh.partitions
