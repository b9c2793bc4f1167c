"""Quantized TFLite outputs (-odrqt, -oiqt): every variant, calibration from the shipped
photographs and from -cind arrays, the clear failure when calibration data is missing,
QDQ models quantized with their own ranges, and the quantization report.

Quantized conversions are slow (seconds each), so each model is converted once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibration.photos import image_samples
from calibration.samples import CustomData, parse_custom_data, plan_samples
from onnx2tf_alt.api import convert
from onnx2tf_alt.check.file_values import FUSED
from onnx2tf_alt.check.inputs import first_sample
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.pipeline import build
from onnx2tf_alt.quant.quantize import (
    QuantOptions,
    Variant,
    calibrated_tflite,
    compare_outputs,
    cosine,
    figure,
    quantized_tflite,
    run_tflite,
    run_tflites,
)

from harness import count_tflite_ops

ALL_VARIANTS = ("dynamic_range_quant", "integer_quant", "full_integer_quant",
                "integer_quant_with_int16_act", "full_integer_quant_with_int16_act")
SIZE = 32


def _conv_weights(rng, out_ch, in_ch, k=3):
    return (rng.standard_normal((out_ch, in_ch, k, k)) * np.sqrt(2.0 / (in_ch * k * k))).astype(
        np.float32)


def small_cnn() -> onnx.ModelProto:
    """Conv-Relu, strided Conv-Relu, depthwise Conv-Relu with a residual Add, global pool
    and a 10-way classifier; He-scaled random weights."""
    rng = np.random.default_rng(0)
    init = {
        "w1": _conv_weights(rng, 8, 3), "b1": rng.standard_normal(8).astype(np.float32) * 0.1,
        "w2": _conv_weights(rng, 16, 8), "b2": rng.standard_normal(16).astype(np.float32) * 0.1,
        "w3": _conv_weights(rng, 16, 1), "b3": rng.standard_normal(16).astype(np.float32) * 0.1,
        "fc": (rng.standard_normal((16, 10)) * 0.5).astype(np.float32),
        "fcb": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("Add", ["r2", "r3"], ["sum"]),
        helper.make_node("GlobalAveragePool", ["sum"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def token_model(embedding_rows: int = 50) -> onnx.ModelProto:
    """Two non-image inputs: int64 token ids (embedding lookup) and float features."""
    rng = np.random.default_rng(1)
    init = {"emb": rng.standard_normal((embedding_rows, 16)).astype(np.float32),
            "w": (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)}
    nodes = [
        helper.make_node("Gather", ["emb", "tokens"], ["e"]),
        helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
        helper.make_node("Add", ["m", "features"], ["s"]),
        helper.make_node("MatMul", ["s", "w"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, 12]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def filter_scale_counts(content: bytes) -> list[int]:
    """How many scales each int8 filter of a CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED
    of the .tflite has."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = unpack_model(content)
    graph = model.subgraphs[0]
    return [len(graph.tensors[op.inputs[1]].quantization.scale) for op in graph.operators
            if op_name(model, op) in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]


def held_out_images() -> list[dict[str, np.ndarray]]:
    _, held = image_samples(SIZE, SIZE, 3)
    return [{"x": np.transpose(h[np.newaxis], (0, 3, 1, 2))} for h in held]


def read(folder, name) -> bytes:
    with open(os.path.join(folder, name), "rb") as f:
        return f.read()


def tensor_census(content: bytes) -> dict[str, int]:
    """dtype name -> number of tensors in a .tflite."""
    from ai_edge_litert.interpreter import Interpreter

    counts: dict[str, int] = {}
    for t in Interpreter(model_content=content).get_tensor_details():
        name = np.dtype(t["dtype"]).name
        counts[name] = counts.get(name, 0) + 1
    return counts


# --- the small CNN, every variant, shipped photographs -------------------------------------


def quantize_small_cnn(folder, **flags) -> tuple[str, str, dict]:
    """small_cnn() saved in `folder` and converted with -oiqt and `flags`: (model path,
    output folder, quant report)."""
    path = str(folder / "cnn.onnx")
    onnx.save(small_cnn(), path)
    out = str(folder / "out")
    convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
            output_integer_quantized_tflite=True, **flags)
    with open(os.path.join(out, "cnn_quant_report.json")) as f:
        return path, out, json.load(f)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path, out, report = quantize_small_cnn(tmp_path_factory.mktemp("cnn"),
                                           output_dynamic_range_quantized_tflite=True)
    return {"out": out, "converted": build(input_onnx_file_path=path), "report": report}


def test_every_variant_is_written_and_runs(cnn):
    samples = held_out_images()
    for variant in ALL_VARIANTS:
        outputs = run_tflite(read(cnn["out"], f"cnn_{variant}.tflite"), cnn["converted"],
                             samples)
        assert all(o["logits"].shape == (1, 10) and np.isfinite(o["logits"]).all()
                   for o in outputs), variant
    assert [f["variant"] for f in cnn["report"]["files"]] == list(ALL_VARIANTS)


def test_files_measured_together_give_each_files_own_outputs(cnn):
    """run_tflites (the report's measurement: every (file, sample) run shared among the
    cores at once) gives each file what run_tflite gives it alone, and the report's
    figures of every written file are those outputs against the float32 file's."""
    samples = held_out_images()[:3]  # fewer samples than files x cores: runs interleave
    names = ["float32", *ALL_VARIANTS]
    contents = [read(cnn["out"], f"cnn_{name}.tflite") for name in names]
    together = run_tflites(contents, cnn["converted"], samples)
    for name, content, outputs in zip(names, contents, together):
        alone = run_tflite(content, cnn["converted"], samples)
        assert all(np.array_equal(a["logits"], b["logits"]) for a, b in zip(alone, outputs)), name
    everything = held_out_images()
    reference = run_tflite(contents[0], cnn["converted"], everything)
    for name, content in zip(names[1:], contents[1:]):
        figures = compare_outputs(reference, run_tflite(content, cnn["converted"], everything))
        reported = next(f for f in cnn["report"]["files"] if f["variant"] == name)
        assert reported["outputs"] == figures, name


