"""The accuracy checker (-coto / -cotof) and the per-node reports of failed conversions."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import helper

import onnx2tf_alt
from onnx2tf_alt.check.compare import FAIL, PASS, UNOBSERVED, compare
from onnx2tf_alt.check.inputs import make_inputs
from onnx2tf_alt.check.observe import Target, ort_values, targets, tf_values
from onnx2tf_alt.check.repro import write_failure_reports
from onnx2tf_alt.check.run import check_converted
from onnx2tf_alt.errors import ConversionError, InputError
from onnx2tf_alt.ir.graph import graph_from_model
from onnx2tf_alt.pipeline import build
from onnx2tf_alt.translate import registry

from harness import make_model, ort_run
from models import custom_op_model, tiny_cnn


def start_cli(*args) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        [sys.executable, "-m", "onnx2tf_alt", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def finish_cli(proc: subprocess.Popen) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def run_cli(*args):
    return finish_cli(start_cli(*args))


def residual_block(size: int = 8, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """conv1 -> relu1 -> conv2 -> add(conv2, relu1) -> relu2 -> conv3; H = W = C when
    size == channels, so a value laid out in the wrong order keeps its shape."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.2,
        "w3": rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3"),
    ]
    x = np.zeros((1, 3, size, size), np.float32)
    return make_model(nodes, {"x": x}, ["y"], inits)


@pytest.fixture
def faulty(monkeypatch):
    """faulty(op_type, node_name, change): the handlers of op_type apply `change` to the
    output of node `node_name`; the registry is restored afterwards."""
    handlers = registry.all_handlers()

    def patch(op_type: str, node_name: str, change):
        def wrap(h):
            def fn(ctx):
                out = h.fn(ctx)
                return change(out) if ctx.node.name == node_name else out

            return dataclasses.replace(h, fn=fn)

        key = ("", op_type)
        monkeypatch.setitem(registry._REGISTRY, key, [wrap(h) for h in handlers[key]])

    return patch


def _assert_diverges_at(backend, node_name: str):
    first = backend.first_divergence
    assert first is not None and first.node_name == node_name, [
        (c.node_name, c.status) for c in backend.checks
    ]
    before = backend.checks[: backend.checks.index(first)]
    assert before and all(c.status == PASS for c in before), before


def test_faulty_conv_is_the_first_divergence(faulty):
    faulty("Conv", "conv2", lambda out: out + 1e-2)
    report = check_converted(build(onnx_graph=residual_block()), full=True)
    assert not report.passed
    for backend in ("tf", "tflite"):
        _assert_diverges_at(report.backends[backend], "conv2")
    assert abs(report.backends["tf"].first_divergence.max_abs_err - 1e-2) < 1e-4


def test_op_that_raises_at_run_time_is_named_and_earlier_values_checked(faulty):
    """A Keras run that raises (here a gather out of range inside "add", as an empty
    tensor once made Faster R-CNN's ScatterElements raise) is located by bisection: the
    values before it are compared, it fails with TF's error, the later ones are unobserved."""
    def raising(out):
        index = tf.cast(tf.reduce_max(out) * 0.0, tf.int32) + 5
        return out + tf.gather(tf.zeros([1]), index)

    faulty("Add", "add", raising)
    report = check_converted(build(onnx_graph=residual_block()), full=True, tflite=False)
    checks = report.backends["tf"].checks
    names = [c.node_name for c in checks]
    failed = checks[names.index("add")]
    assert failed.status == FAIL and failed.note.startswith("TF raised:"), failed
    assert "indices" in failed.note, failed.note
    assert all(c.status == PASS for c in checks[:names.index("add")])
    after = checks[names.index("add") + 1:]
    assert after and all(c.status == UNOBSERVED and "earlier op raised" in c.note
                         for c in after), after
    assert report.backends["tf"].first_divergence is failed


