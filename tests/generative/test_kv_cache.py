"""--kv_cache_capacity and --signature (issue 30): a decoder's growing KV cache as a cache of
fixed capacity, and one .tflite with `prefill` and `decode` signatures sharing the weights,
checked step by step against onnxruntime on the original model (the past growing by
concatenation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.passes.kv_cache import ALL_SUFFIX, fixed_capacity

from cli_runner import cli_env
from harness import assert_close
from kv_decoder import (
    BATCH,
    CAPACITY,
    HEAD,
    KV_HEADS,
    NEW,
    PAST,
    PROMPT,
    cached_steps,
    decoder_model,
    growing_steps,
)


@pytest.fixture(scope="module")
def reference():
    model = decoder_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    return model, prompt, growing_steps(session, prompt, NEW)


def test_the_rewrite_finds_each_past_and_present_and_fixes_the_shapes(reference):
    model, _, _ = reference
    rewritten, entries = fixed_capacity(_copy(model), CAPACITY)
    assert [(e.past, e.present, e.axis, e.symbol) for e in entries] == [
        (name, name.replace("past", "present"), 2, "past_sequence") for name in PAST]
    dims = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
            for i in rewritten.graph.input}
    assert dims["past.0.key"] == ["batch", KV_HEADS, CAPACITY, HEAD]
    assert dims["attention_mask"] == ["batch", f"{CAPACITY} + sequence"]
    concat_outputs = {n.output[0] for n in rewritten.graph.node if n.op_type == "Concat"}
    assert concat_outputs == {e.present + ALL_SUFFIX for e in entries}


def test_the_fixed_capacity_model_decodes_as_the_growing_one_in_onnxruntime(reference):
    model, prompt, (tokens, logits) = reference
    rewritten, _ = fixed_capacity(_copy(model), CAPACITY)
    session = ort.InferenceSession(rewritten.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(_, feeds):
        return dict(zip(names, session.run(None, feeds)))

    got_tokens, got_logits = cached_steps(run, prompt, NEW)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


def test_a_model_without_a_cache_is_refused_with_the_reason():
    model = decoder_model()
    for output in list(model.graph.output)[1:]:
        model.graph.output.remove(output)
    with pytest.raises(InputError, match="no KV cache"):
        fixed_capacity(model, CAPACITY)


def encoder_model() -> onnx.ModelProto:
    """A second model for an `encode` signature: x [batch, frames, 32] -> tanh(x W)."""
    weight = np.random.default_rng(2).normal(0, 0.2, (32, 512)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "w"], ["h"]),
         helper.make_node("Tanh", ["h"], ["encoded"])], "encoder",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "frames", 32])],
        [helper.make_tensor_value_info("encoded", TensorProto.FLOAT, ["batch", "frames", 512])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def route(reference, tmp_path_factory):
    """route("tf") / route("direct") / route("auto"): the output folder of the decoder
    converted with its prefill, decode and encode signatures, with a saved_model through TF
    (or with auto, its .tflite files by the direct writer), or without one by
    the direct writer alone (tflite/direct.write_direct_signatures); each made once."""
    from onnx2tf_alt import convert

    model, _, _ = reference
    folder = tmp_path_factory.mktemp("kv_cache")
    source, encoder = str(folder / "decoder.onnx"), str(folder / "encoder.onnx")
    onnx.save(model, source)
    onnx.save(encoder_model(), encoder)
    made = {}

    def converted(name: str):
        if name not in made:
            out = folder / name
            convert(source, output_folder_path=str(out), kv_cache_capacity=CAPACITY,
                    signatures=[["prefill", f"input_ids:{BATCH},{PROMPT}"],
                                ["decode", f"input_ids:{BATCH},1"],
                                ["encode", encoder, f"features:{BATCH},7,32"]],
                    output_dynamic_range_quantized_tflite=True,
                    output_int4_weight_quantized_tflite=True, non_verbose=True,
                    output_saved_model=name != "direct", tflite_writer=name)
            made[name] = out
        return made[name]
    return converted


@pytest.fixture(scope="module", params=["tf", "direct"])
def converted(route, request):
    return route(request.param)


@pytest.mark.parametrize("suffix", ["float32", "float16", "dynamic_range_quant",
                                    "int4_weight_quant"])
def test_one_tflite_with_prefill_and_decode_decodes_as_onnxruntime(reference, converted,
                                                                  suffix):
    from ai_edge_litert.interpreter import Interpreter

    _, prompt, (tokens, logits) = reference
    interpreter = Interpreter(model_path=str(converted / f"decoder_{suffix}.tflite"))
    assert sorted(interpreter.get_signature_list()) == ["decode", "encode", "prefill"]
    runners = {name: interpreter.get_signature_runner(name) for name in ("prefill", "decode")}
    layout = json.loads((converted / "decoder_io_layout.json").read_text())["signatures"]

    def run(name, feeds):  # the .tflite names and dtypes from the io_layout.json
        runner, entries = runners[name], layout[name]
        kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
        names = {e["onnx_name"]: e["tflite_name"] for e in entries["inputs"]}
        out = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()})
        return {e["onnx_name"]: out[e["tflite_name"]] for e in entries["outputs"]}

    if suffix.endswith("_quant"):  # int8 / int4 weights: close logits on the same tokens
        _, got_logits = cached_steps(run, prompt, NEW, forced=tokens)
        for got, want in zip(got_logits, logits):
            cosine = (got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)
            assert cosine > (0.99 if suffix == "dynamic_range_quant" else 0.95), cosine
        return
    got_tokens, got_logits = cached_steps(run, prompt, NEW)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    tolerance = 1e-5 if suffix == "float32" else 2e-2
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, tolerance, f"{suffix} step {step}")


def test_a_signature_from_another_model_computes_as_onnxruntime(converted):
    from ai_edge_litert.interpreter import Interpreter

    features = np.random.default_rng(3).normal(size=(BATCH, 7, 32)).astype(np.float32)
    session = ort.InferenceSession(encoder_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"features": features})
    interpreter = Interpreter(model_path=str(converted / "decoder_float32.tflite"))
    (got,) = interpreter.get_signature_runner("encode")(features=features).values()
    assert_close(got, want, 1e-5, "encode")
    layout = json.loads((converted / "decoder_io_layout.json").read_text())
    assert layout["signatures"]["encode"]["kv_cache"] == []


def test_the_signatures_share_one_copy_of_the_weights(reference, converted):
    model, _, _ = reference
    weight_bytes = sum(len(i.raw_data) for m in (model, encoder_model())
                       for i in m.graph.initializer)
    size = os.path.getsize(converted / "decoder_float32.tflite")
    assert weight_bytes < size < 1.1 * weight_bytes + 64 * 1024
    layout = json.loads((converted / "decoder_io_layout.json").read_text())
    assert sorted(layout["signatures"]) == ["decode", "encode", "prefill"]
    decode = {e["onnx_name"]: e for e in layout["signatures"]["decode"]["inputs"]}
    assert decode["past.0.key"]["shape"] == [BATCH, KV_HEADS, CAPACITY, HEAD]
    assert decode["attention_mask"]["shape"] == [BATCH, CAPACITY + 1]
    assert [e["past"] for e in layout["signatures"]["decode"]["kv_cache"]] == PAST



def test_the_saved_model_has_the_signatures_and_the_weights_once(reference, route):
    """TF Serving's view: prefill and decode (and encode) in one saved_model whose variables
    hold each weight once; its prefill step computes what onnxruntime does."""
    import tensorflow as tf

    converted = route("tf")
    model, prompt, (_, logits) = reference
    weight_bytes = sum(len(i.raw_data) for m in (model, encoder_model())
                       for i in m.graph.initializer if len(i.raw_data) > 4096)  # variables
    stored = sum(f.stat().st_size for f in (converted / "variables").iterdir())
    assert weight_bytes < stored < 1.1 * weight_bytes + 64 * 1024  # twice would be 2x
    loaded = tf.saved_model.load(str(converted))
    assert sorted(loaded.signatures) == ["decode", "encode", "prefill"]
    layout = json.loads((converted / "decoder_io_layout.json").read_text())["signatures"]
    names = {e["onnx_name"]: e["tf_name"] for e in layout["prefill"]["inputs"]
             + layout["prefill"]["outputs"]}
    mask = np.zeros((BATCH, CAPACITY + PROMPT), np.int64)
    mask[:, CAPACITY:] = 1
    feeds = {"input_ids": prompt, "attention_mask": mask,
             "position_ids": np.tile(np.arange(PROMPT), (BATCH, 1)),
             **{name: np.zeros((BATCH, KV_HEADS, CAPACITY, HEAD), np.float32) for name in PAST}}
    signature = loaded.signatures["prefill"]
    kinds = {k: v.dtype for k, v in signature.structured_input_signature[1].items()}
    out = signature(**{names[k]: tf.constant(v, kinds[names[k]]) for k, v in feeds.items()})
    assert_close(out[names["logits"]].numpy()[:, -1], logits[0], 1e-5, "saved_model prefill")


def test_beside_a_saved_model_the_signatures_file_is_the_direct_writers(route):
    """Default flags (a saved_model) with --tflite_writer auto: the .tflite files of the
    signatures are the -dms run's (the direct writer's), byte for byte, and the io_layout
    that names the saved_model's inputs and outputs is the TF route's."""
    beside, direct, tf = route("auto"), route("direct"), route("tf")
    assert (beside / "saved_model.pb").exists()
    for suffix in ("float32", "float16", "dynamic_range_quant", "int4_weight_quant"):
        name = f"decoder_{suffix}.tflite"
        assert (beside / name).read_bytes() == (direct / name).read_bytes(), suffix
    layout = (beside / "decoder_io_layout.json").read_text()
    assert layout == (tf / "decoder_io_layout.json").read_text()


def test_the_delegate_report_shows_the_decode_step_in_one_xnnpack_partition(converted):
    """Only the integer mask, position and lookup ops before it stay on reference kernels: the
    grouped-query Expand is a broadcasting MUL (ops/shape.py), not BROADCAST_TO."""
    reports = json.loads((converted / "decoder_delegates.json").read_text())["signatures"]
    assert sorted(reports) == ["decode", "encode", "prefill"]
    for name, report in reports.items():
        assert report["xnnpack_partitions"] == 1, (name, report["summary"])
        assert report["subgraphs"] == 3, name
        # each present's new entries named by the one op that computes them (an output of
        # another signature with the same tensor index once named an op it did not compute)
        named = [n["name"] for op in report["ops"] for n in op["onnx_nodes"]
                 if n["name"].endswith("/new_entries")]
        presents = [] if name == "encode" else [p.replace("past", "present") for p in PAST]
        assert sorted(named) == sorted(f"{p}/new_entries" for p in presents), (name, named)
        left = {op["op"] for op in report["ops"] if not op["delegated"]}
        assert not left & {"BROADCAST_TO", "BATCH_MATMUL", "FULLY_CONNECTED", "SOFTMAX",
                           "MUL", "CONCATENATION"}, name
        # the mask and the positions of its keys and queries (the filled slots counted)
        assert left <= {"CAST", "LESS", "SELECT", "SELECT_V2", "GATHER", "RESHAPE", "ADD",
                        "LOGICAL_AND", "LESS_EQUAL", "EXPAND_DIMS", "SLICE", "SUM",
                        "SUB"}, (name, left)


def test_each_signature_is_analyzed_alone_for_the_delegate_report(monkeypatch, tmp_path):
    """XNNPACK packs the weights of every subgraph of a file it is given: the report loads
    each signature in a copy that holds its subgraph alone (a 623 MB prefill / decode
    decoder's conversion peaked in this report at 2.24 GB, 1.77 GB so)."""
    from onnx2tf_alt import convert
    from onnx2tf_alt.export import delegates
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    seen = []
    real = delegates.xnnpack_partitions

    def counted(content, path=None):
        model = unpack_model(Path(path).read_bytes() if path else content)
        seen.append(len(model.subgraphs))
        return real(content, path)

    monkeypatch.setattr(delegates, "xnnpack_partitions", counted)
    source = tmp_path / "decoder.onnx"
    onnx.save(decoder_model(), source)
    convert(str(source), output_folder_path=str(tmp_path / "out"), kv_cache_capacity=CAPACITY,
            signatures=[["prefill", f"input_ids:{BATCH},{PROMPT}"],
                        ["decode", f"input_ids:{BATCH},1"]], non_verbose=True)
    assert seen == [1, 1]
    reports = json.loads((tmp_path / "out" / "decoder_delegates.json").read_text())
    assert {r["subgraphs"] for r in reports["signatures"].values()} == {2}
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        f"decoder_{s}" for s in ("delegates.json", "float16.tflite", "float32.tflite",
                                 "io_layout.json", "manifest.json"))  # no copy left