def test_int8_per_channel_is_close_to_float_on_held_out_images(cnn):
    samples = held_out_images()
    reference = run_tflite(read(cnn["out"], "cnn_float32.tflite"), cnn["converted"], samples)
    for variant in ("integer_quant", "full_integer_quant"):
        actual = run_tflite(read(cnn["out"], f"cnn_{variant}.tflite"), cnn["converted"],
                            samples)
        cosines = [cosine(a["logits"], r["logits"]) for a, r in zip(actual, reference)]
        assert min(cosines) >= 0.98, (variant, cosines)
        reported = next(f for f in cnn["report"]["files"] if f["variant"] == variant)
        assert reported["outputs"]["logits"]["cosine"] == pytest.approx(np.mean(cosines))
        assert reported["outputs"]["logits"]["top1_agreement"] >= 0.8


def test_full_integer_file_has_integer_io_and_no_float(cnn):
    content = read(cnn["out"], "cnn_full_integer_quant.tflite")
    ops, tensors = count_tflite_ops(content), tensor_census(content)
    print("full-integer op census:", ops, "tensor dtypes:", tensors)
    assert "QUANTIZE" not in ops and "DEQUANTIZE" not in ops, ops
    assert set(tensors) <= {"int8", "int32"}, tensors
    assert ops.get("CONV_2D") == 2 and ops.get("DEPTHWISE_CONV_2D") == 1, ops
    int16 = tensor_census(read(cnn["out"], "cnn_full_integer_quant_with_int16_act.tflite"))
    assert "float32" not in int16 and "int16" in int16, int16


def test_image_model_without_flags_calibrates_with_shipped_photographs(cnn):
    report = cnn["report"]
    assert report["sources"] == {"x": "shipped photographs (calibration/)"}
    assert (report["calibration_samples"], report["held_out_samples"]) == (18, 6)
    assert not report["qdq"]


def test_per_tensor_weights_and_integer_io_types(cnn):
    converted = cnn["converted"]
    calibration, _ = image_samples(SIZE, SIZE, 3)
    feeds = [{"x": np.transpose(c[np.newaxis], (0, 3, 1, 2))} for c in calibration]
    options = QuantOptions(integer=True, quant_type="per-tensor", input_quant_dtype="uint8",
                           output_quant_dtype="float32")
    variant = Variant("full_integer_quant", ("TFLITE_BUILTINS_INT8",),
                      io_dtypes=("uint8", "float32"))
    content = quantized_tflite(converted, variant, options, feeds).content
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    runner = interpreter.get_signature_runner("serving_default")
    assert next(iter(runner.get_input_details().values()))["dtype"] == np.uint8
    assert next(iter(runner.get_output_details().values()))["dtype"] == np.float32
    per_tensor = _weight_scale_counts(content)
    per_channel = _weight_scale_counts(read(cnn["out"], "cnn_full_integer_quant.tflite"))
    assert per_tensor == [1, 1, 1], per_tensor
    assert sorted(per_channel) == [8, 16, 16], per_channel
    samples = held_out_images()
    reference = run_tflite(read(cnn["out"], "cnn_float32.tflite"), converted, samples)
    metrics = compare_outputs(reference, run_tflite(content, converted, samples))
    assert metrics["logits"]["cosine"] >= 0.98, metrics


def _weight_scale_counts(content: bytes) -> list[int]:
    """Number of quantization scales of each 3x3 conv filter (int8) in a .tflite."""
    from ai_edge_litert.interpreter import Interpreter

    return [len(t["quantization_parameters"]["scales"])
            for t in Interpreter(model_content=content).get_tensor_details()
            if t["dtype"] == np.int8 and len(t["shape"]) == 4 and list(t["shape"][1:3]) == [3, 3]]


# --- non-image inputs: -cind -----------------------------------------------------------------


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(2)
    path = str(folder / "tokens.onnx")
    onnx.save(token_model(), path)
    np.save(folder / "tokens.npy", rng.integers(0, 50, (10, 12)).astype(np.int64))
    np.save(folder / "features.npy", (rng.standard_normal((10, 16)) * 2 + 1).astype(np.float32))
    return folder, path


def test_two_non_image_inputs_quantize_with_cind(token_files):
    folder, path = token_files
    out = str(folder / "out")
    convert(
        input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
        output_integer_quantized_tflite=True,
        custom_input_op_name_np_data_path=[
            ["tokens", str(folder / "tokens.npy")],
            ["features", str(folder / "features.npy"), "1", "2"],
        ],
    )
    with open(os.path.join(out, "tokens_quant_report.json")) as f:
        report = json.load(f)
    assert set(report["sources"]) == {"tokens", "features"}
    assert (report["calibration_samples"], report["held_out_samples"]) == (8, 2)
    written = {f["variant"]: f for f in report["files"] if "error" not in f}
    assert {"integer_quant", "full_integer_quant"} <= set(written), report["files"]
    for variant in ("integer_quant", "full_integer_quant"):
        assert written[variant]["outputs"]["y"]["cosine"] >= 0.98, written[variant]
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_content=read(out, f"tokens_{variant}.tflite")
                             ).get_signature_runner("serving_default")
        dtypes = {k: v["dtype"] for k, v in runner.get_input_details().items()}
        assert dtypes["tokens"] == np.int64, dtypes  # integer inputs stay unquantized


def test_missing_calibration_data_fails_before_writing(token_files, tmp_path):
    _, path = token_files
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "onnx2tf_alt", "-i", path, "-o", str(out), "-oiqt", "-n"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "'tokens'" in done.stderr and "-cind tokens" in done.stderr, done.stderr
    assert not out.exists()


def test_missing_calibration_data_is_said_before_converting(token_files, tmp_path, monkeypatch):
    """The model is planned (its inputs' shapes known) and then refused: nothing is
    converted first (a 2.3 GB model's -oiqt without -cind took 12.2 s and 1.36 GB to be told,
    now 0.33 s and 66 MB)."""
    from onnx2tf_alt import conversion
    from onnx2tf_alt.errors import InputError

    def converting(*args, **kwargs):
        raise AssertionError("converted before the calibration data was checked")

    monkeypatch.setattr(conversion, "direct_conversion", converting)
    monkeypatch.setattr(conversion, "translate", converting)
    _, path = token_files
    with pytest.raises(InputError, match="-cind tokens"):
        convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / "out"),
                non_verbose=True, output_integer_quantized_tflite=True)
    assert not (tmp_path / "out").exists()