def test_wrong_layout_caught_when_h_w_c_are_equal(faulty):
    # relu1 hands back NCHW data while its perm says NHWC: the shape (1, 8, 8, 8) is the
    # same either way, and some permutation of it matches ONNX exactly.
    faulty("Relu", "relu1", lambda out: tf.transpose(out, [0, 3, 1, 2]))
    converted = build(onnx_graph=residual_block(size=8, channels=8))
    assert converted.plan.perms["r1"] == (0, 2, 3, 1)
    report = check_converted(converted, full=True, tflite=False)
    _assert_diverges_at(report.backends["tf"], "relu1")

    feeds, _ = make_inputs(converted.graph)
    found = [t for t in targets(converted, full=True) if t.onnx_name == "r1"]
    got = tf_values(converted, found, feeds)["r1"]
    ref = ort_values(converted.model, feeds, ["r1"])["r1"]
    assert got.shape == ref.shape
    assert any(
        np.allclose(np.transpose(got, p), ref, atol=1e-5) for p in itertools.permutations(range(4))
    ), "a permutation-guessing checker would have accepted this value"


def two_custom_ops_model():
    """Two unsupported com.example nodes whose inputs onnxruntime can compute."""
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("FancyOp", ["a"], ["b"], domain="com.example", name="fancy/1"),
        helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
        helper.make_node("OtherOp", ["s", "w"], ["t"], domain="com.example", name="other_2"),
        helper.make_node("Add", ["b", "t"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "custom",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    return helper.make_model(graph, opset_imports=opsets), w


def test_custom_ops_reports_through_cli(tmp_path):
    model, w = two_custom_ops_model()
    path, out = tmp_path / "custom.onnx", tmp_path / "out"
    onnx.save(model, path)
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, output = run_cli("-i", path, "-o", out, "-cind", "x", tmp_path / "x.npy", "-n")
    assert code == 1, output
    assert "fancy/1" in output and "other_2" in output and "Traceback" not in output, output
    reports = out / "reports" / "custom"
    assert str(reports) in output, output
    assert sorted(os.listdir(out)) == ["reports"]
    listed = json.loads((reports / "conversion_errors.json").read_text())["failures"]
    assert [f["node_name"] for f in listed] == ["fancy/1", "other_2"]

    # expected inputs: onnxruntime on the part of the graph before the custom nodes
    part = make_model([n for n in model.graph.node if n.domain == ""][:2], {"x": x}, ["a", "s"])
    a, s = ort_run(part, {"x": x})
    for entry, name, expected in ((listed[0], "a", a), (listed[1], "s", s)):
        repro = onnx.load(reports / entry["repro_model"])
        onnx.checker.check_model(repro)
        assert [n.op_type for n in repro.graph.node] == [entry["op_type"]]
        assert {o.domain: o.version for o in repro.opset_import}["com.example"] == 1
        arrays = np.load(reports / entry["inputs_npz"])
        assert list(arrays.keys()) == [name] == [i.name for i in repro.graph.input]
        np.testing.assert_array_equal(arrays[name], expected)
    other = onnx.load(reports / listed[1]["repro_model"])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(other.graph.initializer[0]), w)


def test_chained_custom_op_says_why_inputs_are_missing(tmp_path):
    model, _ = custom_op_model()  # other_2 reads the output of fancy_1
    with pytest.raises(ConversionError) as info:
        build(onnx_graph=model)
    summary = write_failure_reports(info.value.prepared_model, info.value.failures, tmp_path)
    fancy, other = summary["failures"]
    assert fancy["inputs_npz"] and not other["inputs_npz"]
    assert "onnxruntime cannot compute" in other["inputs_note"]
    for entry in (fancy, other):
        onnx.checker.check_model(onnx.load(tmp_path / entry["repro_model"]))


def test_failure_report_lists_failures_even_without_repros(tmp_path, monkeypatch):
    from onnx2tf_alt.check import repro

    def no_repro(*args):
        raise RuntimeError("disk full")

    model, _ = custom_op_model()
    with pytest.raises(ConversionError) as info:
        build(onnx_graph=model)
    monkeypatch.setattr(repro, "repro_model", no_repro)
    write_failure_reports(info.value.prepared_model, info.value.failures, tmp_path)
    summary = json.loads((tmp_path / "conversion_errors.json").read_text())
    assert [e["node_name"] for e in summary["failures"]] == ["fancy_1", "other_2"]
    assert all("disk full" in e["repro_note"] for e in summary["failures"])
    assert sorted(os.listdir(tmp_path)) == ["conversion_errors.json"]


def test_handler_failure_report_uses_the_whole_model(faulty, tmp_path):
    def broken(out):
        raise NotImplementedError("deliberately broken")

    faulty("Conv", "conv2", broken)
    with pytest.raises(ConversionError) as info:
        build(onnx_graph=residual_block())
    assert [f.node_name for f in info.value.failures] == ["conv2"]
    summary = write_failure_reports(info.value.prepared_model, info.value.failures, tmp_path)
    (entry,) = summary["failures"]
    assert "deliberately broken" in entry["reason"]
    repro = onnx.load(tmp_path / entry["repro_model"])
    onnx.checker.check_model(repro)
    assert [i.name for i in repro.graph.input] == ["r1"]  # w2 is an initializer there
    feeds, _ = make_inputs(graph_from_model(info.value.prepared_model))
    expected = ort_values(info.value.prepared_model, feeds, ["r1"])["r1"]
    np.testing.assert_array_equal(np.load(tmp_path / entry["inputs_npz"])["r1"], expected)


def test_constant_values_are_unobserved_in_tflite(faulty):
    # a handler that knows its output at conversion time leaves no TFLite tensor for it
    faulty("Relu", "relu_c", lambda out: np.zeros((2, 3), np.float32))
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_c"),
             helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    x = -np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32)
    converted = build(onnx_graph=make_model(nodes, {"x": x}, ["y"]))
    report = check_converted(converted, full=True, custom_inputs={"x": x})
    assert report.inputs["x"]["source"] == "file"
    assert [c.status for c in report.backends["tf"].checks] == [PASS, PASS]
    const, out = report.backends["tflite"].checks
    assert const.status == UNOBSERVED and "constant" in const.note
    assert out.status == PASS and report.passed


