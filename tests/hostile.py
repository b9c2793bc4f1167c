"""Hostile-but-realistic uses of the CLI: the catalogue that tests/export/test_hostile.py
asserts and benchmarks/hostile_cases.py prints as a table.

A case sets up a folder (models, data, earlier conversions, symlinks, crafted manifests)
and returns the CLI arguments to run there. What every case must show:

- the exit code it documents (0, 1 or 2) and a first message line containing `phrase`;
- every file that existed before the run, inside and beside the output folder, keeps its
  sha256, except, after a successful run, the files of the converted model's own previous
  conversion (listed in its manifest), which it replaces;
- no staging folder (`.onnx2tf_alt_*`) and nothing in the run's temporary folder is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

F = onnx.TensorProto.FLOAT


@dataclass
class Case:
    name: str
    setup: Callable[[str], list]  # folder -> CLI arguments (paths relative to the folder)
    code: int
    phrase: str = ""  # in the first line of the output (after the INFO / WARNING lines)
    runs: list = field(default_factory=list)  # CLI runs before, as set-up: args or (code, args)


# --- models ---------------------------------------------------------------------------------
def model(nodes, inputs, outputs, inits=(), opset=17, extra=()):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs], list(inits))
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in extra]]
    return helper.make_model(graph, opset_imports=opsets)


def cnn(channels: int = 8):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
                                "w")
    return model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                  helper.make_node("Relu", ["c"], ["y"], name="relu")],
                 [("x", [1, 3, 16, 16])], [("y", [1, channels, 16, 16])], [w])


def custom(*op_types):
    nodes, last = [helper.make_node("Relu", ["x"], ["v0"], name="relu")], "v0"
    for i, op in enumerate(op_types):
        nodes.append(helper.make_node(op, [last], [f"v{i + 1}"], domain="com.example",
                                      name=f"custom_{i}"))
        last = f"v{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["y"], name="out"))
    return model(nodes, [("x", [1, 4])], [("y", [1, 4])], extra=["com.example"])


def save(root, name, proto, check=True) -> str:
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if check:
        onnx.save(proto, path)
    else:
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())
    return name


def write(root, name, data: bytes) -> str:
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return name


def npy(root, name, array) -> str:
    np.save(os.path.join(root, name), array)
    return name


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(root, name, files: dict, folders=(), **extra) -> None:
    folders = list(folders) if isinstance(folders, (list, tuple)) else folders
    content = {"format": "onnx2tf_alt.manifest/1", "kind": "conversion", "source": {},
               "command": [], "folders": folders, "files": files, **extra}
    write(root, name, json.dumps(content).encode())


def entry_of(path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    return {"size": len(data), "sha256": sha256(data)}


def image(samples=4):
    return np.random.default_rng(1).random((samples, 3, 16, 16), np.float32)


# --- the cases ------------------------------------------------------------------------------
CASES: list[Case] = []


def case(code: int, phrase: str = "", runs: list | None = None):
    def register(setup):
        CASES.append(Case(setup.__name__, setup, code, phrase, runs or []))
        return setup
    return register


# the input file
@case(2, "could not be read as an ONNX model")
def garbage(r):
    return ["-i", write(r, "junk.onnx", b"this is not a model\n" * 10), "-o", "out"]


@case(2, "could not be read as an ONNX model")
def truncated(r):
    data = cnn().SerializeToString()
    return ["-i", write(r, "cut.onnx", data[: len(data) // 2]), "-o", "out"]


@case(2, "empty")
def empty_file(r):
    return ["-i", write(r, "empty.onnx", b""), "-o", "out"]


@case(2, "is not a file")
def input_is_a_folder(r):
    os.makedirs(os.path.join(r, "adir.onnx"))
    return ["-i", "adir.onnx", "-o", "out"]


@case(2, "does not exist")
def missing_input(r):
    return ["-i", "nope.onnx", "-o", "out"]


@case(2, "topologically sorted")
def graph_cycle(r):
    m = model([helper.make_node("Relu", ["b"], ["a"], name="r1"),
               helper.make_node("Relu", ["a"], ["b"], name="r2"),
               helper.make_node("Add", ["x", "b"], ["y"], name="add")],
              [("x", [1, 4])], [("y", [1, 4])])
    return ["-i", save(r, "cycle.onnx", m, check=False), "-o", "out"]


@case(2, "nowhere")
def dangling_value(r):
    m = model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [("x", [1, 4])],
              [("y", [1, 4])])
    return ["-i", save(r, "dangling.onnx", m, check=False), "-o", "out"]


@case(2, "single static assignment")
def duplicate_node_outputs(r):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r1"),
               helper.make_node("Relu", ["x"], ["y"], name="r2")], [("x", [1, 4])],
              [("y", [1, 4])])
    return ["-i", save(r, "dupnode.onnx", m, check=False), "-o", "out"]


@case(2, "too small")
def short_raw_data(r):
    m = cnn()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:10]
    return ["-i", save(r, "raw.onnx", m, check=False), "-o", "out"]


@case(2, "channels")
def inconsistent_conv(r):
    w = numpy_helper.from_array(np.zeros((4, 5, 3, 3), np.float32), "w")
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
              [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], [w])
    return ["-i", save(r, "badconv.onnx", m), "-o", "out"]


@case(2, "add1")
def contradictory_shapes(r):
    m = model([helper.make_node("Add", ["a", "b"], ["y"], name="add1")],
              [("a", [2, 3]), ("b", [4, 5])], [("y", [2, 3])])
    return ["-i", save(r, "badadd.onnx", m), "-o", "out"]


def _newer(r):
    m = cnn()
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    return save(r, "newer.onnx", m, check=False)


@case(2, "--allow_newer_opset")
def newer_opset(r):
    return ["-i", _newer(r), "-o", "out"]


@case(0, "")
def newer_opset_allowed(r):
    return ["-i", _newer(r), "-o", "out", "-dms", "--allow_newer_opset"]


@case(0, "")
def duplicate_graph_outputs(r):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2, 3])],
              [("y", [2, 3]), ("y", [2, 3])])
    return ["-i", save(r, "dup.onnx", m), "-o", "out", "-dms"]


# unsupported nodes
@case(1, "unsupported ops")
def custom_op(r):
    return ["-i", save(r, "custom.onnx", custom("FancyOp")), "-o", "out"]


@case(1, "3 node(s) have unsupported ops")
def several_unsupported(r):
    return ["-i", save(r, "custom3.onnx", custom("FancyOp", "OtherOp", "ThirdOp")), "-o", "out"]


@case(1, "unsupported ops")
def corrupt_op_name(r):
    return ["-i", save(r, "names.onnx", custom("Con\x10"), check=False), "-o", "out"]


@case(1, "--tflite_writer direct")
def direct_writer_not_covering(r):
    # CumProd over 80 values calls tf.math.cumprod, which the direct writer's Recorder lacks
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    m = model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
               helper.make_node("CumProd", ["a", "axis"], ["y"], name="cumprod")],
              [("x", [2, 80])], [("y", [2, 80])], [axis], opset=26)
    return ["-i", save(r, "hard.onnx", m), "-o", "out", "-dms", "--tflite_writer", "direct"]


# external data
def _external(r, location: str, name: str = "ext.onnx", data_at: str | None = None) -> str:
    """cnn() with its weights in external data at `location`; their bytes are written to
    `data_at` (relative to `r`) when given."""
    m = cnn()
    tensor = m.graph.initializer[0]
    data = tensor.raw_data
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(data)))):
        tensor.external_data.add(key=key, value=value)
    if data_at is not None:
        write(r, data_at, data)
    return save(r, name, m, check=False)


@case(2, "missing or unreadable")
def external_data_missing(r):
    return ["-i", _external(r, "w.bin"), "-o", "out"]


@case(2, "outside the model's folder")
def external_data_traversal(r):
    os.makedirs(os.path.join(r, "models"))
    return ["-i", _external(r, "../secret.bin", "models/ext.onnx", data_at="secret.bin"),
            "-o", "out"]


@case(2, "absolute path")
def external_data_absolute(r):
    return ["-i", _external(r, os.path.join(r, "w.bin"), data_at="w.bin"), "-o", "out"]


@case(2, "symbolic link")
def external_data_symlink_outside(r):
    os.makedirs(os.path.join(r, "models"))
    src = _external(r, "w.bin", "models/ext.onnx", data_at="elsewhere/w.bin")
    os.symlink(os.path.join(r, "elsewhere", "w.bin"), os.path.join(r, "models", "w.bin"))
    return ["-i", src, "-o", "out"]


@case(2, "could not be read")
def external_data_too_short(r):
    write(r, "w.bin", b"\0" * 16)
    return ["-i", _external(r, "w.bin"), "-o", "out"]


@case(2, "output path")
def external_data_inside_the_output(r):
    m = cnn()
    external_data_helper.convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    save(r, "out/variables/ext.onnx", m)
    return ["-i", "out/variables/ext.onnx", "-o", "out", "-osm"]


# flags
@case(2, "Bad -ois")
def bad_ois(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-ois", "x:1,3,a,16"]


@case(2, "ghost")
def ois_unknown_input(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-ois", "ghost:1,3,16,16"]


@case(2, "rank 4")
def ois_wrong_rank(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-ois", "x:1,3,16"]


@case(2, "ghost")
def keep_unknown_input(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-k", "ghost"]


@case(2, "at least 1")
def batch_zero(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-b", "0"]


@case(2, "ghost")
def onimc_unknown_tensor(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-onimc", "ghost"]


@case(2, "invalid choice: 'fast'")
def unknown_writer(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "--tflite_writer", "fast"]


@case(2, "leave out -osm, -oh5")
def direct_writer_with_keras(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oh5", "--tflite_writer", "direct"]


@case(2, "invalid choice: 'fpga'")
def unknown_target(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "--target", "fpga"]


@case(1, "cannot run on TFLite Micro")
def micro_with_dynamic_input(r):
    m = cnn()
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    m.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "h"
    m.graph.output[0].type.tensor_type.shape.dim[3].dim_param = "w"
    return ["-i", save(r, "dyn.onnx", m), "-o", "out", "--target", "micro"]


@case(2, "--kv_cache_capacity")
def kv_capacity_without_a_cache(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "--kv_cache_capacity", "1000000000"]


@case(2, "--kv_cache_capacity")
def kv_capacity_zero(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "--kv_cache_capacity", "0"]


@case(2, "--signature")
def signature_unknown_input(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "--signature", "main", "ghost:1,3,16,16"]


@case(2, "--signature")
def signature_with_int8(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "--signature", "main",
            "x:1,3,16,16"]


# calibration and check data
def _int8(r, data, *extra):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "-cind", "x",
            npy(r, "data.npy", data), *extra]


@case(2, "non-finite")
def calibration_all_inf(r):
    return _int8(r, np.full((4, 3, 16, 16), np.inf, np.float32))


@case(2, "non-finite")
def calibration_all_nan(r):
    return _int8(r, np.full((4, 3, 16, 16), np.nan, np.float32))


@case(2, "non-finite")
def calibration_one_nan(r):
    data = image()
    data[2, 1, 3, 4] = np.nan
    return _int8(r, data)


@case(2, "is empty")
def calibration_empty(r):
    return _int8(r, np.zeros((0, 3, 16, 16), np.float32))


@case(2, "STD")
def calibration_std_zero(r):
    return _int8(r, image(), "0", "0")


@case(2, "STD")
def calibration_std_inf(r):
    return _int8(r, image(), "0", "inf")


@case(2, "no axis of that size")
def calibration_mean_count(r):
    return _int8(r, image(), "[0,0]", "[1,1]")


@case(2, "shape")
def calibration_wrong_shape(r):
    return _int8(r, np.zeros((4, 3, 8, 8), np.float32))


@case(2, "give N samples along axis 0")
def calibration_wrong_rank(r):
    return _int8(r, np.zeros((4, 16, 16), np.float32))


@case(2, "text")
def calibration_text(r):
    return _int8(r, np.array([["a", "b"]]))


@case(2, "does not exist")
def calibration_missing_file(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "-cind", "x", "nope.npy"]


@case(2, "not a .npy")
def calibration_not_npy(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "-cind", "x",
            write(r, "data.npy", b"no numpy here")]


@case(2, "not a .npy")
def calibration_pickled_objects(r):
    np.save(os.path.join(r, "data.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "-cind", "x", "data.npy"]


@case(2, "ghost")
def calibration_unknown_input(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-oiqt", "-cind", "ghost",
            npy(r, "data.npy", image())]


@case(2, "non-finite")
def check_data_inf(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-coto", "-cind", "x",
            npy(r, "data.npy", np.full((1, 3, 16, 16), np.inf, np.float32))]


# the output folder
@case(2, "lies at or inside an output path")
def input_in_saved_model_assets(r):
    src = save(r, "proj/assets/model.onnx", cnn())
    write(r, "proj/assets/labels.txt", b"cat\ndog\n")
    return ["-i", src, "-o", "proj", "-osm"]


@case(0, "")
def input_in_assets_without_a_saved_model(r):
    src = save(r, "proj/assets/model.onnx", cnn())
    write(r, "proj/assets/labels.txt", b"cat\ndog\n")
    return ["-i", src, "-o", "proj"]


@case(2, "lies at or inside an output path")
def input_named_like_an_output(r):
    return ["-i", save(r, "dir/saved_model.pb", cnn()), "-o", "dir", "-osm"]


@case(0, "")
def input_inside_the_output_folder(r):
    return ["-i", save(r, "proj/model.onnx", cnn()), "-o", "proj"]


@case(2, "was not written by onnx2tf_alt")
def foreign_saved_model(r):
    write(r, "out/saved_model.pb", b"the user's own saved_model")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-osm"]


@case(2, "was not written by onnx2tf_alt")
def foreign_file_in_variables(r):
    write(r, "out/variables/notes.txt", b"mine")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-osm"]


@case(2, "was not written by onnx2tf_alt")
def foreign_file_named_like_an_output(r):
    write(r, "out/m_float32.tflite", b"mine")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(0, "", runs=[["-i", "m.onnx", "-o", "out", "-oh5", "-okv3"]])
def stale_keras_files_replaced(r):
    src = save(r, "m.onnx", cnn())
    write(r, "out/labels.txt", b"mine")
    return ["-i", src, "-o", "out"]


@case(2, "m_io_layout.json", runs=[["-i", "m.onnx", "-o", "out"]])
def edited_previous_output(r):
    save(r, "m.onnx", cnn())
    return ["-i", "m.onnx", "-o", "out", "--edit", "out/m_io_layout.json"]


@case(2, "existing file")
def output_is_a_file(r):
    write(r, "taken", b"user data")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "taken"]


@case(2, "pseudo file system")
def output_on_proc(r):
    return ["-i", save(r, "m.onnx", cnn()), "-o", "/proc/onnx2tf_alt_out"]


@case(0, "")
def output_is_a_symlinked_folder(r):
    os.makedirs(os.path.join(r, "real_out"))
    write(r, "real_out/keep.txt", b"mine")
    os.symlink(os.path.join(r, "real_out"), os.path.join(r, "out"))
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "was not written by onnx2tf_alt")
def symlinked_variables_folder(r):
    os.makedirs(os.path.join(r, "elsewhere"))
    write(r, "elsewhere/precious.bin", b"mine")
    os.makedirs(os.path.join(r, "out"))
    os.symlink(os.path.join(r, "elsewhere"), os.path.join(r, "out", "variables"))
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-osm"]


@case(1, "unsupported ops")
def symlinked_reports_folder(r):
    os.makedirs(os.path.join(r, "elsewhere"))
    os.makedirs(os.path.join(r, "out"))
    os.symlink(os.path.join(r, "elsewhere"), os.path.join(r, "out", "reports"))
    return ["-i", save(r, "custom.onnx", custom("FancyOp")), "-o", "out", "-dms"]


# several models in one folder
@case(0, "", runs=[["-i", "a.onnx", "-o", "out"]])
def second_model_default_flags(r):
    save(r, "a.onnx", cnn())
    return ["-i", save(r, "b.onnx", cnn(4)), "-o", "out"]


@case(2, "leave out -osm", runs=[["-i", "a.onnx", "-o", "out", "-osm"]])
def second_model_with_a_saved_model_too(r):
    save(r, "a.onnx", cnn())
    return ["-i", save(r, "b.onnx", cnn(4)), "-o", "out", "-osm"]


@case(0, "", runs=[["-i", "a.onnx", "-o", "out", "-osm"]])
def second_model_without_saved_model(r):
    save(r, "a.onnx", cnn())
    return ["-i", save(r, "b.onnx", cnn(4)), "-o", "out"]


@case(0, "", runs=[["-i", "a.onnx", "-o", "out", "-dms"], ["-i", "b.onnx", "-o", "out", "-dms"]])
def first_model_again(r):
    save(r, "a.onnx", cnn())
    save(r, "b.onnx", cnn(4))
    return ["-i", "a.onnx", "-o", "out", "-dms", "-oh5"]


@case(1, "unsupported ops", runs=[["-i", "a.onnx", "-o", "out", "-dms"]])
def failing_model_beside_another(r):
    save(r, "a.onnx", cnn())
    return ["-i", save(r, "custom.onnx", custom("FancyOp")), "-o", "out", "-dms"]


@case(0, "", runs=[(1, ["-i", "custom.onnx", "-o", "out", "-dms"])])
def success_beside_another_models_failure_report(r):
    save(r, "custom.onnx", custom("FancyOp"))
    return ["-i", save(r, "a.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "already holds 'm_full_integer_quant.tflite' of another model", runs=[["-i", "m.onnx", "-o", "out", "-dms", "-oiqt",
                                  "-cind", "x", "data.npy"]])
def stems_whose_outputs_collide(r):
    save(r, "m.onnx", cnn())
    npy(r, "data.npy", image())
    return ["-i", save(r, "m_full.onnx", cnn(4)), "-o", "out", "-dms", "-odrqt", "-oiqt",
            "-cind", "x", "data.npy"]


# crafted manifests
def _victim(r):
    write(r, "elsewhere/victim.txt", b"precious")
    os.makedirs(os.path.join(r, "out"), exist_ok=True)
    os.symlink(os.path.join(r, "elsewhere"), os.path.join(r, "out", "lnk"))
    return entry_of(os.path.join(r, "elsewhere", "victim.txt"))


@case(0, "")
def crafted_manifest_of_another_stem(r):
    manifest(r, "out/old_manifest.json", {"lnk/victim.txt": _victim(r)})
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(0, "ignoring the manifest entry 'lnk/victim.txt'")
def crafted_manifest_through_a_symlinked_folder(r):
    manifest(r, "out/m_manifest.json", {"lnk/victim.txt": _victim(r)}, folders=["lnk"])
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(0, "ignoring the manifest entry '../elsewhere/victim.txt'")
def crafted_manifest_with_dot_dot(r):
    entry = _victim(r)
    manifest(r, "out/m_manifest.json", {"../elsewhere/victim.txt": entry})
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(0, "ignoring the manifest entry")
def crafted_manifest_with_absolute_path(r):
    entry = _victim(r)
    manifest(r, "out/m_manifest.json", {os.path.join(r, "elsewhere", "victim.txt"): entry})
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(0, "ignoring the manifest entry")
def crafted_manifest_folder_through_a_symlink(r):
    _victim(r)
    os.makedirs(os.path.join(r, "elsewhere", "empty"))
    manifest(r, "out/m_manifest.json", {}, folders=["lnk/empty"])
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "not a well-formed onnx2tf_alt manifest")
def malformed_manifest_folders(r):
    manifest(r, "out/m_manifest.json", {}, folders=7)
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "not a well-formed onnx2tf_alt manifest")
def malformed_manifest_entry(r):
    write(r, "out/a.txt", b"mine")
    manifest(r, "out/m_manifest.json", {"a.txt": {"size": "4", "sha256": None}})
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "was not written by onnx2tf_alt")
def manifest_that_is_not_json(r):
    write(r, "out/m_manifest.json", b"{ not json")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "was not written by onnx2tf_alt")
def manifest_that_is_a_symlink(r):
    write(r, "elsewhere/real_manifest.json", b"{}")
    os.makedirs(os.path.join(r, "out"))
    os.symlink(os.path.join(r, "elsewhere", "real_manifest.json"),
               os.path.join(r, "out", "m_manifest.json"))
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


@case(2, "nested deeper than any manifest of ours")
def manifest_deeply_nested(r):
    write(r, "out/m_manifest.json",
          b'{"format": "onnx2tf_alt.manifest/1", "files": ' + b"[" * 100000 + b"]" * 100000
          + b"}")
    return ["-i", save(r, "m.onnx", cnn()), "-o", "out", "-dms"]


# --- running a case -------------------------------------------------------------------------
def run_cli(root: str, args: list, tmpdir: str | None = None) -> tuple[int, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    proc = subprocess.run([sys.executable, "-m", "onnx2tf_alt", *map(str, args)], check=False,
                          capture_output=True, text=True, cwd=root, env=env, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def files_below(root: str, skip: str) -> dict[str, str]:
    """Every file below `root` (not following symlinks, not in `skip`): path -> sha256."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) != skip]
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                found[os.path.relpath(path, root)] = "link:" + os.readlink(path)
                continue
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = sha256(f.read())
    return found