def test_calibration_sample_planning(token_files):
    """Whole-input samples (rank + 1) and batch rows (same rank) are both N samples, split
    alike for every input so paired rows stay paired; MEAN and STD normalize; a single
    sample is perturbed to give held-out ones."""
    _, path = token_files
    graph = build(input_onnx_file_path=path).graph
    rows = np.repeat(np.arange(5, dtype=np.float32)[:, np.newaxis], 16, axis=1)
    tokens = CustomData("tokens", "t.npy", np.repeat(np.arange(5)[:, None, None], 12, axis=2))
    for array in (rows, rows.reshape(5, 1, 16)):
        samples = plan_samples(graph, {"tokens": tokens,
                                       "features": CustomData("features", "f.npy", array)})
        assert len(samples.calibration) == 4 and len(samples.held_out) == 1
        for sample in samples.calibration + samples.held_out:
            assert sample["features"].shape == (1, 16) and sample["tokens"].shape == (1, 12)
            assert sample["features"][0, 0] == sample["tokens"][0, 0]
    single = plan_samples(graph, {"tokens": tokens, "features": CustomData(
        "features", "f.npy", rows[3:4] + 1, np.float32([1.0]), np.float32([2.0]))})
    assert np.array_equal(single.calibration[0]["features"], np.full((1, 16), 1.5, np.float32))
    held = [s["features"] for s in single.held_out]
    assert len(held) == 2 and all(0 < np.abs(h - 1.5).max() < 0.1 for h in held)
    trimmed = first_sample({"features": rows.reshape(5, 1, 16), "tokens": tokens.array[:, 0]}, graph)
    assert trimmed["features"].shape == (1, 16) and trimmed["tokens"].shape == (1, 12)


def test_cind_entries_are_checked(tmp_path):
    from onnx2tf_alt.errors import InputError

    np.save(tmp_path / "a.npy", np.zeros((2, 3, 4, 4), np.float32))
    parsed = parse_custom_data([["x", str(tmp_path / "a.npy"), "[0.485,0.456,0.406]", "0.25"]])
    assert parsed["x"].mean.tolist() == pytest.approx([0.485, 0.456, 0.406])
    with pytest.raises(InputError, match="NAME FILE.npy"):
        parse_custom_data([["x", str(tmp_path / "a.npy"), "0.5"]])
    with pytest.raises(InputError, match="MEAN"):
        parse_custom_data([["x", str(tmp_path / "a.npy"), "mean", "1"]])


# --- QDQ models --------------------------------------------------------------------------


class _Reader:
    """onnxruntime calibration reader over the shipped calibration photographs."""

    def __init__(self):
        calibration, _ = image_samples(SIZE, SIZE, 3)
        self.feeds = iter([{"x": np.transpose(c[np.newaxis], (0, 3, 1, 2))}
                           for c in calibration])

    def get_next(self):
        return next(self.feeds, None)