@pytest.fixture(scope="module")
def cnn_cli_runs(tmp_path_factory):
    """tiny_cnn converted by the CLI with -coto (the .tflite files only: no Keras model) and
    with -cotof -osm (the Keras model checked too), -cotoa 1e-4, in parallel."""
    root = tmp_path_factory.mktemp("cnn")
    path = root / "cnn.onnx"
    onnx.save(tiny_cnn()[0], path)
    outs = {flag: root / flag.strip("-") for flag in ("-coto", "-cotof")}
    procs = {f: start_cli("-i", path, "-o", out, f, "-cotoa", "1e-4",
                          *(["-osm"] if f == "-cotof" else [])) for f, out in outs.items()}
    return path, {flag: (outs[flag], *finish_cli(proc)) for flag, proc in procs.items()}


@pytest.mark.parametrize("flag, count, backends", [("-coto", 1, ["tflite"]),
                                                   ("-cotof", 7, ["tf", "tflite"])])
def test_cli_check_writes_reports(cnn_cli_runs, flag, count, backends):
    _, runs = cnn_cli_runs
    out, code, output = runs[flag]
    assert code == 0, output
    assert "PASSED" in output, output
    report = json.loads((out / "cnn_accuracy_report.json").read_text())
    assert report["passed"] and report["atol"] == 1e-4
    assert list(report["backends"]) == backends
    for backend in backends:
        values = report["backends"][backend]["values"]
        assert len(values) == count and all(v["status"] == PASS for v in values), values
    page = (out / "cnn_accuracy_report.html").read_text()
    assert "<svg" in page and "Gemm" in page and "PASSED" in page


def test_python_check_uses_converted_layout(cnn_cli_runs):
    path, runs = cnn_cli_runs
    report = onnx2tf_alt.check(str(path), str(runs["-coto"][0]), full=False)
    assert report.passed and list(report.backends) == ["tf", "tflite"]
    with pytest.raises(InputError, match="differ"):
        onnx2tf_alt.check(str(path), str(runs["-coto"][0]), full=False, tflite=False,
                          keep_ncw_or_nchw_or_ncdhw_input_names=["input"])


def test_python_check_of_every_value_reads_the_direct_writers_probe(cnn_cli_runs, monkeypatch):
    """onnx2tf_alt.check(full=True) on a CLI conversion: the float32 TFLite values come from
    the direct writer's probe of the rebuilt plan (check/file_values.py), as the CLI wrote
    the files; TF's TFLite converter is not called."""
    import tensorflow as tf

    class Refused:
        def __getattr__(self, name):
            raise AssertionError(f"TF's TFLite converter used ({name})")

    monkeypatch.setattr(tf.lite, "TFLiteConverter", Refused())
    path, runs = cnn_cli_runs
    report = onnx2tf_alt.check(str(path), str(runs["-cotof"][0]), full=True)
    checks = report.backends["tflite"].checks
    assert len(checks) == 7 and all(c.status == PASS for c in checks), checks
    assert report.passed