def leftovers(*folders: str) -> list[str]:
    return [os.path.join(folder, name) for folder in folders if os.path.isdir(folder)
            for name in os.listdir(folder) if name.startswith((".onnx2tf_alt_", "onnx2tf_alt_"))]


@dataclass
class Outcome:
    code: int
    first_line: str
    output: str
    changed: list  # pre-existing files whose sha256 changed or that are gone, not ours to replace
    left: list  # staging or temporary files left behind


def first_line(output: str) -> str:
    """The first line that is not an INFO / progress line (the message a case is about);
    after argparse's usage block, its error line."""
    lines = [line for line in output.splitlines() if line.strip()]
    if lines and lines[0].startswith("usage:"):
        return next((line for line in lines if "error:" in line), lines[0])
    for line in lines:
        if not line.startswith("INFO:"):
            return line
    return lines[0] if lines else ""


def play(c: Case, root: str) -> Outcome:
    """Set up `c` in the empty folder `root`, run it, and say what it did."""
    tmpdir = os.path.join(root, "tmp")
    os.makedirs(tmpdir)
    args = c.setup(root)
    edit = None
    if "--edit" in args:  # change a file of the set-up conversion by hand
        at = args.index("--edit")
        edit, args = args[at + 1], args[:at] + args[at + 2:]
    for run in c.runs:
        expected, run = run if isinstance(run, tuple) else (0, run)
        code, output = run_cli(root, run, tmpdir)
        assert code == expected, (c.name, run, output)
    if edit is not None:
        write(root, edit, b"edited by hand")
    out = args[args.index("-o") + 1]
    out_path = out if os.path.isabs(out) else os.path.join(root, out)
    stem = os.path.splitext(os.path.basename(args[args.index("-i") + 1]))[0]
    owned = {os.path.relpath(os.path.join(out_path, p), root)
             for p in _listed(out_path, f"{stem}_manifest.json")}
    before = files_below(root, tmpdir)
    code, output = run_cli(root, args, tmpdir)
    after = files_below(root, tmpdir)
    replaced = owned if code == 0 else set()  # its own previous files are its to replace
    changed = sorted(p for p, digest in before.items()
                     if after.get(p) != digest and p not in replaced)
    left = leftovers(root, os.path.dirname(out_path), out_path) + [
        os.path.join(tmpdir, n) for n in os.listdir(tmpdir)]
    return Outcome(code, first_line(output), output, changed, left)


def _listed(out_path: str, name: str) -> set[str]:
    """The files an earlier conversion's manifest lists, with the manifest."""
    path = os.path.join(out_path, name)
    try:
        with open(path) as f:
            return set(json.load(f)["files"]) | {name}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {name}