@pytest.mark.parametrize("tflite_only", [False, True], ids=["beside_keras", "direct"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_qdq_model_quantizes_with_its_own_ranges(per_channel, tflite_only, tmp_path):
    """TF's converter quantizes the FakeQuant ops of the Keras model (beside a saved_model);
    with -dms the own quantizer puts the direct writer's file on the model's grids
    (quant/qdq_grids.py), without TensorFlow."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    float_path, qdq_path = str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx")
    onnx.save(small_cnn(), float_path)
    quantize_static(float_path, qdq_path, _Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    out = str(tmp_path / "out")
    convert(input_onnx_file_path=qdq_path, output_folder_path=out, non_verbose=True,
            output_integer_quantized_tflite=True, disable_model_save=tflite_only,
            quant_type="per-channel" if per_channel else "per-tensor")
    with open(os.path.join(out, "qdq_quant_report.json")) as f:
        report = json.load(f)
    assert report["qdq"] and report["calibration_samples"] == 0
    assert [f["variant"] for f in report["files"]] == [
        "dynamic_range_quant", "integer_quant", "full_integer_quant"]
    session = ort.InferenceSession(qdq_path, providers=["CPUExecutionProvider"])
    qdq = onnx.load(qdq_path)
    (last,) = [n for n in qdq.graph.node if n.output[0] == "logits"]
    assert last.op_type == "DequantizeLinear"
    output_scale = float(next(onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer
                              if i.name == last.input[1]))
    samples = held_out_images()
    expected = [session.run(None, s)[0] for s in samples]
    converted = build(input_onnx_file_path=qdq_path)
    for variant in ("integer_quant", "full_integer_quant"):
        content = read(out, f"qdq_{variant}.tflite")
        ops = count_tflite_ops(content)
        assert ops.get("CONV_2D") == 2 and "ROUND" not in ops, ops  # quantized, not emulated
        actual = run_tflite(content, converted, samples)
        cosines = [cosine(a["logits"], e) for a, e in zip(actual, expected)]
        assert min(cosines) >= 0.99, (variant, cosines)
        # onnxruntime runs the QDQ graph on integer kernels; the INT8 file lands on the
        # same integers (conv requantization, residual add, pooling, classifier; per-tensor
        # weights kept per tensor)
        steps = [np.abs(a["logits"] - e) / output_scale for a, e in zip(actual, expected)]
        assert max(float(d.max()) for d in steps) < 0.5, (variant, [d.max() for d in steps])
        scales = filter_scale_counts(content)
        assert len(scales) == 4 and all((n > 1) == per_channel for n in scales), scales
    assert report["quant_type"] == ("per-channel" if per_channel else "per-tensor")


# --- the accuracy checker on the quantized files --------------------------------------------


@pytest.mark.parametrize("full", [True, False])
def test_checker_compares_quantized_files_dequantized(full, tmp_path, monkeypatch):
    """-oiqt with -cotof / -coto: each INT8 file is a backend of the accuracy report, its
    values dequantized and compared with onnxruntime on a held-out photograph; every node of
    the small CNN stays above the cosine bar in every INT8 variant. With -cotof the values
    are read out of the shipped files (check/file_values.py): the convolutions' sums, which
    the files compute inside the CONV_2D that applies the ReLU, and the Flatten, which the
    FULLY_CONNECTED does, hold no tensor and are unobserved, saying why. TF's TFLite
    converter is not called: the float32 file's values come from the direct writer's probe
    (every value observed), the quantized files are the own quantizer's."""
    import tensorflow as tf

    class Refused:
        def __getattr__(self, name):
            raise AssertionError(f"TF's TFLite converter used ({name})")

    monkeypatch.setattr(tf.lite, "TFLiteConverter", Refused())
    path = str(tmp_path / "cnn.onnx")
    onnx.save(small_cnn(), path)
    out = str(tmp_path / "out")
    model = convert(
        input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
        output_integer_quantized_tflite=True,
        check_onnx_tf_outputs_elementwise_close_full=full,
        check_onnx_tf_outputs_elementwise_close=not full,
        output_saved_model=True,  # a Keras model too, checked beside the files
    )
    report = model.onnx2tf_alt_report
    float_checks = report.backends["tflite"].checks
    assert len(float_checks) == (10 if full else 1)
    assert all(c.status == "pass" for c in float_checks), float_checks
    quantized = {k: b for k, b in report.backends.items() if k.startswith("tflite:")}
    assert sorted(quantized) == sorted(f"tflite:{v}" for v in ALL_VARIANTS)  # -oiqt: all
    for name, backend in quantized.items():
        assert not backend.error, (name, backend.error)
        assert backend.criterion == "cosine >= 0.98"
        observed = [c for c in backend.checks if c.status != "unobserved"]
        unobserved = {c.output_name: c.note for c in backend.checks if c not in observed}
        if full:
            assert unobserved == dict.fromkeys(["c1", "c2", "c3", "flat"], FUSED), name
        assert len(observed) == (len(report.backends["tf"].checks) - 4 if full else 1), name
        assert all(c.status == "pass" and c.cosine >= 0.98 for c in observed), [
            (c.output_name, c.cosine) for c in observed]
    with open(os.path.join(out, "cnn_accuracy_report.json")) as f:
        saved = json.load(f)
    assert set(saved["backends"]) == {"tf", "tflite", *quantized}
    with open(os.path.join(out, "cnn_quant_report.json")) as f:
        quant = json.load(f)
    sensitivity = quant.get("sensitivity")
    with open(os.path.join(out, "cnn_accuracy_report.html")) as f:
        page = f.read()
    section = page[page.index("<h2>Quantized files against the float32 TFLite"):]
    for entry in quant["files"]:  # the page shows the quant report's held-out cosines
        cosine = entry["outputs"]["logits"]["cosine"]
        assert (f"<td>{entry['variant']}</td><td>logits</td>"
                f"<td class='num'>{cosine:.5f}</td>") in section
    if full:  # -cotof also ranks the INT8 files' nodes; nothing is kept in float for it
        assert sensitivity["top_offenders"] and sensitivity["kept_float_nodes"] == []
        first = sensitivity["top_offenders"][0]
        assert "<h2>Most sensitive INT8 nodes</h2>" in section
        assert f"<td class='num'>1</td><td>{', '.join(first['nodes'])}</td>" in section
    else:
        assert sensitivity is None and "Most sensitive INT8 nodes" not in page


def test_per_tensor_writes_the_int16_files_per_channel(tmp_path):
    """-qt per-tensor with a depthwise conv: TFLite's 16x8 mode has no per-tensor depthwise
    kernels, so the INT16 files keep per-channel weights (said in the report); all written."""
    path = str(tmp_path / "cnn.onnx")
    onnx.save(small_cnn(), path)
    out = str(tmp_path / "out")
    convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
            output_integer_quantized_tflite=True, quant_type="per-tensor")
    with open(os.path.join(out, "cnn_quant_report.json")) as f:
        report = json.load(f)
    assert [f.get("error") for f in report["files"]] == [None] * 5, report["files"]
    assert any("per-channel weights" in note for note in report["notes"]), report["notes"]
    int16 = read(out, "cnn_full_integer_quant_with_int16_act.tflite")
    assert "DEPTHWISE_CONV_2D" in count_tflite_ops(int16)
    assert _weight_scale_counts(read(out, "cnn_full_integer_quant.tflite")) == [1, 1, 1]


# --- --calibration_method ------------------------------------------------------------------


def test_int8_parameters_match_onnxruntime():
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    from calibration.ort import int8_parameters

    for low, high in [(-1.5, 3.0), (0.0, 6.0), (0.2, 0.9), (-4.0, -1.0)]:
        ours = int8_parameters(low, high)
        zero_point, scale = compute_scale_zp(np.float32(low), np.float32(high), np.int8(-128),
                                             np.int8(127))
        assert ours["zero_point"] == int(zero_point) and ours["scale"] == pytest.approx(
            float(scale), rel=1e-6), (low, high)


def test_fake_quantized_model_leaves_fused_activations_alone():
    from calibration.ort import fake_quantized, onnx_ranges

    model = small_cnn()
    samples = [{"x": h["x"]} for h in held_out_images()]
    ranges = onnx_ranges(model, samples, "ort_percentile")
    assert {"x", "r1", "r2", "r3", "sum", "logits"} <= set(ranges)
    rewritten = fake_quantized(model, ranges)
    quantized = {n.output[0] for n in rewritten.graph.node if n.op_type == "FakeQuantize"}
    assert {"r1", "r2", "r3", "sum", "pool", "flat", "logits"} <= quantized
    assert not {"c1", "c2", "c3"} & quantized  # each feeds only a Relu, fused in TFLite
    assert [o.name for o in rewritten.graph.output] == ["logits"]
    onnx.checker.check_model(rewritten)


def test_onnxruntimes_calibrators_read_the_weights_kept_on_disk(tmp_path, monkeypatch):
    """onnxruntime's calibrators take a model file: the weights kept on disk (external data,
    or a single file's read in place: most models' now) go into the copy they are given
    (the copy's locations, relative to the model's folder, were not found)."""
    from calibration.ort import onnx_ranges
    from onnx2tf_alt.ir import weights
    from onnx2tf_alt.ir.loader import load_model

    monkeypatch.setattr(weights, "INFERENCE_VALUE_LIMIT", 16)  # every weight stays on disk
    path = tmp_path / "m.onnx"
    onnx.save(small_cnn(), path, save_as_external_data=True, location="m.bin",
              size_threshold=0)
    model = load_model(str(path))
    assert any(weights.is_external(t) for t in model.graph.initializer)
    samples = [{"x": h["x"]} for h in held_out_images()][:3]
    ranges = onnx_ranges(model, samples, "ort_percentile")
    assert ranges == onnx_ranges(small_cnn(), samples, "ort_percentile")


def test_fake_quantized_model_leaves_foldable_scale_and_shift_alone():
    """Conv -> Mul(constant) -> Add(constant) -> Relu (a BatchNorm as exported by some
    tools): TFLite folds the three into one CONV_2D, so only the Relu output gets a range."""
    from calibration.ort import fake_quantized

    rng = np.random.default_rng(3)
    inits = {"w": _conv_weights(rng, 4, 3), "s": rng.random((1, 4, 1, 1)).astype(np.float32),
             "t": rng.random((1, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "bn_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ranges = {name: (-1.0, 1.0) for name in ("x", "c", "m", "a", "y")}
    rewritten = fake_quantized(model, ranges)
    quantized = {n.input[0] for n in rewritten.graph.node if n.op_type == "FakeQuantize"}
    assert quantized == {"x", "y__float"}, quantized


def test_clipping_calibrators_narrow_the_min_max_ranges():
    from calibration.ort import onnx_ranges

    model = small_cnn()
    samples = [{"x": h["x"]} for h in held_out_images()]
    full = onnx_ranges(model, samples, "ort_minmax")
    for method in ("ort_percentile", "entropy"):
        clipped = onnx_ranges(model, samples, method)
        assert set(clipped) == set(full)
        for name, (low, high) in clipped.items():
            assert full[name][0] - 1e-6 <= low <= high <= full[name][1] + 1e-6, (method, name)
        assert any(clipped[n][1] < full[n][1] - 1e-6 for n in full), method


@pytest.mark.parametrize("method", ["ort_minmax", "ort_percentile", "mse", "minmax"])
def test_every_calibration_method_quantizes(method, cnn, tmp_path):
    """onnxruntime's calibrators (FakeQuantize ranges) and the ranges measured on the
    TFLite graph (calibration/ranges.py; the default, auto, is the `cnn` fixture's)."""
    _, out, report = quantize_small_cnn(tmp_path, calibration_method=method)
    assert report["calibration_method"] == method and not report["qdq"]
    assert [f["variant"] for f in report["files"]] == list(ALL_VARIANTS)
    samples = held_out_images()
    reference = run_tflite(read(cnn["out"], "cnn_float32.tflite"), cnn["converted"], samples)
    for variant in ("integer_quant", "full_integer_quant"):
        content = read(out, f"cnn_{variant}.tflite")
        actual = run_tflite(content, cnn["converted"], samples)
        cosines = [cosine(a["logits"], r["logits"]) for a, r in zip(actual, reference)]
        assert min(cosines) >= 0.98, (variant, cosines)
        ops = count_tflite_ops(content)
        assert ops.get("CONV_2D") == 2 and ops.get("DEPTHWISE_CONV_2D") == 1, ops
    full = read(out, "cnn_full_integer_quant.tflite")
    assert set(tensor_census(full)) <= {"int8", "int32"}, tensor_census(full)
    assert "DEQUANTIZE" not in count_tflite_ops(full)


def test_unknown_calibration_method_is_refused(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(small_cnn(), path)
    with pytest.raises(InputError, match="calibration_method"):
        convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / "out"),
                non_verbose=True, output_integer_quantized_tflite=True,
                calibration_method="magic")
    assert not os.path.exists(tmp_path / "out")


# --- mixed precision: --keep_float, --keep_float_auto, the sensitivity ranking ----------------


def _op_dtypes(content: bytes, op_name: str) -> list[list[str]]:
    """Input dtypes of every `op_name` op of a .tflite."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    tensors = {t["index"]: np.dtype(t["dtype"]).name for t in interpreter.get_tensor_details()}
    return [[tensors[i] for i in op["inputs"] if i >= 0]
            for op in interpreter._get_ops_details() if op["op_name"] == op_name]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """small_cnn with its depthwise conv (unnamed: named by its output 'c3') kept in float."""
    _, out, report = quantize_small_cnn(tmp_path_factory.mktemp("mixed"), keep_float=["c3"])
    return out, report


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """small_cnn with --keep_float_auto and a target few of its INT8 files reach."""
    _, out, report = quantize_small_cnn(tmp_path_factory.mktemp("searched"),
                                        keep_float_auto=0.99999)
    return out, report


def _producer(converted, value: str) -> str:
    return next(n.name for n in converted.graph.nodes if value in n.outputs)


def test_keep_float_leaves_the_named_node_in_float(mixed, cnn):
    out, report = mixed
    assert report["sensitivity"]["kept_float_nodes"] == [_producer(cnn["converted"], "c3")]
    for variant in ("integer_quant", "full_integer_quant"):
        content = read(out, f"cnn_{variant}.tflite")
        assert _op_dtypes(content, "DEPTHWISE_CONV_2D") == [["float32"] * 3], variant
        assert "DEQUANTIZE" in count_tflite_ops(content), variant
    # the INT8 file without --keep_float quantizes the same op
    assert _op_dtypes(read(cnn["out"], "cnn_integer_quant.tflite"), "DEPTHWISE_CONV_2D") == [
        ["int8", "int8", "int32"]]
    samples = held_out_images()
    reference = run_tflite(read(cnn["out"], "cnn_float32.tflite"), cnn["converted"], samples)
    for entry in report["files"]:
        actual = run_tflite(read(out, entry["file"]), cnn["converted"], samples)
        cosines = [cosine(a["logits"], r["logits"]) for a, r in zip(actual, reference)]
        assert min(cosines) >= 0.98, (entry["file"], cosines)
        assert entry["outputs"]["logits"]["cosine"] == pytest.approx(np.mean(cosines))


def test_keep_float_auto_searches_on_calibration_and_is_judged_held_out(searched, cnn):
    """The search tries segments best-estimated first, re-quantizing with each and keeping
    only steps that gain on calibration samples (the selection set); the nodes it finds are
    kept only when the file with them beats the all-INT8 file beyond noise on the samples
    the search never saw. The held-out figures of that judgement are the written file's."""
    out, report = searched
    sensitivity = report["sensitivity"]
    search = sensitivity["search"]
    cosines = [step["cosine"] for step in search]
    assert len(search) >= 2 and cosines == sorted(cosines), search
    assert search[0]["cosine"] == sensitivity["cosine_int8"] < 0.99999
    assert sensitivity["target_reached"] == (cosines[-1] >= 0.99999)
    assert "calibration samples" in sensitivity["search_samples"]
    gains = [r["estimated_gain"] for r in sensitivity["top_offenders"]]
    assert gains == sorted(gains, reverse=True) and gains[0] > 0, gains
    keys = {n.name for n in cnn["converted"].graph.nodes}
    assert all(r["nodes"] and set(r["nodes"]) <= keys for r in sensitivity["top_offenders"])
    added = {n for step in search[1:] for n in step["added"]}
    tried = [r for r in sensitivity["top_offenders"] if "measured_gain" in r]
    assert tried and all(set(r["nodes"]) <= added for r in tried if r["measured_gain"] > 0)
    judged = sensitivity["judged"]  # held-out samples + calibration ones the search skipped
    assert judged["held_out"] == len(held_out_images()) < judged["samples"]
    assert judged["kept"] == (judged["mixed"] - judged["int8"] > judged["noise"])
    assert set(sensitivity["kept_float_nodes"]) == (added if judged["kept"] else set())
    assert any(("): kept" if judged["kept"] else "not kept") in n for n in report["notes"])
    samples = held_out_images()
    reference = run_tflite(read(cnn["out"], "cnn_float32.tflite"), cnn["converted"], samples)
    actual = run_tflite(read(out, "cnn_integer_quant.tflite"), cnn["converted"], samples)
    measured = figure(compare_outputs(reference, actual))
    held = sensitivity["held_out"]
    assert held["samples"] == len(samples)
    assert measured == pytest.approx(held["mixed" if judged["kept"] else "int8"], abs=1e-6)
    written = next(f for f in report["files"] if f["variant"] == "integer_quant")
    assert figure(written["outputs"]) == pytest.approx(measured)


def test_unknown_keep_float_node_is_refused(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(small_cnn(), path)
    with pytest.raises(InputError, match="--keep_float names node"):
        convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / "out"),
                non_verbose=True, output_integer_quantized_tflite=True, keep_float=["nope"])
    assert not os.path.exists(tmp_path / "out")


def test_cind_takes_onnx2tf_nested_per_channel_lists(tmp_path, cnn):
    """MEAN / STD as onnx2tf writes them (nested in the input's rank, NHWC-like or NCHW-like),
    also split by the shell at spaces, normalize each channel of an NCHW input."""
    rng = np.random.default_rng(4)
    pixels = rng.random((3, 1, 3, SIZE, SIZE)).astype(np.float32)
    np.save(tmp_path / "x.npy", pixels)
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    expected = (pixels.reshape(3, 3, SIZE, SIZE) - mean[:, None, None]) / std[:, None, None]
    entries = [
        ["x", str(tmp_path / "x.npy"), "[[[[0.485,0.456,0.406]]]]", "[[[[0.229,0.224,0.225]]]]"],
        ["x", str(tmp_path / "x.npy"), "[[[[0.485]],[[0.456]],[[0.406]]]]",
         "[[[[0.229]],[[0.224]],[[0.225]]]]"],
        ["x", str(tmp_path / "x.npy"), "[[[[0.485,", "0.456,", "0.406]]]]", "[0.229", "0.224",
         "0.225]"],
    ]
    for entry in entries:
        parsed = parse_custom_data([entry])
        assert parsed["x"].mean.tolist() == pytest.approx(mean.tolist()), entry
        assert parsed["x"].std.tolist() == pytest.approx(std.tolist()), entry
        samples = plan_samples(cnn["converted"].graph, parsed)
        got = np.concatenate([s["x"] for s in samples.calibration + samples.held_out])
        for row in got:  # each sample is one of the normalized pixels
            assert min(np.abs(row - e).max() for e in expected) < 1e-5
        # held out: never one of the calibration samples
        assert len(samples.held_out) == 1 and len(samples.calibration) == 2
        assert all(not np.array_equal(samples.held_out[0]["x"], c["x"])
                   for c in samples.calibration)


def _quantized_on(folder, graph, samples: np.ndarray) -> tuple[str, str, dict]:
    """`graph` (one input x) saved as <graph name>.onnx in `folder` and converted with -oiqt
    on `samples` as its calibration data: (model path, output folder, quant report)."""
    path = str(folder / f"{graph.name}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    np.save(folder / "x.npy", samples)
    out = str(folder / "out")
    convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
            output_integer_quantized_tflite=True,
            custom_input_op_name_np_data_path=[["x", str(folder / "x.npy")]])
    with open(os.path.join(out, f"{graph.name}_quant_report.json")) as f:
        return path, out, json.load(f)


def test_decomposed_layer_norm_int16_files_run(tmp_path):
    """A LayerNorm exported as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div (PaddleOCR's text
    recognizer): the square is a MUL of the SUB, not SQUARE(a - b), which TFLite fuses into
    a SQUARED_DIFFERENCE without INT16-activation kernel; every file runs and is measured."""
    rng = np.random.default_rng(8)
    shape = (2, 7, 24)
    init = {"two": np.array(2, np.float32), "eps": np.array(1e-5, np.float32),
            "w": (rng.standard_normal((24, 10)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"]),
             helper.make_node("MatMul", ["n", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "layer_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 7, 10))],
        [numpy_helper.from_array(v, k) for k, v in init.items()])
    _, out, report = _quantized_on(tmp_path, graph, (rng.standard_normal(
        (12, *shape[1:])) * 3 + 1).astype(np.float32))
    for entry in report["files"]:
        assert "error" not in entry and "not_measured" not in entry, entry
        assert entry["outputs"]["y"]["cosine"] >= 0.98, entry
    for name in ("layer_norm_float32.tflite",
                 "layer_norm_full_integer_quant_with_int16_act.tflite"):
        ops = count_tflite_ops(read(out, name))
        assert "SQUARED_DIFFERENCE" not in ops and "SQUARE" not in ops, (name, ops)


def _coarse_grid_model() -> onnx.ModelProto:
    """Conv -> Mul by a per-channel constant that makes channel 0 thirty times wider than
    the others (folded into the Conv) -> Conv that reads channel 0 thirty times weaker ->
    Relu -> Conv: quantized per tensor, that output keeps the other channels on a grid of a
    few codes, the one tensor whose 8-bit rounding costs the output most."""
    rng = np.random.default_rng(3)
    scale = np.ones((1, 6, 1, 1), np.float32)
    scale[0, 0] = 30.0
    weights = (rng.standard_normal((6, 6, 1, 1)) * 0.5).astype(np.float32)
    weights[:, 0] /= 30.0
    init = {"w0": (rng.standard_normal((6, 3, 3, 3)) * 0.4).astype(np.float32),
            "s": scale, "w1": weights,
            "w2": (rng.standard_normal((4, 6, 1, 1)) * 0.5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Mul", ["c0", "s"], ["wide"], name="widen"),
             helper.make_node("Conv", ["wide", "w1"], ["c1"], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(
        nodes, "coarse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 14])],
        [numpy_helper.from_array(v, k) for k, v in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_one_pass_ranking_finds_the_coarse_tensor_and_agrees_with_measurement():
    """noise_scores ranks the segment of the tensor on a coarse grid first, from one pass
    (rounding error x output gradient), and its estimate is the gain measured by
    re-quantizing with that segment in float, within a factor of two; the estimates of
    the other segments are smaller, like their measured gains."""
    from onnx2tf_alt.quant.sensitivity import choose_float_ops

    converted = build(input_onnx_file_path=None, onnx_graph=_coarse_grid_model())
    rng = np.random.default_rng(5)
    samples = [{"x": rng.standard_normal((1, 3, 12, 14)).astype(np.float32)} for _ in range(8)]
    calibrated, _ = calibrated_tflite(converted, QuantOptions(integer=True,
                                                              calibration_method="minmax"),
                                      samples)
    reference = run_tflite(calibrated.content, converted, samples)

    def score(content: bytes) -> float:
        return figure(compare_outputs(reference, run_tflite(content, converted, samples)))

    mixed = choose_float_ops(calibrated, converted, score, False, [], 0.999999, True, samples)
    first = mixed.ranking[0]
    assert "conv0" in first["nodes"], mixed.ranking
    assert first["measured_gain"] > 0 and mixed.search[1]["added"] == first["nodes"]
    assert 0.5 < first["estimated_gain"] / first["measured_gain"] < 2.0, first
    others = [r for r in mixed.ranking[1:] if "measured_gain" in r]
    assert all(r["measured_gain"] < first["measured_gain"] for r in others), mixed.ranking


def test_division_by_a_tensor_that_reaches_zero_stays_float(tmp_path):
    """y = MatMul(x / (Relu(max(x)) + 0.001), w): on samples whose values are all negative
    (and small) the divisor is 0.001, below half an 8-bit step of its range, where TFLite's
    int8 DIV stops the invocation. The INT8 files keep that DIV in float (a note says so) and run
    on every calibration and held-out sample, close to the float32 file."""
    rng = np.random.default_rng(12)
    init = {"eps": np.array(0.001, np.float32),
            "w": (rng.standard_normal((16, 5)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "eps"], ["d"]),
             helper.make_node("Div", ["x", "d"], ["q"]),
             helper.make_node("MatMul", ["q", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "div", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5))],
        [numpy_helper.from_array(v, k) for k, v in init.items()])
    samples = rng.uniform(0.5, 4.0, (12, 2, 16)).astype(np.float32)
    samples[::4] *= -0.001  # a quarter whose peak is negative: divisor 0.001
    path, out, report = _quantized_on(tmp_path, graph, samples)
    assert any("1 DIV op(s) with a computed divisor kept in float" in n
               for n in report["notes"]), report["notes"]
    converted = build(input_onnx_file_path=path)
    feeds = [{"x": s} for s in samples]
    reference = run_tflite(read(out, "div_float32.tflite"), converted, feeds)
    for variant in ("integer_quant", "full_integer_quant"):
        content = read(out, f"div_{variant}.tflite")
        assert _op_dtypes(content, "DIV") == [["float32", "float32"]], variant
        actual = run_tflite(content, converted, feeds)  # runs on every sample
        assert all(np.isfinite(a["y"]).all() for a in actual), variant
        ordinary = [k for k in range(len(feeds)) if k % 4]
        assert figure(compare_outputs([reference[k] for k in ordinary],
                                      [actual[k] for k in ordinary])) > 0.99, variant


def test_float_segment_follows_readers_through_ops_that_only_move_values():
    """A node's float segment reaches through RESHAPE / TRANSPOSE readers (the quantizer
    keeps them on their input's grid even when denylisted) up to the ops that compute with
    the value, and no further."""
    from onnx2tf_alt.quant.sensitivity import OpInfo, denylist

    infos = [OpInfo(0, "CONV_2D", "conv", ["a"], [1, 4]),
             OpInfo(1, "RESHAPE", "reshape", ["b"], [2]),
             OpInfo(2, "TRANSPOSE", "transpose", ["b"], [3]),
             OpInfo(3, "LOG", "log", ["c"], [5]),
             OpInfo(4, "MUL", "mul", ["d"], [5]),
             OpInfo(5, "ADD", "add", ["e"], [])]
    assert denylist(infos, {"a"}) == ["conv", "log", "mul", "reshape", "transpose"]
    assert denylist(infos, {"c"}) == ["add", "log"]


def test_quantized_files_beside_a_saved_model_are_the_tflite_only_runs(tmp_path):
    """With a saved_model beside them, the float32, INT8, INT16-activation and int4 files
    are made from the direct writer's graph as with -dms: byte for byte the same files."""
    path = str(tmp_path / "cnn.onnx")
    onnx.save(small_cnn(), path)
    for name, tflite_only in (("dms", True), ("beside", False)):
        convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / name),
                non_verbose=True, output_integer_quantized_tflite=True,
                output_int4_weight_quantized_tflite=True, output_saved_model=not tflite_only)
    assert (tmp_path / "beside" / "saved_model.pb").exists()
    for suffix in ("float32", "integer_quant", "full_integer_quant",
                   "integer_quant_with_int16_act", "int4_weight_quant"):
        dms, beside = (read(str(tmp_path / n), f"cnn_{suffix}.tflite") for n in ("dms", "beside"))
        assert dms == beside, suffix


def _quantized_upsampler(folder, rng, init: dict, tail: list, y_shape) -> tuple[str, dict]:
    """x (2, 4, 7, 9) -> Conv 3x3 -> Relu -> `tail` (reading r, writing y), "up", converted
    with -oiqt on 8 random samples: (output folder, quant report)."""
    init = {"w": (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32), **init}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), *tail]
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4, 7, 9))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in init.items()])
    samples = rng.standard_normal((8, 2, 4, 7, 9)).astype(np.float32)
    _, out, report = _quantized_on(folder, graph, samples)
    return out, report


def test_transposed_convolutions_as_phases_quantize_to_integer_kernels(tmp_path):
    """A ConvTranspose of equal strides is convolutions of its output phases
    (passes/deconv_phases.py): every INT8 file computes them on int8 CONV_2D, the
    CONCATENATION and DEPTH_TO_SPACE keep one grid, and the files stay close to the float32
    one (a DB text detector's head: 2x2 / 2, then BatchNormalization and Relu)."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    rng = np.random.default_rng(6)
    init = {"t": (rng.standard_normal((6, 5, 3, 3)) * 0.3).astype(np.float32),
            "tb": rng.standard_normal(5).astype(np.float32) * 0.1,
            "g": rng.uniform(0.5, 1.5, 5).astype(np.float32),
            "be": rng.standard_normal(5).astype(np.float32) * 0.1,
            "m": rng.standard_normal(5).astype(np.float32) * 0.1,
            "v": rng.uniform(0.5, 1.5, 5).astype(np.float32)}
    tail = [helper.make_node("ConvTranspose", ["r", "t", "tb"], ["u"], strides=[2, 2],
                             pads=[1, 1, 1, 1], output_padding=[1, 1]),
            helper.make_node("BatchNormalization", ["u", "g", "be", "m", "v"], ["n"]),
            helper.make_node("Relu", ["n"], ["y"])]
    out, report = _quantized_upsampler(tmp_path, rng, init, tail, (2, 5, 14, 18))
    for variant in ("integer_quant", "full_integer_quant"):
        model = unpack_model(read(out, f"up_{variant}.tflite"))
        graph_ = model.subgraphs[0]
        ops = [(op_name(model, o), o) for o in graph_.operators]
        names = [name for name, _ in ops]
        assert "TRANSPOSE_CONV" not in names and names.count("CONV_2D") == 5, names
        for name, op in ops:
            if name in ("CONV_2D", "CONCATENATION", "DEPTH_TO_SPACE"):
                assert graph_.tensors[op.outputs[0]].type == 9, (variant, name)  # INT8
            if name == "DEPTH_TO_SPACE":
                into, out_ = (graph_.tensors[t].quantization for t in (op.inputs[0],
                                                                        op.outputs[0]))
                assert (list(into.scale), list(into.zeroPoint)) == (
                    list(out_.scale), list(out_.zeroPoint))
    cosines = {e["variant"]: e["outputs"]["y"]["cosine_min"] for e in report["files"]}
    assert min(cosines["integer_quant"], cosines["full_integer_quant"]) > 0.99, cosines


def test_transposed_convolutions_stay_float_where_the_file_takes_float(tmp_path):
    """XNNPACK's int8 TRANSPOSE_CONV is several times slower than its float one: the INT8
    file with float inputs and outputs computes it in float (a note says so), the
    full-integer one in int8; both stay close to the float32 file."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    rng = np.random.default_rng(5)
    init = {"t": (rng.standard_normal((6, 5, 2, 2)) * 0.3).astype(np.float32),
            "tb": rng.standard_normal(5).astype(np.float32) * 0.1}
    # unequal strides: one TRANSPOSE_CONV (deconv_phases.py takes equal ones)
    tail = [helper.make_node("ConvTranspose", ["r", "t", "tb"], ["y"], strides=[2, 3])]
    out, report = _quantized_upsampler(tmp_path, rng, init, tail, (2, 5, 14, 26))
    assert any("TRANSPOSE_CONV op(s) kept in float" in n for n in report["notes"]), report
    kinds = {}
    for variant in ("integer_quant", "full_integer_quant"):
        model = unpack_model(read(out, f"up_{variant}.tflite"))
        graph_ = model.subgraphs[0]
        (op,) = [o for o in graph_.operators if op_name(model, o) == "TRANSPOSE_CONV"]
        kinds[variant] = graph_.tensors[op.inputs[1]].type  # the filter's
    assert kinds == {"integer_quant": 0, "full_integer_quant": 9}, kinds  # FLOAT32, INT8
    cosines = {e["variant"]: e["outputs"]["y"]["cosine_min"] for e in report["files"]}
    assert min(cosines["integer_quant"], cosines["full_integer_quant"]) > 0.99, cosines


def test_a_spilled_source_comes_back_whole_and_calibrations_are_dropped_when_done():
    """The INT16 files' source waits in an unlinked temporary file while the INT8 files are
    made (its bytes come back unchanged when first read), and each calibrated file is
    dropped once no later file reads it."""
    from types import SimpleNamespace

    from onnx2tf_alt.quant import quantize as q

    content = bytes(np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8))
    source = SimpleNamespace(result=SimpleNamespace(content=content))
    q._spill(source)
    assert source.result.content == b"" and source.result.spilled is not None
    plan = q.QuantPlan(q.QuantOptions(), None, None, quant_source=source)
    int8, int16 = (q.Variant(s, ops) for s, ops in (
        ("integer_quant", (q.BUILTINS,)), ("integer_quant_with_int16_act", (q.INT16_OPS,))))
    converted = SimpleNamespace(result=SimpleNamespace(content=b"float"))
    assert plan.source_for(int8, converted, None) is converted  # the INT8 files' source
    assert plan.source_of(int16, converted, None) is source  # not read back yet
    assert source.result.content == b""
    assert plan.source_for(int16, converted, None) is source
    assert source.result.content == content and source.result.spilled is None
    calibrated = {(id(converted), False): b"int8", ("biases", id(converted)): {},
                  (id(source), True): b"int16", ("biases", id(source)): {}}
    q._release(calibrated, [int16], [source])
    assert set(calibrated) == {(id(source), True), ("biases", id(source))}
    q._release(calibrated, [], [])
    assert not calibrated
