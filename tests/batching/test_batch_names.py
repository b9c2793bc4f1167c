"""Output folder names of `onnx2tf-alt batch`: each a function of its model's own path, so
adding a model never renames another's folder; an older batch's folders are renamed to the
new names, never lost; hostile sources end in a clear message, never a traceback.

Only one test starts conversions (two children); the others need no TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_batch import _lines, _save, add_model, relu_model

import onnx2tf_alt
from onnx2tf_alt.batching.names import MAX_LENGTH, folder_name
from onnx2tf_alt.batching.resume import adopt_renamed, records_by_name
from onnx2tf_alt.batching.source import Job, load_jobs
from onnx2tf_alt.cli.main import main as cli_main
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.export.manifest import FORMAT


def _touch(root, *rels: str) -> None:
    for rel in rels:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()


def _names(root) -> dict[str, str]:
    return {os.path.relpath(j.path, root): j.name for j in load_jobs(str(root))}


def test_names_stay_when_a_colliding_model_is_added(tmp_path):
    listing = ["a/model.onnx", "b/other.onnx", "net.onnx", "Net_2.onnx", "x/a__model.onnx"]
    added = ["c/model.onnx", "model.onnx", "a__model.onnx", "NET.onnx", "c/other.onnx"]
    before = {rel: folder_name(rel) for rel in listing}
    after = {rel: folder_name(rel) for rel in reversed(listing + added)}
    assert {rel: after[rel] for rel in listing} == before
    # The same on a source folder, as load_jobs lists it.
    _touch(tmp_path, *listing)
    first = _names(tmp_path)
    _touch(tmp_path, *added)
    second = _names(tmp_path)
    assert first == before and {rel: second[rel] for rel in listing} == first
    assert second["a/model.onnx"] == "a__model" and second["model.onnx"] == "model"
    assert len({n.casefold() for n in second.values()}) == len(second)


def test_folder_name_rule():
    assert folder_name("resnet50-v1.7.onnx") == "resnet50-v1.7"
    assert folder_name("zoo/vision/mobilenet_v2.onnx") == "zoo__vision__mobilenet_v2"
    hashed = {
        "Net.onnx": "Net~", "a/B.onnx": "a__B~", "m.ONNX": "m~", "my model.onnx": "my_model~",
        "a__b.onnx": "a__b~", "a_/b.onnx": "a___b~", "-oh5.onnx": "oh5~", ".onnx": "model~",
        "../shared/m.onnx": "shared__m~", "batch_summary.md.onnx": "batch_summary.md~",
        "x/.hidden.onnx": "x__.hidden~", "\u00e9t\u00e9.onnx": "t_~", "\u65e5\u672c.onnx": "model~",
    }
    for rel, start in hashed.items():
        name = folder_name(rel)
        assert name.startswith(start) and len(name) == len(start) + 8, (rel, name)
    long = folder_name("/".join(["folder"] * 40) + "/m.onnx")
    assert len(long) == MAX_LENGTH and "~" in long


def test_distinct_paths_never_share_a_folder_even_ignoring_case():
    paths = ["a/b.onnx", "a__b.onnx", "a_/b.onnx", "a/_b.onnx", "A/b.onnx", "a/B.onnx",
             "a_b.onnx", "a b.onnx", "a?b.onnx", "m.onnx", "M.onnx", "m.ONNX", "m.Onnx",
             "m~8c2d7f01.onnx", "m_8c2d7f01.onnx", "x/m.onnx", "x__m.onnx", "x.__m.onnx",
             "results/batch_results.jsonl.onnx", "batch_results.jsonl.onnx",
             "batch_results.jsonl~.onnx", "../m.onnx", "./m.onnx", "m..onnx", "m-.onnx"]
    names = [folder_name(p) for p in paths]
    assert len({n.casefold() for n in names}) == len(paths)
    for name in names:
        assert "/" not in name and name[0] not in ".-" and name != "batch_results.jsonl"


def test_manifest_names_that_would_share_a_folder_are_refused(tmp_path):
    _touch(tmp_path, "models/m.onnx", "models/n.onnx")
    manifest = tmp_path / "m.jsonl"

    def refused(*entries) -> str:
        manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
        with pytest.raises(InputError) as caught:
            load_jobs(str(manifest))
        return str(caught.value)

    twice = refused({"path": "models/m.onnx"}, {"path": "models/m.onnx", "flags": ["-oh5"]})
    assert "both be converted into the folder \"models__m\"" in twice
    assert "ignoring case" in refused({"path": "models/m.onnx"},
                                      {"path": "models/n.onnx", "name": "Models__M"})
    assert "own files" in refused({"path": "models/m.onnx", "name": "batch_summary.html"})
    assert "non-empty string" in refused({"path": "models/m.onnx", "name": 3})
    manifest.write_text(json.dumps({"path": "models/m.onnx"}) + "\n"
                        + json.dumps({"path": "models/m.onnx", "name": "m_h5"}) + "\n")
    assert [j.name for j in load_jobs(str(manifest))] == ["models__m", "m_h5"]


def _fake_conversion(folder, source: str) -> None:
    """What adopt_renamed looks at in a converted folder: its manifest's input path."""
    os.makedirs(folder, exist_ok=True)
    manifest = {"format": FORMAT, "kind": "conversion", "source": {"path": source},
                "files": {}}
    (folder / f"{os.path.basename(source)[:-5]}_manifest.json").write_text(
        json.dumps(manifest))


