"""Run the CLI on hostile-but-realistic cases and print one table row per case: the command,
its exit code, the first line of its message, what is left in `-o`, leftovers in the run's
TMPDIR and beside `-o`, and whether the input's sha256 is unchanged.

    python benchmarks/hostile_cases.py [WORK_DIR]

Each case gets a fresh folder under WORK_DIR (default: a temporary folder).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

F = onnx.TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, extra=()):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                              list(inits))
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in extra]]
    return helper.make_model(graph, opset_imports=opsets)


def cnn():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    return model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                  helper.make_node("Relu", ["c"], ["y"], name="relu")],
                 [("x", [1, 3, 16, 16])], [("y", [1, 8, 16, 16])], [w])


def custom(*op_types):
    nodes, last = [helper.make_node("Relu", ["x"], ["v0"], name="relu")], "v0"
    for i, op in enumerate(op_types):
        nodes.append(helper.make_node(op, [last], [f"v{i + 1}"], domain="com.example",
                                      name=f"custom_{i}"))
        last = f"v{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["y"], name="out"))
    return model(nodes, [("x", [1, 4])], [("y", [1, 4])], extra=["com.example"])


def save(root, name, proto, check=True):
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if check:
        onnx.save(proto, path)
    else:
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())
    return path


def write(root, name, data: bytes):
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def convert(root, src, out, *flags):
    return run(root, ["-i", src, "-o", out, "-n", *flags])[0]


# --- the cases: each returns (input path, -o path, extra flags), after any set-up ------------
def c_garbage(r):
    return write(r, "junk.onnx", b"this is not a model\n" * 10), "out", []


def c_truncated(r):
    data = cnn().SerializeToString()
    return write(r, "cut.onnx", data[: len(data) // 2]), "out", []


def c_empty(r):
    return write(r, "empty.onnx", b""), "out", []


def c_directory(r):
    os.makedirs(os.path.join(r, "adir.onnx"))
    return os.path.join(r, "adir.onnx"), "out", []


def c_missing(r):
    return os.path.join(r, "nope.onnx"), "out", []


def c_bad_ois(r):
    return save(r, "m.onnx", cnn()), "out", ["-ois", "x:1,3,a,16"]


def c_unknown_input(r):
    return save(r, "m.onnx", cnn()), "out", ["-k", "ghost"]


def c_cycle(r):
    m = model([helper.make_node("Relu", ["b"], ["a"], name="r1"),
               helper.make_node("Relu", ["a"], ["b"], name="r2"),
               helper.make_node("Add", ["x", "b"], ["y"], name="add")],
              [("x", [1, 4])], [("y", [1, 4])])
    return save(r, "cycle.onnx", m, check=False), "out", []


def c_dangling(r):
    m = model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [("x", [1, 4])],
              [("y", [1, 4])])
    return save(r, "dangling.onnx", m, check=False), "out", []


def c_duplicate_node_outputs(r):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r1"),
               helper.make_node("Relu", ["x"], ["y"], name="r2")], [("x", [1, 4])],
              [("y", [1, 4])])
    return save(r, "dupnode.onnx", m, check=False), "out", []


def c_bad_raw_data(r):
    m = cnn()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:10]
    return save(r, "raw.onnx", m, check=False), "out", []


def c_custom_op(r):
    return save(r, "custom.onnx", custom("FancyOp")), "out", []


def c_several_unsupported(r):
    return save(r, "custom3.onnx", custom("FancyOp", "OtherOp", "ThirdOp")), "out", []


def c_input_in_assets(r):
    src = save(r, "proj/assets/model.onnx", cnn())
    write(r, "proj/assets/labels.txt", b"cat\ndog\n")
    return src, "proj", []


def c_input_named_like_output(r):
    return save(r, "dir/saved_model.pb", cnn()), "dir", []


def c_input_in_output_folder(r):
    return save(r, "proj/model.onnx", cnn()), "proj", []


def c_foreign_saved_model(r):
    write(r, "out/saved_model.pb", b"the user's own saved_model")
    return save(r, "m.onnx", cnn()), "out", []


def c_foreign_in_variables(r):
    write(r, "out/variables/notes.txt", b"mine")
    return save(r, "m.onnx", cnn()), "out", []


def c_stale_keras_files(r):
    src = save(r, "m.onnx", cnn())
    convert(r, src, "out", "-oh5", "-okv3")
    write(r, "out/labels.txt", b"mine")
    return src, "out", []


def c_edited_previous_output(r):
    src = save(r, "m.onnx", cnn())
    convert(r, src, "out")
    write(r, "out/m_io_layout.json", b"edited by hand")
    return src, "out", []


def c_output_is_a_file(r):
    write(r, "taken", b"user data")
    return save(r, "m.onnx", cnn()), "taken", []


def c_output_on_proc(r):
    return save(r, "m.onnx", cnn()), "/proc/onnx2tf_alt_out", []


def c_batch_zero(r):
    return save(r, "m.onnx", cnn()), "out", ["-b", "0"]


def _newer(r):
    m = cnn()
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    return save(r, "newer.onnx", m, check=False)


def c_newer_opset(r):
    return _newer(r), "out", []


def c_newer_opset_allowed(r):
    return _newer(r), "out", ["--allow_newer_opset"]


def c_missing_external_data(r):
    m = cnn()
    external_data_helper.convert_model_to_external_data(m, location="m.data", size_threshold=0)
    src = save(r, "ext.onnx", m)
    os.remove(os.path.join(r, "m.data"))
    return src, "out", []


def c_invalid_conv(r):
    w = numpy_helper.from_array(np.zeros((4, 5, 3, 3), np.float32), "w")
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
              [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], [w])
    return save(r, "badconv.onnx", m), "out", []


def c_contradictory_shapes(r):
    m = model([helper.make_node("Add", ["a", "b"], ["y"], name="add1")],
              [("a", [2, 3]), ("b", [4, 5])], [("y", [2, 3])])
    return save(r, "badadd.onnx", m), "out", []


def c_corrupt_op_name(r):
    return save(r, "names.onnx", custom("Con\x10"), check=False), "out", []


def c_duplicate_graph_outputs(r):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2, 3])],
              [("y", [2, 3]), ("y", [2, 3])])
    return save(r, "dup.onnx", m), "out", []


CASES = [(name[2:], fn) for name, fn in globals().items() if name.startswith("c_")]


def run(root, args, tmpdir=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if tmpdir:
        env["TMPDIR"] = tmpdir
    proc = subprocess.run([sys.executable, "-m", "onnx2tf_alt", *args], check=False,
                          capture_output=True,
                          text=True, cwd=root, env=env, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def sha(path):
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def listing(folder):
    if not os.path.isdir(folder):
        return "(none)" if not os.path.exists(folder) else "(a file)"
    names = sorted(os.path.relpath(os.path.join(d, f), folder)
                   for d, _, fs in os.walk(folder) for f in fs)
    return f"{len(names)} files" if len(names) > 4 else (", ".join(names) or "(empty)")


def main(work: str) -> None:
    print("| case | flags | exit | first line of the message | files in -o | temp leftovers "
          "| input unchanged |")
    print("|---|---|---|---|---|---|---|")
    for name, setup in CASES:
        root = os.path.join(work, name)
        os.makedirs(os.path.join(root, "tmp"))
        src, out, flags = setup(root)
        out_path = out if os.path.isabs(out) else os.path.join(root, out)
        before = sha(src)
        code, text = run(root, ["-i", src, "-o", out_path, "-n", *flags],
                         tmpdir=os.path.join(root, "tmp"))
        lines = [line for line in text.splitlines() if line.strip()]
        first = (lines[0] if lines else "").replace("|", "/").replace(root, ".")[:110]
        left = os.listdir(os.path.join(root, "tmp")) + [
            n for d in (root, os.path.dirname(out_path)) if os.path.isdir(d)
            for n in os.listdir(d) if n.startswith(".onnx2tf_alt_")]
        same = "n/a" if before is None else ("yes" if sha(src) == before else "**NO**")
        shown = listing(out_path) if not out_path.startswith("/proc") else "(none)"
        print(f"| {name} | {' '.join(flags)} | {code} | {first} | {shown} | "
              f"{len(left)} | {same} |", flush=True)


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hostile_")
    try:
        main(folder)
    finally:
        if len(sys.argv) <= 1:
            shutil.rmtree(folder, ignore_errors=True)