def test_the_direct_route_imports_no_tensorflow_and_computes_as_the_tf_route(route, tmp_path):
    """`--signature ... -dms` from the CLI in a process that never loads TF: every signature
    of the float32 file computes what the TF route's does, with no more ops or TRANSPOSEs,
    and the weights once."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    tf_route = route("tf")
    out = tmp_path / "out"
    args = ["-i", str(tf_route.parent / "decoder.onnx"), "-o", str(out),
            "--kv_cache_capacity", str(CAPACITY),
            "--signature", "prefill", f"input_ids:{BATCH},{PROMPT}",
            "--signature", "decode", f"input_ids:{BATCH},1", "-dms", "-n"]
    script = ("import sys\nfrom onnx2tf_alt.cli.main import main\n"
              f"code = main({args!r})\n"
              "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
              "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=cli_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    files = {"direct": out / "decoder_float32.tflite", "tf": tf_route / "decoder_float32.tflite"}
    rng = np.random.default_rng(5)
    for name in ("prefill", "decode"):
        runners = {k: Interpreter(model_path=str(f)).get_signature_runner(name)
                   for k, f in files.items()}
        details = runners["tf"].get_input_details()
        assert details.keys() == runners["direct"].get_input_details().keys()
        feeds = {k: (rng.integers(0, 2, d["shape"]) if d["dtype"] != np.float32 else
                     rng.normal(size=d["shape"])).astype(d["dtype"]) for k, d in details.items()}
        got, want = (runners[k](**feeds) for k in ("direct", "tf"))
        assert got.keys() == want.keys()
        for key in want:
            assert_close(got[key], want[key], 1e-5, f"{name} {key}")
    models = {k: unpack_model(f.read_bytes()) for k, f in files.items()}
    for name in ("prefill", "decode"):
        ops = {}
        for route_name, model in models.items():
            index = next(d.subgraphIndex for d in model.signatureDefs
                         if d.signatureKey.decode() == name)
            ops[route_name] = [op_name(model, op) for op in model.subgraphs[index].operators]
        assert len(ops["direct"]) <= len(ops["tf"]), (name, ops)
        assert ops["direct"].count("TRANSPOSE") <= ops["tf"].count("TRANSPOSE"), name
    weights = sum(len(i.raw_data) for i in onnx.load(str(tf_route.parent / "decoder.onnx"))
                  .graph.initializer)
    assert weights < files["direct"].stat().st_size < 1.1 * weights + 64 * 1024


def test_signature_shapes_that_leave_a_dim_open_are_refused(reference, tmp_path):
    from onnx2tf_alt import convert

    model, _, _ = reference
    source = str(tmp_path / "decoder.onnx")
    onnx.save(model, source)
    with pytest.raises(InputError, match="leave input dims open"):
        convert(source, output_folder_path=str(tmp_path / "out"),
                signatures=[["decode", "input_ids:1,1"]], non_verbose=True)
    with pytest.raises(InputError, match="cannot be combined with -oh5"):
        convert(source, output_folder_path=str(tmp_path / "out"), output_h5=True,
                signatures=[["decode", "input_ids:1,1"]], non_verbose=True)
    assert not (tmp_path / "out").exists()


def test_without_signatures_the_cache_makes_one_static_decode_step(reference, tmp_path):
    """--kv_cache_capacity alone, with -ois for the step's tokens: one serving_default whose
    every shape is static (the mask's `capacity + sequence` resolved), which computes the
    rewritten model's step in the saved_model and the .tflite."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt import convert

    model, _, _ = reference
    source = str(tmp_path / "decoder.onnx")
    onnx.save(model, source)
    convert(source, output_folder_path=str(tmp_path / "out"), kv_cache_capacity=CAPACITY,
            overwrite_input_shape=[f"input_ids:{BATCH},1"], non_verbose=True)
    rng = np.random.default_rng(4)
    start = 3
    mask = np.zeros((BATCH, CAPACITY + 1), np.int64)
    mask[:, :start] = mask[:, CAPACITY:] = 1
    feeds = {"input_ids": rng.integers(0, 512, (BATCH, 1)), "attention_mask": mask,
             "position_ids": np.full((BATCH, 1), start, np.int64),
             **{name: rng.normal(size=(BATCH, KV_HEADS, CAPACITY, HEAD)).astype(np.float32)
                for name in PAST}}
    rewritten, _ = fixed_capacity(_copy(model), CAPACITY)
    session = ort.InferenceSession(rewritten.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    layout = json.loads((tmp_path / "out" / "decoder_io_layout.json").read_text())
    names = {e["onnx_name"]: e["tflite_name"] for e in layout["inputs"] + layout["outputs"]}
    interpreter = Interpreter(model_path=str(tmp_path / "out" / "decoder_float32.tflite"))
    runner = interpreter.get_signature_runner()
    kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
    assert all(-1 not in d["shape_signature"] for d in runner.get_input_details().values())
    got = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()})
    for name, value in want.items():
        assert_close(got[names[name]], value, 1e-5, name)


def test_signature_specs_are_checked_before_anything_is_read(tmp_path):
    from onnx2tf_alt.generative.signatures import SignatureSpec, parse_signatures

    model = tmp_path / "encoder.onnx"
    model.write_bytes(b"")
    assert parse_signatures([["decode", "input_ids:1,1"], ["encode", str(model), "x:1,2"]]) == {
        "decode": SignatureSpec(("input_ids:1,1",)),
        "encode": SignatureSpec(("x:1,2",), str(model))}
    with pytest.raises(InputError, match="first word is the signature's name"):
        parse_signatures([["input_ids:1,1"]])
    with pytest.raises(InputError, match="given twice"):
        parse_signatures([["a", "x:1"], ["a", "x:2"]])
    with pytest.raises(InputError, match="is not a file"):
        parse_signatures([["a", str(tmp_path / "missing.onnx"), "x:1"]])


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
