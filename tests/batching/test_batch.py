"""`onnx2tf-alt batch` / `onnx2tf_alt.batch`: many models, each converted by the real CLI in
a child process of its own, with caps, resume, results, summaries and a baseline.

Every child imports TensorFlow (several seconds), so the batches here are few and small:
one folder batch shared by the resume / force / baseline tests, one manifest batch with
per-model flags and expected failures, and (when Ray is installed) one Ray batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2tf_alt
from onnx2tf_alt.batching import Thresholds
from onnx2tf_alt.batching.baseline import regressions
from onnx2tf_alt.batching.cli import split_arguments
from onnx2tf_alt.batching.source import load_jobs
from onnx2tf_alt.cli.main import main as cli_main

OPSET = 17


def _model(nodes, inputs, outputs, initializers=None, extra_opsets=None) -> onnx.ModelProto:
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()]
    inits = [numpy_helper.from_array(a.astype(np.float32), n)
             for n, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", info, outs, inits)
    opsets = [helper.make_opsetid("", OPSET)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def relu_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2, 3, 5, 4]},
                  {"y": [2, 3, 5, 4]})


def add_model() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["a", "b"], ["y"])], {"a": [1, 6], "b": [3, 1]},
                  {"y": [3, 6]})


def conv_model() -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]}, {"w": w})


def unsupported_model() -> onnx.ModelProto:
    """Valid ONNX with an op no handler converts (a custom domain nobody registers)."""
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example.batchtest")
    return _model([node], {"x": [1, 4]}, {"y": [1, 4]},
                  extra_opsets={"com.example.batchtest": 1})


def _save(model: onnx.ModelProto, path) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, str(path))
    return str(path)


def _by_name(report) -> dict[str, dict]:
    return {r["name"]: r for r in report.results}


def _lines(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A folder of four models converted once by a folder batch."""
    root = tmp_path_factory.mktemp("zoo")
    models = root / "models"
    _save(relu_model(), models / "relu.onnx")
    _save(conv_model(), models / "conv.onnx")
    _save(add_model(), models / "add.onnx")
    _save(unsupported_model(), models / "bad.onnx")
    out = root / "out"
    report = onnx2tf_alt.batch(str(models), str(out), jobs=2)
    return models, out, report


def test_folder_batch_outcomes_and_results(zoo):
    models, out, report = zoo
    records = _by_name(report)
    assert sorted(records) == ["add", "bad", "conv", "relu"]
    for name in ("add", "conv", "relu"):
        r = records[name]
        assert (r["outcome"], r["exit_code"], r["resumed"]) == ("ok", 0, False), r
        assert os.path.isfile(out / name / f"{name}_float32.tflite")
        # numpy, onnx and LiteRT's interpreter alone take tens of MB (no TensorFlow: the
        # float32 file is the direct writer's); it was > 100, true only where the child's
        # figure starts from a large parent's (a whole test run's)
        assert r["wall_s"] > 0 and r["peak_rss_mb"] > 30
        assert r["sizes"][f"{name}_float32.tflite"] > 0
        assert "latency_ratio" not in r  # timed only with --check
    assert records["relu"]["tflite_ops"] == {"RELU": 1}
    assert records["add"]["tflite_ops"] == {"ADD": 1}
    # The conv's input and output are kept channel-last: no TRANSPOSE at all.
    assert records["conv"]["transposes"] == 0 and records["conv"]["tflite_ops"]["CONV_2D"] == 1
    bad = records["bad"]
    assert (bad["outcome"], bad["exit_code"]) == ("failed", 1)
    assert bad["error_kind"] == "unsupported op (com.example.batchtest::NoSuchOp)"
    assert "NoSuchOp" in bad["error"]
    assert report.exit_code == 1  # a failure nobody expected
    on_disk = {r["name"]: r for r in _lines(out / "batch_results.jsonl")}
    assert on_disk == records
    assert on_disk["relu"]["path"] == str(models / "relu.onnx")
    md = (out / "batch_summary.md").read_text()
    assert "failed 1" in md and "ok 3" in md and "| bad | failed | 1 |" in md
    page = (out / "batch_summary.html").read_text()
    assert page.count("<svg") == 2 and "<script>" in page and "<th>TRANSPOSE</th>" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched
    assert not [n for n in os.listdir(out) if n.startswith(".onnx2tf_alt_")]