def test_older_batch_folders_are_renamed_never_lost(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    jobs = [Job(str(src / rel), folder_name(rel)) for rel in
            ("a/m.onnx", "m.onnx", "b/m.onnx", "c/q.onnx", "d/r.onnx", "e/s.onnx")]
    a, root, b, c, d, e = (j.path for j in jobs)
    # An older batch named them m, m_2, b__m (stems, counters, paths where stems collide)
    # and q, r; e/s.onnx was never converted there.
    _fake_conversion(out / "m", a)  # a/m.onnx -> a__m
    _fake_conversion(out / "m_2", root)  # m.onnx -> m, which a/m.onnx's folder still has
    _fake_conversion(out / "b__m", b)  # unchanged
    (out / "q").mkdir()  # c/q.onnx: no conversion of it there (it failed): stays
    _fake_conversion(out / "r", d)
    (out / "d__r").mkdir()  # d/r.onnx's new name is taken: its folder stays
    (out / "elsewhere").mkdir()
    os.symlink(out / "elsewhere", out / "s")  # a link is never moved
    records = [{"name": n, "path": p, "input_sha256": n} for n, p in
               [("m_2", root), ("m", a), ("b__m", b), ("q", c), ("r", d), ("s", e)]]
    moved = adopt_renamed(jobs, str(out), records)
    assert moved == {"m": "a__m", "m_2": "m"}  # m_2 waits until "m" is free
    assert sorted(os.listdir(out)) == ["a__m", "b__m", "d__r", "elsewhere", "m", "q", "r", "s"]
    assert os.path.isfile(out / "a__m" / "m_manifest.json")
    assert json.loads((out / "m" / "m_manifest.json").read_text())["source"]["path"] == root
    # Their records are found under the new names.
    by_name = records_by_name(jobs, records)
    assert {n: r["input_sha256"] for n, r in by_name.items()} == {
        "a__m": "m", "m": "m_2", "b__m": "b__m", "c__q": "q", "d__r": "r", "e__s": "s"}
    assert adopt_renamed(jobs, str(out), records) == {}  # nothing left to move


def test_hostile_sources_end_in_a_message(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "src" / "out"
    _touch(src, "ok/m.onnx", "out/earlier/x.onnx")  # out/ (OUT_ROOT) is not searched
    os.symlink("..", src / "ok" / "loop")  # a folder loop: not followed
    os.symlink("self.onnx", src / "self.onnx")  # a file loop
    os.symlink("nothing.onnx", src / "dangling.onnx")
    os.mkfifo(src / "pipe.onnx")  # reading it would wait forever
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside / "gone.onnx", src / "ext.onnx")
    jobs = load_jobs(str(src), str(out))
    assert [j.name for j in jobs] == ["dangling", "ext", "pipe", "self", "ok__m"]
    # Only models nobody can read are left: nothing is converted, each says why.
    os.remove(jobs[-1].path)
    assert cli_main(["batch", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "dangling: not converted: " in err and "(a symbolic link to nothing" in err
    records = {r["name"]: r for r in _lines(out / "batch_results.jsonl")}
    assert {n: r["error_kind"] for n, r in records.items()} == dict.fromkeys(
        ["dangling", "ext", "pipe", "self"], "unreadable input")
    assert sorted(os.listdir(out)) == [".batch", "batch_results.jsonl", "batch_summary.html",
                                       "batch_summary.md", "earlier"]
    assert os.listdir(outside) == []
    # -o the source itself, or a model's folder holding the source (SOURCE inside OUT_ROOT).
    assert cli_main(["batch", str(src), "-o", str(src / "ok" / "..")]) == 2
    assert "is the source folder itself" in capsys.readouterr().err
    _touch(tmp_path, "zoo/zoo.onnx")
    assert cli_main(["batch", str(tmp_path / "zoo"), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"'{tmp_path / 'zoo'}" in err and "pass an -o folder outside the source" in err


def test_folder_of_an_older_batch_renamed_then_resumed(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _save(relu_model(), src / "a" / "m.onnx")
    first = onnx2tf_alt.batch(str(src), str(out))
    assert [(r["name"], r["outcome"]) for r in first.results] == [("a__m", "ok")]
    converted = os.path.getmtime(out / "a__m" / "m_float32.tflite")
    # As an older batch left it: the model's only folder named after its stem.
    old_results = (out / "batch_results.jsonl").read_text().replace('"a__m"', '"m"')
    shutil.copytree(out / "a__m", out / "m")
    (out / "batch_results.jsonl").write_text(old_results)
    _save(add_model(), src / "m.onnx")  # its stem collides; its folder is "m"
    # a__m is taken as well: "m" cannot move, and m.onnx is not converted over it.
    kept = onnx2tf_alt.batch(str(src), str(out))
    records = {r["name"]: r for r in kept.results}
    assert kept.renamed == {} and records["a__m"]["resumed"]
    assert records["m"]["error_kind"] == "output folder in use"
    assert str(src / "a" / "m.onnx") in records["m"]["error"]
    assert os.path.getmtime(out / "m" / "m_float32.tflite") == converted
    # Only the old folder: it is renamed, resumed, and m.onnx converted beside it.
    shutil.rmtree(out / "a__m")
    (out / "batch_results.jsonl").write_text(old_results)
    assert cli_main(["batch", str(src), "-o", str(out)]) == 0
    assert "renamed folder m/ to a__m/" in capsys.readouterr().err
    records = {r["name"]: r for r in _lines(out / "batch_results.jsonl")}
    assert records["a__m"]["resumed"] and records["a__m"]["tflite_ops"] == {"RELU": 1}
    assert records["a__m"]["wall_s"] == first.results[0]["wall_s"]
    assert os.path.getmtime(out / "a__m" / "m_float32.tflite") == converted
    assert not records["m"]["resumed"] and records["m"]["tflite_ops"] == {"ADD": 1}
