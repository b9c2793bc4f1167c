"""The user's files: the converter replaces only what its manifests list, never writes over
its input, publishes all outputs at once, and ends every bad case with exit 2 and a message.

Each case runs the real CLI and checks the exit code, the message, every file of the output
folder (sha256 before and after), the input's sha256, and leftovers in the parent folder
and in the run's own TMPDIR.
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
from onnx import external_data_helper, helper

from cli_runner import cli_env, leftovers, manifest_files, run_cli, tree
from harness import make_model
from models import tiny_cnn

STEM = "cnn"
TFLITE_FILES = {f"{STEM}_float32.tflite", f"{STEM}_float16.tflite", f"{STEM}_io_layout.json",
                f"{STEM}_manifest.json", f"{STEM}_delegates.json"}  # the default flags'
MODEL_FILES = TFLITE_FILES | {"saved_model.pb", "fingerprint.pb", "variables/variables.index",
                              "variables/variables.data-00000-of-00001"}  # with -osm


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return tiny_cnn()[0].SerializeToString()


@pytest.fixture
def work(tmp_path, model_bytes):
    """A project folder with the model, a temp folder of its own, and a runner that checks
    what every run must: no traceback, no leftovers, the input unchanged."""
    (tmp_path / "tmp").mkdir()
    source = tmp_path / f"{STEM}.onnx"
    source.write_bytes(model_bytes)

    def run(*args, input_path=source, expect: int, phrases=()):
        before = input_path.read_bytes() if input_path.exists() else None
        code, output = run_cli(*args, cwd=tmp_path, tmpdir=tmp_path / "tmp")
        assert code == expect, output
        assert "Traceback" not in output, output
        for phrase in phrases:
            assert phrase in output, output
        if before is not None:
            assert input_path.read_bytes() == before, "the input was modified"
        assert leftovers(tmp_path, tmp_path / "tmp", *[p for p in tmp_path.iterdir()
                                                        if p.is_dir()]) == []
        assert os.listdir(tmp_path / "tmp") == [], "temporary files were left behind"
        return output

    run.root, run.source = tmp_path, source
    return run


def test_stale_files_of_the_previous_conversion_are_replaced_foreign_ones_kept(work):
    out = work.root / "out"
    work("-i", work.source, "-o", out, "-osm", "-oh5", "-okv3", expect=0)
    assert set(tree(out)) == MODEL_FILES | {f"{STEM}.h5", f"{STEM}.keras"}
    (out / "notes.txt").write_text("mine")
    work("-i", work.source, "-o", out, expect=0)  # its saved_model and Keras files go
    assert set(tree(out)) == TFLITE_FILES | {"notes.txt"}
    assert set(tree(out)) - {"notes.txt"} == manifest_files(out, STEM)
    manifest = json.loads((out / f"{STEM}_manifest.json").read_text())
    assert manifest["source"]["sha256"] == tree(work.root)[f"{STEM}.onnx"]
    assert manifest["command"][-2:] == ["-o", str(out)]
    assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())


def test_a_different_model_into_the_same_folder_keeps_the_first_models_files(work):
    out = work.root / "out"
    other = work.root / "other.onnx"
    other.write_bytes(work.source.read_bytes())
    work("-i", work.source, "-o", out, "-osm", "-oh5", expect=0)
    first = tree(out)
    # both would write a saved_model: refused before converting, with the ways out
    work("-i", other, "-o", out, "-osm", input_path=other, expect=2,
         phrases=["already holds the saved_model of another model's conversion",
                  f"{STEM}_manifest.json", "leave out -osm"])
    assert tree(out) == first
    work("-i", other, "-o", out, input_path=other, expect=0)
    after = tree(out)
    assert {k: v for k, v in after.items() if k in first} == first
    assert set(after) - set(first) == manifest_files(out, "other")
    # converting the first model again replaces its own files only (its .h5 goes)
    work("-i", work.source, "-o", out, expect=0)
    assert f"{STEM}.h5" not in tree(out)
    assert {k: v for k, v in tree(out).items() if k.startswith("other_")} == {
        k: v for k, v in after.items() if k.startswith("other_")}


@pytest.mark.parametrize("foreign", ["saved_model.pb", "variables/variables.index",
                                     "variables/mine.txt", "assets/labels.txt",
                                     f"{STEM}_float32.tflite"])
def test_refuses_to_write_over_a_file_it_did_not_write(work, foreign):
    out = work.root / "out"
    (out / foreign).parent.mkdir(parents=True, exist_ok=True)
    (out / foreign).write_text("user data")
    before = tree(out)
    work("-i", work.source, "-o", out, "-osm", expect=2,
         phrases=[str(out / foreign), "was not written by onnx2tf_alt", "another -o"])
    assert tree(out) == before


def test_a_file_the_user_changed_after_conversion_is_theirs(work):
    out = work.root / "out"
    work("-i", work.source, "-o", out, expect=0)
    (out / f"{STEM}_io_layout.json").write_text("edited by hand")
    before = tree(out)
    work("-i", work.source, "-o", out, expect=2, phrases=[f"{STEM}_io_layout.json"])
    assert tree(out) == before


@pytest.mark.parametrize("where", ["assets/cnn.onnx", "variables/cnn.onnx", "saved_model.pb",
                                   "fingerprint.pb"])
def test_the_input_is_never_an_output(work, where):
    out = work.root / "proj"
    placed = out / where
    placed.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(work.source, placed)
    (out / "labels.txt").write_text("user data")
    before = tree(out)
    work("-i", placed, "-o", out, "-osm", input_path=placed, expect=2,
         phrases=["lies at or inside an output path", "another -o"])
    assert tree(out) == before


def test_input_beside_the_outputs_is_fine(work):
    out = work.root
    work("-i", work.source, "-o", out, "-osm", expect=0)
    assert MODEL_FILES <= set(tree(out))


def test_the_input_inside_a_previous_failure_report_is_protected(work):
    out = work.root / "out"
    bad = work.root / "fancy.onnx"  # its failing node is also called 'fancy'
    onnx.save(_custom_op_model(), bad)
    work("-i", bad, "-o", out, input_path=bad, expect=1, phrases=["FancyOp"])
    repro = out / "reports" / "fancy" / "fancy.onnx"
    assert repro.is_file() and (out / "reports" / "fancy" / "conversion_errors.json").is_file()
    # the repro is a model named 'fancy': its run would replace the report it lies in
    work("-i", repro, "-o", out, input_path=repro, expect=2,
         phrases=["lies at or inside an output path"])


def test_failure_reports_are_per_model_and_go_with_its_success(work):
    out = work.root / "out"
    bad = work.root / "cnn_bad.onnx"
    onnx.save(_custom_op_model(), bad)
    work("-i", work.source, "-o", out, expect=0)
    model = tree(out)
    work("-i", bad, "-o", out, "-dms", input_path=bad, expect=1)
    assert {k: v for k, v in tree(out).items() if not k.startswith("reports/")} == model
    assert {"reports/cnn_bad/conversion_errors.json", "reports/cnn_bad/manifest.json"} <= set(
        tree(out))
    other = work.root / "other_bad.onnx"
    onnx.save(_custom_op_model(), other)
    work("-i", other, "-o", out, "-dms", input_path=other, expect=1)
    reports = {k for k in tree(out) if k.startswith("reports/")}
    assert {"reports/cnn_bad/manifest.json", "reports/other_bad/manifest.json"} <= reports
    # a success of another model leaves this one's report; its own success removes it
    work("-i", work.source, "-o", out, expect=0)
    assert {k for k in tree(out) if k.startswith("reports/")} == reports
    onnx.save(onnx.load(work.source), bad)
    work("-i", bad, "-o", out, "-dms", input_path=bad, expect=0)
    assert not (out / "reports" / "cnn_bad").exists()
    assert (out / "reports" / "other_bad" / "manifest.json").is_file()


def test_output_path_is_a_file(work):
    target = work.root / "taken.txt"
    target.write_text("user data")
    work("-i", work.source, "-o", target, expect=2, phrases=["is an existing file"])
    assert target.read_text() == "user data"


def test_output_on_a_pseudo_file_system(work):
    work("-i", work.source, "-o", "/proc/onnx2tf_alt_out", expect=2,
         phrases=["pseudo file system"])


def test_output_folder_not_writable(tmp_path, monkeypatch):
    from onnx2tf_alt.errors import InputError
    from onnx2tf_alt.export.publish import OutputFolder

    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # root may write anywhere
    with pytest.raises(InputError, match="cannot be written"):
        OutputFolder(tmp_path / "out", "m").check_usable()


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_batch_below_one(work, batch):
    work("-i", work.source, "-o", work.root / "out", "-b", batch, expect=2,
         phrases=["at least 1"])
    assert not (work.root / "out").exists()


def test_opset_newer_than_onnx_knows(work):
    model = tiny_cnn()[0]
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    newer = work.root / "newer.onnx"
    onnx.save(model, newer)
    work("-i", newer, "-o", work.root / "out", input_path=newer, expect=2,
         phrases=["newer than the installed onnx", "--allow_newer_opset"])
    assert not (work.root / "out").exists()
    work("-i", newer, "-o", work.root / "out", "--allow_newer_opset", input_path=newer,
         expect=0)


def test_missing_external_data(work):
    model = tiny_cnn()[0]
    path = work.root / "ext.onnx"
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="ext.data", size_threshold=0)
    onnx.save(model, path)
    (work.root / "ext.data").unlink()
    work("-i", path, "-o", work.root / "out", input_path=path, expect=2,
         phrases=["ext.data", "missing or unreadable"])


def test_external_data_is_protected_too(work):
    model = tiny_cnn()[0]
    out = work.root / "out"
    out.mkdir()
    path = out / "ext.onnx"
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="saved_model.pb", size_threshold=0)
    onnx.save(model, path)
    work("-i", path, "-o", out, "-osm", input_path=path, expect=2,
         phrases=["saved_model.pb", "lies at or inside an output path"])


def test_inconsistent_conv_is_an_invalid_model(work):
    w = onnx.numpy_helper.from_array(np.zeros((4, 5, 3, 3), np.float32), "w")
    path = _write(work, "badconv", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
                  [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], [w])
    output = work("-i", path, "-o", work.root / "out", input_path=path, expect=2,
                  phrases=["model is invalid", "conv1", "[1, 3, 8, 8]", "[4, 5, 3, 3]"])
    assert "Call arguments" not in output and "TFOpLambda" not in output
    assert not (work.root / "out").exists()


def _write(work, name: str, nodes, inputs, outputs, initializers=()) -> os.PathLike:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, 1, s)
                                            for n, s in inputs],
                              [helper.make_tensor_value_info(n, 1, s) for n, s in outputs],
                              list(initializers))
    path = work.root / f"{name}.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_shapes_that_contradict_each_other_are_an_invalid_model(work):
    path = _write(work, "badadd", [helper.make_node("Add", ["a", "b"], ["y"], name="add1")],
                  [("a", [2, 3]), ("b", [4, 5])], [("y", [2, 3])])
    work("-i", path, "-o", work.root / "out", input_path=path, expect=2,
         phrases=["model is invalid", "add1", "Incompatible dimensions"])
    assert not (work.root / "out").exists()


def test_a_reshape_that_cannot_hold_its_input_is_an_invalid_model(work):
    shape = onnx.numpy_helper.from_array(np.array([7, 7], np.int64), "s")
    path = _write(work, "badreshape", [helper.make_node("Reshape", ["x", "s"], ["y"],
                                                        name="rs")],
                  [("x", [2, 3, 8, 8])], [("y", [7, 7])], [shape])
    work("-i", path, "-o", work.root / "out", input_path=path, expect=2,
         phrases=["model is invalid", "'rs'", "[2, 3, 8, 8], 384 elements", "[7, 7]"])
    assert not (work.root / "out").exists()


@pytest.mark.parametrize("dims, fits", [([0, -1, 16], True), ([-1, 5], False),
                                         ([2, -1, -1], False), ([0, 0, 0, 0], True)])
def test_reshape_checks_zero_and_minus_one(dims, fits):
    from onnx2tf_alt.ir.graph import graph_from_model
    from onnx2tf_alt.ir.validate import InvalidModelError, check_consistency

    shape = onnx.numpy_helper.from_array(np.array(dims, np.int64), "s")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], "g",
                              [helper.make_tensor_value_info("x", 1, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if fits:
        check_consistency(graph_from_model(model))
    else:
        with pytest.raises(InvalidModelError, match="cannot hold them"):
            check_consistency(graph_from_model(model))


def test_types_that_contradict_each_other_are_an_invalid_model(work):
    ints = onnx.numpy_helper.from_array(np.zeros((1,), np.int64), "i")
    path = _write(work, "badtype", [helper.make_node("Add", ["x", "i"], ["y"], name="addt")],
                  [("x", [1, 3])], [("y", [1, 3])], [ints])
    work("-i", path, "-o", work.root / "out", input_path=path, expect=2,
         phrases=["model is invalid", "addt", "inconsistent type tensor(int64)"])
    assert not (work.root / "out").exists()


_REFUSED_BEFORE_TF = """
import sys
from onnx2tf_alt.cli.main import main
code = main(["-i", sys.argv[1], "-o", sys.argv[2], "-n"])
print("code", code, "tensorflow", "tensorflow" in sys.modules, "tf_keras" in sys.modules)
"""


def test_an_invalid_model_is_refused_before_tensorflow_loads(work):
    """Default flags (saved_model, Keras model, TF's converter where needed): what the ONNX
    alone shows wrong ends the run before the heavy imports."""
    w = onnx.numpy_helper.from_array(np.zeros((2, 4, 3, 3), np.float32), "w")
    path = _write(work, "badconv2", [helper.make_node("Conv", ["x", "w"], ["y"], name="c")],
                  [("x", [1, 3, 8, 8])], [("y", [1, 2, 6, 6])], [w])
    done = subprocess.run([sys.executable, "-c", _REFUSED_BEFORE_TF, str(path),
                           str(work.root / "out")], capture_output=True, text=True,
                          env=cli_env(), timeout=300, check=False)
    assert done.stdout.split() == ["code", "2", "tensorflow", "False", "False"], (
        done.stdout + done.stderr)
    assert "model is invalid" in done.stderr


def test_a_dangling_input_is_an_invalid_model(work):
    model = _custom_op_model()
    model.graph.node[1].op_type, model.graph.node[1].domain = "Relu", ""
    model.graph.node[1].input[0] = "nowhere"
    path = work.root / "dangling.onnx"
    path.write_bytes(model.SerializeToString())  # onnx.save would check it
    work("-i", path, "-o", work.root / "out", input_path=path, expect=2, phrases=["nowhere"])
    assert not (work.root / "out").exists()


def test_corrupt_names_are_escaped(work):
    model = _custom_op_model(op_type="Con\x10")
    path = work.root / "names.onnx"
    path.write_bytes(model.SerializeToString())
    output = work("-i", path, "-o", work.root / "out", input_path=path, expect=1)
    assert "Con\\x10" in output and "\x10" not in output and "b'" not in output
    assert (work.root / "out" / "reports" / "names" / "conversion_errors.json").is_file()


def test_duplicate_graph_outputs_get_distinct_names(work):
    x = np.ones((2, 3), np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"])
    model.graph.output.append(model.graph.output[0])
    path = work.root / "dup.onnx"
    onnx.save(model, path)
    out = work.root / "out"
    work("-i", path, "-o", out, input_path=path, expect=0)
    layout = json.loads((out / "dup_io_layout.json").read_text())
    assert [o["tf_name"] for o in layout["outputs"]] == ["y", "y_1"]
    assert [o["onnx_name"] for o in layout["outputs"]] == ["y", "y"]
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(str(out / "dup_float32.tflite")).get_signature_runner()
    result = runner(x=x)
    assert set(result) == {"y", "y_1"}
    np.testing.assert_array_equal(result["y"], result["y_1"])


def test_two_conversions_are_byte_identical(work):
    """fingerprint.pb (a random uuid) and the .keras metadata (its save time) are the only
    differences by design; SOURCE_DATE_EPOCH fixes both, as reproducible builds expect."""
    os.environ["SOURCE_DATE_EPOCH"] = "1700000000"  # the subprocess inherits it
    try:
        first, second = work.root / "a", work.root / "b"
        work("-i", work.source, "-o", first, "-oh5", "-okv3", expect=0)
        work("-i", work.source, "-o", second, "-oh5", "-okv3", expect=0)
    finally:
        del os.environ["SOURCE_DATE_EPOCH"]
    a, b = tree(first), tree(second)
    manifest = f"{STEM}_manifest.json"
    assert {k: v for k, v in a.items() if k != manifest} == {
        k: v for k, v in b.items() if k != manifest}
    files = [json.loads((f / manifest).read_text())["files"] for f in (first, second)]
    assert files[0] == files[1]


def _custom_op_model(op_type: str = "FancyOp") -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node(op_type, ["a"], ["y"], domain="com.example", name="fancy")]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", 1, [1, 4])],
                              [helper.make_tensor_value_info("y", 1, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.example", 1)])


def _crafted_manifest(out, name: str, files: dict, folders=()) -> None:
    (out / name).write_text(json.dumps({
        "format": "onnx2tf_alt.manifest/1", "kind": "conversion", "source": {},
        "command": [], "folders": list(folders), "files": files}))


@pytest.mark.parametrize("stem", ["old", STEM])
def test_a_crafted_manifest_never_reaches_a_file_outside_the_folder(work, stem):
    out, elsewhere = work.root / "out", work.root / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    victim = elsewhere / "victim.txt"
    victim.write_text("precious")
    (out / "lnk").symlink_to(elsewhere, target_is_directory=True)
    import hashlib

    entry = {"size": victim.stat().st_size,
             "sha256": hashlib.sha256(victim.read_bytes()).hexdigest()}
    _crafted_manifest(out, f"{stem}_manifest.json", {"lnk/victim.txt": entry},
                      folders=["lnk", "lnk/sub"])
    (elsewhere / "sub").mkdir()
    source = work.root / f"{stem}.onnx"
    if stem != STEM:
        source.write_bytes(work.source.read_bytes())
    output = work("-i", source, "-o", out, "-dms", input_path=source, expect=0)
    assert victim.read_text() == "precious" and (elsewhere / "sub").is_dir()
    assert (out / "lnk").is_symlink()
    if stem == STEM:  # its own manifest was read: the entry is named and left alone
        assert "ignoring the manifest entry 'lnk/victim.txt'" in output, output


@pytest.mark.parametrize("content", [
    {"folders": 7, "files": {}},
    {"files": {"a.txt": {"size": "12", "sha256": None}}},
    {"files": ["a.txt"]},
    {"files": {}, "source": "x"},
])
def test_a_malformed_manifest_is_ignored_with_a_warning(work, content):
    out = work.root / "out"
    out.mkdir()
    (out / "a.txt").write_text("mine")
    (out / "old_manifest.json").write_text(json.dumps(
        {"format": "onnx2tf_alt.manifest/1", **content}))
    old = work.root / "old.onnx"
    old.write_bytes(work.source.read_bytes())
    before = tree(out)
    output = work("-i", old, "-o", out, "-dms", input_path=old, expect=2,
                  phrases=["old_manifest.json"])
    assert "internal error" not in output
    assert tree(out) == before  # it is in the way of the new manifest: nothing is replaced
    work("-i", work.source, "-o", out, "-dms", expect=0)  # another model is not concerned
    assert {k: v for k, v in tree(out).items() if k in before} == before


def test_a_node_the_direct_writer_does_not_cover_gets_a_failure_report(work):
    x = np.random.default_rng(0).uniform(0.9, 1.1, (2, 80)).astype(np.float32)
    # CumProd over 80 values calls tf.math.cumprod, which the direct writer's Recorder lacks
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                        helper.make_node("CumProd", ["a", "axis"], ["y"], name="cumprod")],
                       {"x": x}, ["y"], {"axis": np.array(1, np.int64)}, opset=26)
    path = work.root / "hard.onnx"
    onnx.save(model, path)
    output = work("-i", path, "-o", work.root / "out", "-dms", "--tflite_writer", "direct",
                  input_path=path, expect=1,
                  phrases=["--tflite_writer direct: node 'cumprod' (CumProd)"])
    reports = work.root / "out" / "reports" / "hard"
    assert str(reports) in output
    listed = json.loads((reports / "conversion_errors.json").read_text())["failures"]
    assert [(f["node_name"], f["op_type"]) for f in listed] == [("cumprod", "CumProd")]
    repro = onnx.load(reports / listed[0]["repro_model"])
    assert [n.op_type for n in repro.graph.node] == ["CumProd"]
    assert set(tree(work.root / "out")) == {f"reports/hard/{n}" for n in (
        "conversion_errors.json", "manifest.json", listed[0]["repro_model"],
        listed[0]["inputs_npz"])}