def test_tflite_all_values_pass_on_small_cnn():
    converted = build(onnx_graph=tiny_cnn()[0])
    report = check_converted(converted, full=True)
    backend = report.backends["tflite"]
    assert [c.node_name for c in backend.checks] == [n.name for n in converted.graph.nodes]
    assert backend.passed and all(c.status == PASS for c in backend.checks)


def test_convert_attaches_report(tmp_path):
    model = onnx2tf_alt.convert(
        onnx_graph=residual_block(), output_folder_path=str(tmp_path), output_tflite=False,
        check_onnx_tf_outputs_elementwise_close_full=True, non_verbose=True,
    )
    report = model.onnx2tf_alt_report
    assert report.passed and list(report.backends) == ["tf"]
    assert (tmp_path / "model_accuracy_report.json").exists()


# --- comparison rules and test inputs (no TensorFlow) ---------------------------------------
T = Target("v", "n", "Op", (0,))


def test_compare_rules():
    ref = np.array([1.0, -2.0, 0.0], np.float32)
    assert compare(T, ref, ref + 5e-5, 1e-4, 0.0).status == PASS
    assert compare(T, ref, ref + 2e-4, 1e-4, 0.0).status == FAIL
    assert compare(T, ref, ref * 1.01, 0.0, 0.02).status == PASS  # |a-b| <= rtol * |ref|
    mismatch = compare(T, ref, ref[:2], 1.0, 1.0)
    assert mismatch.status == FAIL and "shape" in mismatch.note
    ints = np.array([1, 2, 3], np.int64)
    assert compare(T, ints, ints.astype(np.int32), 10.0, 0.0).status == PASS
    assert compare(T, ints, ints + 1, 10.0, 1.0).status == FAIL  # exact, tolerances ignored
    nan = np.array([np.nan, np.inf], np.float32)
    assert compare(T, nan, nan.copy(), 0.0, 0.0).status == PASS
    assert compare(T, nan, np.array([0.0, np.inf], np.float32), 1.0, 0.0).status == FAIL
    assert compare(T, ref, None, 0.0, 0.0, "gone").status == UNOBSERVED


def test_random_indices_stay_in_range():
    data = np.zeros((5, 3), np.float32)
    nodes = [helper.make_node("Cast", ["idx"], ["i64"], to=onnx.TensorProto.INT64),
             helper.make_node("Gather", ["data", "i64"], ["y"], axis=0)]
    model = make_model(nodes, {"idx": np.zeros((64,), np.int32)}, ["y"], {"data": data})
    feeds, sources = make_inputs(graph_from_model(model), seed=1)
    assert sources == {"idx": "random"} and feeds["idx"].dtype == np.int32
    assert feeds["idx"].min() >= 0 and feeds["idx"].max() < 5
    with pytest.raises(InputError, match="shape"):
        make_inputs(graph_from_model(model), {"idx": np.zeros((3, 3), np.int32)})


def _unknown_sizes_model(channels: int) -> onnx.ModelProto:
    """A 3x3 convolution without padding of an input [1, channels, ?, ?]."""
    w = np.random.default_rng(0).standard_normal((4, channels, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, channels, "h", "w"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, None, None])],
        [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_input_of_unknown_sizes_fed_too_small_names_ois(tmp_path):
    """An input [1, 2, ?, ?] (not an image: 2 channels): the check's random input of 1 x 1
    is too small for a 3x3 convolution without padding, so onnxruntime cannot run it; the
    report says why and what to pass."""
    converted = onnx2tf_alt.pipeline.build(onnx_graph=_unknown_sizes_model(2))
    report = check_converted(converted, full=False, tflite=False)
    assert report.error.startswith("onnxruntime cannot run the model"), report.error
    assert "input(s) ['x'] have unknown dims, fed as size 1" in report.error
    assert "-ois" in report.error


def test_an_image_of_unknown_height_and_width_is_checked_at_224():
    """An image input [1, 3, ?, ?] (as tf2onnx and dynamic_axes exports write them): the
    check feeds 224 x 224 (check/inputs.test_dims) and runs, where 1 x 1 could not."""
    converted = onnx2tf_alt.pipeline.build(onnx_graph=_unknown_sizes_model(3))
    report = check_converted(converted, full=False, tflite=False)
    assert not report.error and report.inputs["x"]["shape"] == [1, 3, 224, 224], report
    assert report.passed, report