def test_changed_input_and_force_reconvert(zoo, tmp_path):
    models, zoo_out, _ = zoo
    out = tmp_path / "out"
    shutil.copytree(zoo_out, out)  # a moved output folder still counts as converted
    source = tmp_path / "models"
    shutil.copytree(models, source, ignore=shutil.ignore_patterns("bad.onnx"))
    _save(add_model(), source / "relu.onnx")  # same name, other content
    # The conv moved, but its content did not change: it is not converted again. (Beside
    # the models, the manifest names their folders as the folder batch did.)
    manifest = source / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"path": f"{n}.onnx"})
                                  for n in ("relu", "conv")) + "\n")
    records = _by_name(onnx2tf_alt.batch(str(manifest), str(out), jobs=2))
    assert not records["relu"]["resumed"] and records["relu"]["tflite_ops"] == {"ADD": 1}
    assert records["conv"]["resumed"]
    manifest.write_text(json.dumps({"path": "conv.onnx"}) + "\n")
    forced = _by_name(onnx2tf_alt.batch(str(manifest), str(out), force=True))
    assert not forced["conv"]["resumed"] and forced["conv"]["outcome"] == "ok"
    assert os.path.getmtime(out / "conv" / "conv_float32.tflite") > os.path.getmtime(
        zoo_out / "conv" / "conv_float32.tflite")


def test_manifest_flags_expectations_and_caps(tmp_path):
    models = tmp_path / "models"
    add, bad = _save(add_model(), models / "add.onnx"), _save(unsupported_model(),
                                                               models / "bad.onnx")
    relu = _save(relu_model(), models / "relu.onnx")
    entries = [
        {"path": "models/add.onnx", "flags": ["-okv3"]},
        {"path": bad, "expect": "failed"},
        # TensorFlow (the saved_model's) alone takes longer than 1 s to import, and more
        # than 150 MB.
        {"path": relu, "name": "relu_slow", "timeout": 1, "expect": "timeout", "flags": ["-osm"]},
        {"path": relu, "name": "relu_big", "memory_limit_mb": 150, "expect": "memory",
         "flags": ["-osm"]},
    ]
    manifest = tmp_path / "zoo.jsonl"
    manifest.write_text("# models of the release\n" + "\n".join(map(json.dumps, entries)))
    out = tmp_path / "out"
    report = onnx2tf_alt.batch(str(manifest), str(out), jobs=2, check=True)
    records = _by_name(report)
    r = records["models__add"]  # named after its path below the manifest's folder
    assert r["outcome"] == "ok" and "-okv3" in r["flags"] and "-coto" in r["flags"]
    assert os.path.isfile(out / "models__add" / "add.keras")
    assert r["check"]["passed"] and r["check"]["max_abs_err"] == 0.0
    # --check also times the float32 .tflite against onnxruntime (values vary: none asserted).
    assert isinstance(r["latency_ratio"], float) and r["latency_ratio"] > 0, r
    assert r["latency_ms"]["tflite"] > 0 and r["latency_ms"]["onnxruntime"] > 0
    assert f"| {r['latency_ratio']:.2f} |" in (out / "batch_summary.md").read_text()
    assert "TFLite/ORT" in (out / "batch_summary.html").read_text()
    assert (records["models__bad"]["outcome"], records["models__bad"]["actual"]) == (
        "expected-failure", "failed")
    slow, big = records["relu_slow"], records["relu_big"]
    assert (slow["actual"], slow["error_kind"]) == ("timeout", "timed out")
    assert 1 <= slow["wall_s"] < 10
    assert (big["actual"], big["error_kind"]) == ("memory", "over the memory cap")
    assert big["peak_rss_mb"] > 150
    assert report.exit_code == 0  # every outcome is the expected one
    # A stopped child leaves no staging folder, no temporary folder, no outputs.
    assert not [n for n in os.listdir(out) if n.startswith(".onnx2tf_alt_")]
    assert not os.path.exists(out / ".batch" / "tmp")
    assert not os.path.exists(out / "relu_slow" / "relu_manifest.json")
    assert add == str(models / "add.onnx")
    # Run again: the conversion is complete, the failures are the expected ones with the
    # same input, flags and caps; nothing runs.
    again = onnx2tf_alt.batch(str(manifest), str(out), jobs=2, check=True)
    assert all(r["resumed"] for r in again.results) and again.exit_code == 0
    assert [r["outcome"] for r in again.results] == [r["outcome"] for r in report.results]
    assert _by_name(again)["models__add"]["latency_ratio"] == r["latency_ratio"]  # that run's


def test_cli_rerun_resumes_and_baseline_regression_exits_1(zoo, tmp_path):
    models, out, first = zoo
    before = {n: os.path.getmtime(out / n / f"{n}_float32.tflite") for n in ("add", "conv", "relu")}
    previous = _lines(out / "batch_results.jsonl")
    for r in previous:  # inject a regression: the failing model used to convert
        if r["name"] == "bad":
            r.update(outcome="ok", actual="ok", exit_code=0, as_expected=True)
    baseline = tmp_path / "previous.jsonl"
    baseline.write_text("".join(json.dumps(r) + "\n" for r in previous))
    proc = subprocess.run(
        [sys.executable, "-m", "onnx2tf_alt", "batch", str(models), "-o", str(out),
         "--baseline", str(baseline), "--jobs", "2"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "regression: bad: was ok, now failed (unsupported op" in proc.stdout
    assert "3 of 4 models done before (resumed)" in proc.stderr
    assert "[4/4] failed 1" in proc.stderr  # the progress line
    assert "## Regressions" in (out / "batch_summary.md").read_text()
    records = {r["name"]: r for r in _lines(out / "batch_results.jsonl")}
    for name, mtime in before.items():
        assert records[name]["resumed"] and records[name]["outcome"] == "ok"
        assert os.path.getmtime(out / name / f"{name}_float32.tflite") == mtime
        # The record still describes the files and the run that made them.
        old = _by_name(first)[name]
        for key in ("wall_s", "peak_rss_mb", "tflite_ops", "sizes", "input_sha256"):
            assert records[name][key] == old[key]
    # A failure is never "complete": it is tried again.
    assert not records["bad"]["resumed"] and records["bad"]["outcome"] == "failed"


def test_baseline_regression_kinds():
    def rec(name, outcome="ok", wall=10.0, err=None, **extra):
        check = {"check": {"passed": outcome == "ok", "max_abs_err": err}} if err is not None \
            else {}
        return {"name": name, "outcome": outcome, "wall_s": wall, **check, **extra}

    old = [rec("a"), rec("b"), rec("c", err=1e-6), rec("d", "failed"), rec("e"),
           rec("f", wall=1.0)]
    new = [rec("a", "timeout"), rec("b", wall=16.0), rec("c", err=1e-3), rec("d", "failed"),
           rec("e", wall=14.0), rec("f", wall=2.5), rec("new", "failed")]
    found = {(r["name"], r["kind"]) for r in regressions(new, old, Thresholds())}
    # e: 1.4x; f: 2.5x but only 1.5 s longer; d was already failing; "new" has no baseline.
    assert found == {("a", "failing"), ("b", "slower"), ("c", "accuracy")}
    # A resumed record's wall time is the old run's: never a slowdown.
    assert regressions([rec("b", wall=16.0, resumed=True)], old, Thresholds()) == []

    def timed(name, ratio, tflite_ms):
        return rec(name, latency_ratio=ratio, latency_ms={"tflite": tflite_ms})

    old = [timed("g", 1.0, 2.0), timed("h", 1.0, 2.0), timed("i", 1.0, 0.01)]
    new = [timed("g", 1.3, 2.6), timed("h", 1.2, 2.4), timed("i", 3.0, 0.03)]
    found = regressions(new, old, Thresholds())
    # h: 1.2x; i: 3x but 0.02 ms longer (a tiny model's jitter).
    assert [(r["name"], r["kind"]) for r in found] == [("g", "latency")]
    assert found[0]["why"] == "TFLite/onnxruntime latency ratio 1.00 -> 1.30"
    looser = regressions(new, old, Thresholds(latency_ratio=1.1))
    assert [r["name"] for r in looser] == ["g", "h"]


def test_bad_usage_exits_2(tmp_path, capsys, monkeypatch):
    models = tmp_path / "models"
    _save(relu_model(), models / "relu.onnx")
    out = str(tmp_path / "out")
    assert cli_main(["batch", str(models)]) == 2  # no -o
    assert cli_main(["batch", str(tmp_path / "nothing"), "-o", out]) == 2
    assert "neither a folder nor a manifest" in capsys.readouterr().err
    assert cli_main(["batch", str(models), "-o", out, "--no_such_flag"]) == 2
    assert "unrecognized arguments: --no_such_flag" in capsys.readouterr().err
    assert cli_main(["batch", str(models), "-o", out, "-i", "x.onnx"]) == 2
    assert "may not set -i or -o" in capsys.readouterr().err
    bad_manifest = tmp_path / "m.jsonl"
    bad_manifest.write_text('{"path": "models/relu.onnx", "expect": "sometimes"}\n')
    assert cli_main(["batch", str(bad_manifest), "-o", out]) == 2
    assert "m.jsonl:1" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert cli_main(["batch", str(models), "-o", out, "--ray", "auto"]) == 2
    assert "pip install onnx2tf_alt[ray]" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(out, "relu"))  # nothing was converted


def test_arguments_split_between_batch_and_conversion():
    mine, theirs = split_arguments(
        ["zoo", "-o", "out", "-ois", "x:1,3,8,8", "--jobs=2", "-oh5", "--force", "-k", "x",
         "--timeout", "30", "--latency_ratio", "1.5"])
    assert mine == ["zoo", "-o", "out", "--jobs=2", "--force", "--timeout", "30",
                    "--latency_ratio", "1.5"]
    assert theirs == ["-ois", "x:1,3,8,8", "-oh5", "-k", "x"]


def test_colliding_stems_get_unique_names(tmp_path):
    # Each name comes from the model's path below the source (see test_batch_names.py).
    for sub in ("a", "b/c", ""):
        _save(relu_model(), tmp_path / sub / "m.onnx")
    _save(relu_model(), tmp_path / "b" / "other.onnx")
    names = sorted(j.name for j in load_jobs(str(tmp_path)))
    assert names == ["a__m", "b__c__m", "b__other", "m"]


def _tasks_whose_worker_dies(monkeypatch, marker) -> dict[str, dict]:
    from onnx2tf_alt.batching import ray_backend
    from onnx2tf_alt.batching.worker import Task

    def dying_task(task: dict) -> dict:  # runs in a Ray worker process
        if task["name"] == "dies_always" or not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return {"name": task["name"], "exit_code": 0, "stopped_for": None, "wall_s": 0.0,
                "peak_rss_mb": 0.0}

    monkeypatch.setattr(ray_backend, "run_task", dying_task)
    got: list[dict] = []
    ray_backend.run_on_ray([Task("dies_once", [], "", ""), Task("dies_always", [], "", "")],
                           "local", got.append, jobs=1)
    return {r["name"]: r for r in got}


def test_ray_backend_same_outcomes(zoo, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install "
                              "onnx2tf_alt[ray]); the Ray backend is not tested")
    models, _, local = zoo
    source = tmp_path / "models"
    for name in ("relu", "add", "bad"):
        _save(onnx.load(str(models / f"{name}.onnx")), source / f"{name}.onnx")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report = onnx2tf_alt.batch(str(source), str(tmp_path / "out"), ray="local")
        lost = _tasks_whose_worker_dies(monkeypatch, tmp_path / "died_once")
    finally:
        ray.shutdown()
    # A task whose worker dies once is retried; one that dies twice is recorded as lost.
    assert lost["dies_once"]["exit_code"] == 0 and "lost" not in lost["dies_once"]
    assert lost["dies_always"]["lost"] == "Ray worker died twice (WorkerCrashedError)"
    before = _by_name(local)
    for name, r in _by_name(report).items():
        assert (r["outcome"], r["exit_code"], r.get("tflite_ops")) == (
            before[name]["outcome"], before[name]["exit_code"], before[name].get("tflite_ops"))
    assert _lines(tmp_path / "out" / "batch_results.jsonl") == report.results


def test_a_native_crash_the_supervisor_reported_is_recorded_as_crashed(tmp_path):
    """The CLI turns a native crash into exit 1 and reports/<stem>/conversion_errors.json
    with a "crash" entry (cli/supervisor.py); the batch record says crashed, and where."""
    from onnx2tf_alt.batching.record import make_record
    from onnx2tf_alt.batching.source import Job

    folder = tmp_path / "m"
    (folder / "reports" / "m").mkdir(parents=True)
    (folder / "reports" / "m" / "conversion_errors.json").write_text(json.dumps(
        {"failures": [], "crash": {"signal": "SIGSEGV", "phase": "quantized files"}}))
    log = tmp_path / "m.log"
    log.write_text("error: the conversion crashed in native code (SIGSEGV)\n")
    child = {"exit_code": 1, "wall_s": 1.0, "peak_rss_mb": 10.0, "stopped_for": None}
    record = make_record(Job(str(tmp_path / "m.onnx"), "m"), child, str(folder), str(log), {})
    assert record["outcome"] == "crashed"
    assert record["error_kind"] == "crashed in native code (SIGSEGV) during 'quantized files'"
