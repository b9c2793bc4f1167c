"""The KV-cache rewrite is total or refused (issue 49): the forms exporters write around the
Concat of past and new entries are recognised (a TorchScript export that rebuilds the cache
from flat past inputs routes each past key through a one-input Concat), and a cache the
rewrite cannot pair ends the run with exit 1, naming it, instead of a file whose decode
steps compute wrong tokens."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.cli.main import main
from onnx2tf_alt.errors import UnsupportedFormError
from onnx2tf_alt.passes.kv_cache import fixed_capacity

from harness import assert_close
from kv_decoder import (
    BATCH,
    CAPACITY,
    HEAD,
    HEADS,
    KV_HEADS,
    LAYERS,
    NEW,
    PAST,
    POSITIONS,
    PROMPT,
    WIDTH,
    cached_steps,
    decoder_model,
    growing_steps,
)


def routed(model: onnx.ModelProto, kind: str, op: str) -> onnx.ModelProto:
    """`model` with each past `kind` read through `op` before its present Concat: "Concat"
    (one input, as TorchScript writes a rebuilt cache list), "Identity", or "Mul" (by 1: a
    form the rewrite cannot see through)."""
    graph = model.graph
    for layer in range(LAYERS):
        past = f"past.{layer}.{kind}"
        concat = next(n for n in graph.node if n.op_type == "Concat" and n.input[0] == past)
        routed_name = f"{past}/routed"
        inputs = [past, "one_f"] if op == "Mul" else [past]
        attrs = {"axis": 2} if op == "Concat" else {}
        graph.node.insert(list(graph.node).index(concat),
                          helper.make_node(op, inputs, [routed_name], **attrs))
        concat.input[0] = routed_name
    if op == "Mul":
        graph.initializer.append(numpy_helper.from_array(np.array(1, np.float32), "one_f"))
    return model


def decode_as_onnxruntime(model: onnx.ModelProto, reference: onnx.ModelProto | None = None,
                          extra: dict | None = None) -> None:
    """`model` with a fixed-capacity cache decodes, in onnxruntime, as `reference` (default
    `model`) with its past growing; `extra`: more inputs fed to every step of both."""
    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    session = ort.InferenceSession((reference or model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    tokens, logits = growing_steps(session, prompt, NEW, extra)
    rewritten, entries = fixed_capacity(model, CAPACITY)
    assert sorted(e.past for e in entries) == sorted(PAST)
    session = ort.InferenceSession(rewritten.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names, taken = [o.name for o in session.get_outputs()], {i.name for i in session.get_inputs()}
    got_tokens, got_logits = cached_steps(lambda _, feeds: dict(zip(names, session.run(
        None, {k: v for k, v in feeds.items() if k in taken}))), prompt, NEW, extra=extra)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


@pytest.mark.parametrize("kind, op", [("key", "Concat"), ("value", "Concat"),
                                      ("key", "Identity")])
def test_copies_between_the_past_and_its_concat_are_seen_through(kind, op):
    decode_as_onnxruntime(routed(decoder_model(), kind, op))


def test_copies_between_the_concat_and_the_present_are_seen_through():
    model = decoder_model()
    for node in model.graph.node:  # the present is a one-input Concat of the real one
        if node.op_type == "Concat" and node.output[0].startswith("present."):
            node.output[0] += "/all"
    for name in PAST:
        present = name.replace("past", "present")
        model.graph.node.append(helper.make_node("Concat", [present + "/all"], [present],
                                                 axis=0))
        for node in model.graph.node:  # the attention reads the full one, as before
            if node.op_type == "Unsqueeze" and node.input[0] == present:
                node.input[0] = present + "/all"
    decode_as_onnxruntime(model)


def test_a_present_the_rewrite_cannot_pair_is_refused_naming_it():
    with pytest.raises(UnsupportedFormError) as error:
        fixed_capacity(routed(decoder_model(), "key", "Mul"), CAPACITY)
    message = str(error.value)
    assert error.value.exit_code == 1
    assert message.splitlines()[1:] == [
        ("  - present output 'present.0.key' = Concat(Mul('past.0.key', 'one_f'), "
         "Transpose(Reshape(MatMul(…), 'split_kv'))), not Concat(past input, new entries) on "
         "axis 2 as 'present.0.value'"),
        ("  - present output 'present.1.key' = Concat(Mul('past.1.key', 'one_f'), "
         "Transpose(Reshape(MatMul(…), 'split_kv'))), not Concat(past input, new entries) on "
         "axis 2 as 'present.1.value'"),
        ("Export the decoder with each past concatenated to its new entries (as transformers / "
         "Optimum do), or drop --kv_cache_capacity (each step then takes and returns the whole "
         "cache).")], message
    for phrase in ("computes 2 of its caches", "every token after the first would be wrong"):
        assert phrase in message, message


def test_the_command_line_exits_1_before_building(tmp_path, capfd):
    source = tmp_path / "decoder.onnx"
    onnx.save(routed(decoder_model(), "value", "Mul"), source)
    out = tmp_path / "out"
    code = main(["-i", str(source), "-o", str(out), "--kv_cache_capacity", "16",
                 "--signature", "prefill", "input_ids:1,5", "--signature", "decode",
                 "input_ids:1,1", "-n"])
    message = capfd.readouterr().err
    assert code == 1, message
    assert "error: --kv_cache_capacity: the rewrite does not recognise" in message, message
    assert "  - present output 'present.0.value' = Concat(Mul('past.0.value'" in message, message
    assert not out.exists()


def positions_from_the_past(model: onnx.ModelProto, source: str,
                            how: str = "range") -> onnx.ModelProto:
    """The decoder without `position_ids`: its positions are Range(past, past + sequence),
    the past length read from the shape of `source` (a past input, or the attention mask
    less the sequence), as a GPT-2 export without position_ids computes them; `how`
    "cumsum": past + CumSum(ones) - 1 (M2M100's and NLLB's form); "shape": the last
    `sequence` of CumSum(ones over past + sequence) - 1, the length giving a shape."""
    graph = model.graph
    graph.input.remove(next(i for i in graph.input if i.name == "position_ids"))
    graph.initializer.extend([numpy_helper.from_array(np.array(2, np.int64), "two"),
                              numpy_helper.from_array(np.array([0], np.int64), "axis_0")])
    index = "two" if source.startswith("past") else "one"
    nodes = [helper.make_node("Shape", [source], ["source_shape"]),
             helper.make_node("Gather", ["source_shape", index], ["source_length"], axis=0)]
    if source.startswith("past"):
        nodes.append(helper.make_node("Identity", ["source_length"], ["first_position"]))
    else:
        nodes.append(helper.make_node("Sub", ["source_length", "sequence"], ["first_position"]))
    if how == "range":
        nodes += [helper.make_node("Add", ["first_position", "sequence"], ["end_position"]),
                  helper.make_node("Range", ["first_position", "end_position", "one"],
                                   ["steps"]),
                  helper.make_node("Unsqueeze", ["steps", "axis_0"], ["position_ids"])]
    elif how == "shape":
        graph.initializer.append(numpy_helper.from_array(np.array([1 << 30], np.int64), "end"))
        nodes += [helper.make_node("Add", ["first_position", "sequence"], ["end_position"]),
                  helper.make_node("Unsqueeze", ["end_position", "axis_0"], ["all_1d"]),
                  helper.make_node("ConstantOfShape", ["all_1d"], ["all_ones"],
                                   value=numpy_helper.from_array(np.array([1], np.int64))),
                  helper.make_node("CumSum", ["all_ones", "axis_0"], ["all_counted"]),
                  helper.make_node("Sub", ["all_counted", "one"], ["all_steps"]),
                  helper.make_node("Unsqueeze", ["first_position", "axis_0"], ["first_1d"]),
                  helper.make_node("Slice", ["all_steps", "first_1d", "end"], ["steps"]),
                  helper.make_node("Unsqueeze", ["steps", "axis_0"], ["position_ids"])]
    else:
        nodes += [helper.make_node("ConstantOfShape", ["ids_shape"], ["ones"],
                                   value=numpy_helper.from_array(np.array([1], np.int64))),
                  helper.make_node("CumSum", ["ones", "one"], ["counted"]),
                  helper.make_node("Sub", ["counted", "one"], ["steps"]),
                  helper.make_node("Add", ["steps", "first_position"], ["position_ids"])]
    return in_order(model, nodes)


def in_order(model: onnx.ModelProto, nodes: list) -> onnx.ModelProto:
    """`model` with `nodes` added, all in an order onnxruntime accepts: each node after its
    inputs' producers."""
    graph = model.graph
    ordered, known, todo = [], {i.name for i in graph.input} | {
        i.name for i in graph.initializer}, [*nodes, *graph.node]
    while todo:
        ready = [n for n in todo if all(not i or i in known for i in n.input)]
        ordered += ready
        known.update(o for n in ready for o in n.output)
        todo = [n for n in todo if n not in ready]
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def without_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder without an attention mask input, as Optimum's Whisper decoders are: its
    causal mask spans past + sequence positions, all attended (the past's length read from
    the shape of a past input)."""
    graph = model.graph
    graph.input.remove(next(i for i in graph.input if i.name == "attention_mask"))
    for node in graph.node:
        node.input[:] = ["all_filled" if i == "attention_mask" else i for i in node.input]
    graph.initializer.extend([numpy_helper.from_array(np.array([k], np.int64), f"at_{k}")
                              for k in (0, 2)])
    return in_order(model, [
        helper.make_node("Shape", ["past.0.key"], ["past_shape"]),
        helper.make_node("Gather", ["past_shape", "at_2"], ["past_count"], axis=0),
        helper.make_node("Slice", ["ids_shape", "axis_1", "at_2"], ["sequence_1d"]),
        helper.make_node("Add", ["past_count", "sequence_1d"], ["total_1d"]),
        helper.make_node("Slice", ["ids_shape", "at_0", "axis_1"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "total_1d"], ["filled_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["filled_shape"], ["all_filled"],
                         value=numpy_helper.from_array(np.array([1], np.int64)))])


@pytest.mark.parametrize("source", ["past.0.key", "attention_mask"])
def test_positions_from_the_past_length_are_shifted_to_the_filled_slots(source):
    """A GPT-2 export without position_ids: with a fixed-capacity cache the past's length is
    always the capacity; the positions are read from the mask's filled slots instead."""
    decode_as_onnxruntime(positions_from_the_past(decoder_model(), source))


def test_positions_from_the_past_length_as_a_value_are_shifted_to_the_filled_slots():
    """M2M100's and NLLB's positions: the past's length added to a CumSum, no Range."""
    decode_as_onnxruntime(positions_from_the_past(decoder_model(), "past.0.key", "cumsum"))


def test_positions_from_the_past_length_giving_a_shape_are_refused():
    model = positions_from_the_past(decoder_model(), "past.0.key", "shape")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prompt = np.random.default_rng(1).integers(0, 512, (1, PROMPT)).astype(np.int64)
    feeds = {"input_ids": prompt, "attention_mask": np.ones((1, PROMPT), np.int64),
             **{name: np.zeros((1, KV_HEADS, 0, HEAD), np.float32) for name in PAST}}
    session.run(None, feeds)  # a valid model: it runs as exported
    with pytest.raises(UnsupportedFormError) as error:
        fixed_capacity(model, CAPACITY)
    assert str(error.value).startswith(
        "--kv_cache_capacity: this decoder computes its positions from the length of its past: "
        "Gather 'placed' reads a value made from Shape('past.0.key'), not through a Range"
    ), str(error.value)


def test_a_decoder_without_mask_or_positions_gets_a_mask_and_filled_positions():
    """Optimum's Whisper decoder form: no attention mask, positions from the past's length.
    The rewritten decoder takes an attention_mask over capacity + sequence, and decodes as
    the original with its past growing."""
    model = positions_from_the_past(without_mask(decoder_model()), "past.0.key")
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)
    mask = next(i for i in model.graph.input if i.name == "attention_mask")
    assert [d.dim_value or d.dim_param for d in mask.type.tensor_type.shape.dim] == [
        "batch", f"{CAPACITY} + sequence"]


def merged(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as Optimum's decoder_model_merged.onnx: an If on a `use_cache_branch` input
    between the decoder with past (then) and one that reads no past (else: the new entries
    alone are the present; its attention sees only the step's tokens), its attention mask
    declared as long as the step (Optimum declares it so for both branches)."""
    graph = model.graph
    outer = {i.name for i in graph.input} | {i.name for i in graph.initializer}

    def branch(tag: str, past: bool) -> onnx.GraphProto:
        rename = {o: f"{o}/{tag}" for n in graph.node for o in n.output}
        nodes = []
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            if not past and node.op_type == "Concat" and node.input[0] in PAST:
                copy.op_type, copy.input[:] = "Identity", [node.input[1]]
                del copy.attribute[:]
            copy.input[:] = [rename.get(i, i) for i in copy.input]
            copy.output[:] = [rename[o] for o in copy.output]
            nodes.append(copy)
        if not past:  # the mask's length is the step's: no past positions
            for copy in nodes:
                if copy.op_type == "Sub" and copy.output[0] == "past_length/else":
                    copy.op_type, copy.input[:] = "Sub", ["sequence/else", "sequence/else"]
        outputs = [helper.make_tensor_value_info(rename[o.name], o.type.tensor_type.elem_type,
                                                 None) for o in graph.output]
        return helper.make_graph(nodes, tag, [], outputs)

    assert not outer & {"use_cache_branch"}
    node = helper.make_node("If", ["use_cache_branch"], [o.name for o in graph.output],
                            then_branch=branch("then", True), else_branch=branch("else", False))
    del graph.node[:]
    graph.node.append(node)
    graph.input.append(helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL,
                                                     [1]))
    mask = next(i for i in graph.input if i.name == "attention_mask")
    mask.type.tensor_type.shape.dim[1].dim_param = "sequence"  # as Optimum declares it
    return model


def test_a_merged_decoder_converts_as_its_branch_with_past():
    model = merged(decoder_model())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    first = {"input_ids": prompt, "attention_mask": np.ones((BATCH, PROMPT), np.int64),
             "position_ids": np.tile(np.arange(PROMPT), (BATCH, 1)),
             **{name: np.zeros((BATCH, KV_HEADS, 0, HEAD), np.float32) for name in PAST}}
    branches = [session.run(None, {**first, "use_cache_branch": np.array([flag])})
                for flag in (True, False)]
    for a, b in zip(*branches):  # the two branches agree on a first step, as Optimum's do
        assert_close(a, b, 1e-5, "branches")
    decode_as_onnxruntime(model, decoder_model())
    assert "use_cache_branch" not in {i.name for i in model.graph.input}


def test_a_merged_decoder_converts_to_prefill_and_decode_signatures(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    source = tmp_path / "merged.onnx"
    onnx.save(merged(decoder_model()), source)
    out = tmp_path / "out"
    code = main(["-i", str(source), "-o", str(out), "-dms", "-n", "--kv_cache_capacity",
                 str(CAPACITY), "--signature", "prefill", f"input_ids:{BATCH},{PROMPT}",
                 "--signature", "decode", f"input_ids:{BATCH},1"])
    assert code == 0
    interpreter = Interpreter(model_path=str(out / "merged_float32.tflite"))
    layout = json.loads((out / "merged_io_layout.json").read_text())["signatures"]

    def run(name, feeds):
        runner, entries = interpreter.get_signature_runner(name), layout[name]
        assert "use_cache_branch" not in {e["onnx_name"] for e in entries["inputs"]}
        kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
        names = {e["onnx_name"]: e["tflite_name"] for e in entries["inputs"]}
        got = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()})
        return {e["onnx_name"]: got[e["tflite_name"]] for e in entries["outputs"]}

    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    session = ort.InferenceSession(decoder_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    tokens, logits = growing_steps(session, prompt, NEW)
    got_tokens, got_logits = cached_steps(run, prompt, NEW)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


def without_past(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as Optimum's decoder_model.onnx beside decoder_with_past_model.onnx: no past
    inputs, each present the step's new entries, the mask over the step's tokens."""
    graph = model.graph
    for node in graph.node:
        if node.op_type == "Concat" and node.input[0] in PAST:
            node.op_type, node.input[:] = "Identity", [node.input[1]]
            del node.attribute[:]
    for value in [v for v in graph.input if v.name in PAST]:
        graph.input.remove(value)
    for value in [*graph.output, next(i for i in graph.input if i.name == "attention_mask")]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 1 and "past" in dims[-2 if len(dims) == 4 else 1].dim_param:
            dims[-2 if len(dims) == 4 else 1].dim_param = "sequence"
    onnx.checker.check_model(model)
    return model


def with_cross_cache(first: onnx.ModelProto, past: onnx.ModelProto) -> None:
    """The pair given a cross-attention cache as Whisper's has: `first` computes
    `present.0.cross` [batch, kv_heads, frames, head] from `encoder_hidden_states`, and
    `past` takes it back as `past.0.cross` (its mean added to the logits: zero for the
    zero encoder states the test feeds). Modifies both."""
    graph = first.graph
    graph.input.append(helper.make_tensor_value_info(
        "encoder_hidden_states", onnx.TensorProto.FLOAT, ["batch", "frames", WIDTH]))
    graph.initializer.append(numpy_helper.from_array(
        np.random.default_rng(3).normal(size=(WIDTH, KV_HEADS * HEAD)).astype(np.float32),
        "cross_w"))
    graph.node.extend([
        helper.make_node("MatMul", ["encoder_hidden_states", "cross_w"], ["cross_flat"]),
        helper.make_node("Reshape", ["cross_flat", "split_kv"], ["cross_heads"]),
        helper.make_node("Transpose", ["cross_heads"], ["present.0.cross"], perm=[0, 2, 1, 3])])
    cross_shape = ["batch", KV_HEADS, "frames", HEAD]
    graph.output.append(helper.make_tensor_value_info("present.0.cross", onnx.TensorProto.FLOAT,
                                                      cross_shape))
    graph = past.graph
    graph.input.append(helper.make_tensor_value_info("past.0.cross", onnx.TensorProto.FLOAT,
                                                     cross_shape))
    final = next(n for n in graph.node if "logits" in n.output)
    final.output[0] = "logits_alone"
    graph.node.extend([
        helper.make_node("ReduceMean", ["past.0.cross"], ["cross_mean"], keepdims=0),
        helper.make_node("Add", ["logits_alone", "cross_mean"], ["logits"])])


@pytest.mark.parametrize("form", ["mask and positions", "Whisper's: neither"])
def test_optimums_pair_is_one_file_with_prefill_and_decode(tmp_path, form):
    """decoder_model.onnx for prefill (no cache: its presents are the prompt's entries, its
    mask spans the prompt) and decoder_with_past_model.onnx for decode over the cache: one
    .tflite, the weights once, onnxruntime's tokens. Optimum's Whisper decoders take no
    mask, place tokens by the past's length (the decode signature gets a mask) and take
    back the cross-attention cache prefill returns (decode takes its shape)."""
    from ai_edge_litert.interpreter import Interpreter

    whisper = form != "mask and positions"
    first, past = tmp_path / "decoder_model.onnx", tmp_path / "decoder_with_past_model.onnx"
    first_model = without_past(decoder_model())
    past_model = positions_from_the_past(without_mask(decoder_model()), "past.0.key"
                                         ) if whisper else decoder_model()
    if whisper:
        with_cross_cache(first_model, past_model)
    onnx.save(first_model, first)
    onnx.save(past_model, past)
    out = tmp_path / "out"
    frames = [f"encoder_hidden_states:{BATCH},7,{WIDTH}"] if whisper else []
    assert main(["-i", str(past), "-o", str(out), "-dms", "-n", "--kv_cache_capacity",
                 str(CAPACITY), "--signature", "prefill", str(first), f"input_ids:{BATCH},{PROMPT}",
                 *frames, "--signature", "decode", f"input_ids:{BATCH},1"]) == 0
    path = out / "decoder_with_past_model_float32.tflite"
    weights = sum(len(i.raw_data) for i in decoder_model().graph.initializer)
    assert weights < path.stat().st_size < 1.1 * weights + 64 * 1024  # one copy
    interpreter = Interpreter(model_path=str(path))
    layout = json.loads((out / "decoder_with_past_model_io_layout.json").read_text())
    assert layout["signatures"]["prefill"]["kv_cache"] == []

    def run(name, feeds):
        runner, entries = interpreter.get_signature_runner(name), layout["signatures"][name]
        kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
        names = {e["onnx_name"]: e["tflite_name"] for e in entries["inputs"]}
        got = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()
                        if k in names})
        return {e["onnx_name"]: got[e["tflite_name"]] for e in entries["outputs"]}

    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    session = ort.InferenceSession(decoder_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    tokens, logits = growing_steps(session, prompt, NEW)
    out = run("prefill", {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
                          "position_ids": np.tile(np.arange(PROMPT), (BATCH, 1)),
                          "encoder_hidden_states": np.zeros((BATCH, 7, WIDTH), np.float32)})
    cache = {name: np.zeros((BATCH, KV_HEADS, CAPACITY, HEAD), np.float32) for name in PAST}
    if whisper:
        cache["past.0.cross"] = out["present.0.cross"]
        decode = {e["onnx_name"]: e["onnx_shape"] for e in layout["signatures"]["decode"]["inputs"]}
        assert decode["past.0.cross"] == [BATCH, KV_HEADS, 7, HEAD]
    got_logits, got_tokens = [out["logits"][:, -1]], []
    for step in range(NEW - 1):
        start = PROMPT + step
        for name in PAST:
            new = out[name.replace("past", "present")]
            cache[name][:, :, start - new.shape[2]:start] = new
        ids = got_logits[-1].argmax(-1)[:, None].astype(np.int64)
        got_tokens.append(ids[:, 0])
        mask = np.zeros((BATCH, CAPACITY + 1), np.int64)
        mask[:, :start], mask[:, CAPACITY:] = 1, 1
        out = run("decode", {"input_ids": ids, "attention_mask": mask,
                             "position_ids": np.full((BATCH, 1), start), **cache})
        got_logits.append(out["logits"][:, -1])
    got_tokens.append(got_logits[-1].argmax(-1))
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


def transposed_keys(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its key caches stored transposed, [batch, kv_heads, head, positions], and
    concatenated on axis 3 (attention then reads them as K^T without a Transpose)."""
    graph = model.graph
    for value in [*graph.input, *graph.output]:
        if value.name.endswith(".key"):
            dims = value.type.tensor_type.shape.dim
            head, length = onnx.TensorShapeProto.Dimension(), onnx.TensorShapeProto.Dimension()
            head.CopyFrom(dims[3])
            length.CopyFrom(dims[2])
            dims[2].CopyFrom(head)
            dims[3].CopyFrom(length)
    at = {}
    for layer in range(LAYERS):
        concat = next(n for n in graph.node if n.op_type == "Concat"
                      and n.input[0] == f"past.{layer}.key")
        new = concat.input[1]
        at[f"{new}/t"] = helper.make_node("Transpose", [new], [f"{new}/t"], perm=[0, 1, 3, 2])
        concat.input[1] = f"{new}/t"
        concat.attribute[0].i = 3
        for node in graph.node:
            if node.op_type == "Reshape" and node.input[0] == f"l{layer}_key_repeated":
                node.input[1] = "all_heads_t"
            if node.op_type == "Transpose" and node.output[0] == f"l{layer}_kt":
                node.op_type = "Identity"
                del node.attribute[:]
    for node in at.values():
        index = next(k for k, n in enumerate(graph.node) if node.output[0] in n.input)
        graph.node.insert(index, node)
    graph.initializer.append(numpy_helper.from_array(np.array([0, HEADS, HEAD, -1], np.int64),
                                                     "all_heads_t"))
    return model


def test_key_caches_stored_transposed_are_rewritten_on_their_own_axis():
    model = transposed_keys(decoder_model())
    prompt = np.random.default_rng(1).integers(0, 512, (BATCH, PROMPT)).astype(np.int64)
    reference = ort.InferenceSession(decoder_model().SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    tokens, logits = growing_steps(reference, prompt, NEW)
    rewritten, entries = fixed_capacity(model, CAPACITY)
    axes = {e.past: e.axis for e in entries}
    assert axes == {name: 3 if name.endswith("key") else 2 for name in PAST}
    session = ort.InferenceSession(rewritten.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    cache = {name: np.zeros((BATCH, KV_HEADS, HEAD, CAPACITY) if axes[name] == 3
                            else (BATCH, KV_HEADS, CAPACITY, HEAD), np.float32) for name in PAST}
    ids, start, got_logits = prompt, 0, []
    for _ in range(NEW):
        length = ids.shape[1]
        mask = np.zeros((BATCH, CAPACITY + length), np.int64)
        mask[:, :start], mask[:, CAPACITY:] = 1, 1
        out = dict(zip(names, session.run(None, {
            "input_ids": ids, "attention_mask": mask,
            "position_ids": np.tile(np.arange(start, start + length), (BATCH, 1)), **cache})))
        for name in PAST:  # each cache written on its own axis
            index = [slice(None)] * 4
            index[axes[name]] = slice(start, start + length)
            cache[name][tuple(index)] = out[name.replace("past", "present")]
        got_logits.append(out["logits"][:, -1])
        ids, start = got_logits[-1].argmax(-1)[:, None].astype(np.int64), start + length
    np.testing.assert_array_equal(np.array([g.argmax(-1) for g in got_logits]),
                                  np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


def test_a_decoder_without_a_mask_or_a_softmax_over_its_keys_is_refused():
    """No mask, and no Softmax to add one to (a fused attention op would be the same): the
    cache's empty slots could not be kept out of attention."""
    model = without_mask(decoder_model())
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.op_type = "LogSoftmax"
    with pytest.raises(UnsupportedFormError, match="no Softmax over its keys was found"):
        fixed_capacity(model, CAPACITY)


FRAMES = 7  # an encoder's positions


def with_encoder_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` given an `encoder_attention_mask` [batch, frames] input, as T5's and BART's
    decoders take it (over the encoder's positions, for their cross-attention; here its
    mean times 0 is added to the logits: read, but changing nothing)."""
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info(
        "encoder_attention_mask", onnx.TensorProto.INT64, ["batch", "encoder_sequence"]))
    graph.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "nothing"))
    final = next(n for n in graph.node if "logits" in n.output)
    final.output[0] = "logits_alone"
    graph.node.extend([
        helper.make_node("Cast", ["encoder_attention_mask"], ["encoder_filled"],
                         to=onnx.TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["encoder_filled"], ["encoder_mean"], keepdims=0),
        helper.make_node("Mul", ["encoder_mean", "nothing"], ["encoder_nothing"]),
        helper.make_node("Add", ["logits_alone", "encoder_nothing"], ["logits"])])
    return model


ENCODER_MASK = {"encoder_attention_mask": np.ones((BATCH, FRAMES), np.int64)}


def test_an_encoders_mask_is_not_taken_for_the_decoders():
    """Optimum's T5 and BART decoders take no mask of their own, only the encoder's: the
    rewrite adds the decoder's mask over the cache and counts the filled slots in it, not
    in `encoder_attention_mask` (taken for it before: exit 0, wrong logits)."""
    model = with_encoder_mask(positions_from_the_past(without_mask(decoder_model()),
                                                      "past.0.key"))
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference, ENCODER_MASK)
    masks = [i.name for i in model.graph.input if "mask" in i.name]
    assert masks == ["encoder_attention_mask", "attention_mask"], masks


def with_relative_bias(model: onnx.ModelProto, buckets: int = 6,
                       form: str = "optimum") -> onnx.ModelProto:
    """`model` with a bias on each layer's scores from the distance of key to query, looked
    up in a table [buckets, heads], as T5's decoder computes it. `form` "optimum"
    (transformers 4): the keys' positions are Range(0, the present key's length), the
    queries' Range(past, past + sequence); "transformers5": the keys' Range(0, past +
    sequence), the queries' Range(0, sequence) + past, the past's length read as
    torch.export reads it, Shape(past, start=2, end=3)."""
    graph = model.graph
    table = np.random.default_rng(5).normal(0, 2, (buckets, HEADS)).astype(np.float32)
    graph.initializer.extend([
        numpy_helper.from_array(table, "relative_table"),
        numpy_helper.from_array(np.array(2, np.int64), "at_two"),
        numpy_helper.from_array(np.array(0, np.int64), "no_distance"),
        numpy_helper.from_array(np.array(buckets - 1, np.int64), "last_bucket"),
        numpy_helper.from_array(np.array([2, 0, 1], np.int64), "heads_first")])
    if form == "optimum":
        nodes = [
            helper.make_node("Shape", ["present.0.key"], ["keys_shape"]),
            helper.make_node("Gather", ["keys_shape", "at_two"], ["keys_length"], axis=0),
            helper.make_node("Range", ["zero", "keys_length", "one"], ["key_positions"]),
            helper.make_node("Shape", ["past.0.key"], ["past_shape_rel"]),
            helper.make_node("Gather", ["past_shape_rel", "at_two"], ["past_length_rel"],
                             axis=0),
            helper.make_node("Add", ["past_length_rel", "sequence"], ["query_end"]),
            helper.make_node("Range", ["past_length_rel", "query_end", "one"],
                             ["query_positions"])]
    else:
        graph.initializer.append(numpy_helper.from_array(np.array([], np.int64), "to_scalar"))
        nodes = [
            helper.make_node("Shape", ["past.0.key"], ["past_1d"], start=2, end=3),
            helper.make_node("Reshape", ["past_1d", "to_scalar"], ["past_length_rel"]),
            helper.make_node("Add", ["past_length_rel", "sequence"], ["keys_length"]),
            helper.make_node("Range", ["zero", "keys_length", "one"], ["key_positions"]),
            helper.make_node("Range", ["zero", "sequence", "one"], ["query_index_rel"]),
            helper.make_node("Add", ["query_index_rel", "past_length_rel"],
                             ["query_positions"])]
    nodes += [
        helper.make_node("Unsqueeze", ["query_positions", "axis_1"], ["query_rows"]),
        helper.make_node("Sub", ["key_positions", "query_rows"], ["distance"]),
        helper.make_node("Min", ["distance", "no_distance"], ["back"]),
        helper.make_node("Neg", ["back"], ["behind"]),
        helper.make_node("Min", ["behind", "last_bucket"], ["bucket"]),
        helper.make_node("Gather", ["relative_table", "bucket"], ["relative_qkh"]),
        helper.make_node("Transpose", ["relative_qkh"], ["relative_hqk"], perm=[2, 0, 1]),
        helper.make_node("Unsqueeze", ["relative_hqk", "axis_0_rel"], ["relative_bias"])]
    graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "axis_0_rel"))
    for layer in range(LAYERS):
        add = next(n for n in graph.node if n.output[0] == f"l{layer}_kept")
        add.input[1] = f"l{layer}_biased"
        nodes.append(helper.make_node("Add", ["mask_bias", "relative_bias"],
                                      [f"l{layer}_biased"]))
    return in_order(model, nodes)


@pytest.mark.parametrize("form", ["optimum", "transformers5"])
def test_key_positions_counted_to_the_keys_length_follow_the_filled_slots(form):
    """T5's relative attention bias: key k at position k for the cache's slots, the step's
    keys (after the capacity) at the filled slots; before, the step's own key stood at the
    capacity, a wrong distance from every query (exit 0, wrong logits). transformers 5's
    T5 adds the past's length to Range(0, sequence) as a value (exit 0, wrong logits
    before)."""
    model = with_relative_bias(decoder_model(), form=form)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)


def test_t5s_form_an_encoder_mask_and_a_relative_bias():
    model = with_relative_bias(with_encoder_mask(positions_from_the_past(
        without_mask(decoder_model()), "past.0.key")))
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference, ENCODER_MASK)


def with_cross_placeholder(model: onnx.ModelProto) -> onnx.ModelProto:
    """A merged decoder (`merged`) given a cross-attention cache as Optimum's merged T5, BART
    and Whisper decoders have it: `past.0.cross` in; `present.0.cross` out, an empty
    [0, heads, 1, head] constant in the branch with past (the step does not change it)."""
    graph = model.graph
    shape = ["batch", KV_HEADS, "encoder_sequence", HEAD]
    graph.input.append(helper.make_tensor_value_info("past.0.cross", onnx.TensorProto.FLOAT,
                                                     shape))
    graph.output.append(helper.make_tensor_value_info("present.0.cross",
                                                      onnx.TensorProto.FLOAT, None))
    node = graph.node[0]
    node.output.append("present.0.cross")
    for attribute in node.attribute:
        branch = attribute.g
        if attribute.name == "then_branch":
            branch.node.append(helper.make_node(
                "Constant", [], ["present.0.cross/then"], value=numpy_helper.from_array(
                    np.zeros((0, KV_HEADS, 1, HEAD), np.float32))))
        else:
            branch.node.append(helper.make_node("Identity", ["past.0.cross"],
                                                ["present.0.cross/else"]))
        branch.output.append(helper.make_tensor_value_info(
            f"present.0.cross/{attribute.name[:4]}", onnx.TensorProto.FLOAT, None))
    return model


def test_a_merged_decoders_placeholder_outputs_are_dropped():
    """Optimum's merged encoder-decoders (T5, BART, Whisper) return each cross-attention cache
    as an empty constant in the branch with past: not a cache to fix (refused before: 'not
    Concat(past input, new entries)'), and not an output of the decode step."""
    model = with_cross_placeholder(merged(decoder_model()))
    cross = {"past.0.cross": np.zeros((BATCH, KV_HEADS, FRAMES, HEAD), np.float32)}
    decode_as_onnxruntime(model, decoder_model(), cross)
    assert "present.0.cross" not in {o.name for o in model.graph.output}


def test_a_mask_of_its_own_symbol_spans_the_cache():
    """torch.export has no Dim for past + sequence: the mask's length is a symbol of its own
    (`s41`), which nothing else gives; it spans the cache and the step like any mask."""
    model = decoder_model()
    mask = next(i for i in model.graph.input if i.name == "attention_mask")
    mask.type.tensor_type.shape.dim[1].dim_param = "s41"
    decode_as_onnxruntime(model, decoder_model())
    mask = next(i for i in model.graph.input if i.name == "attention_mask")
    assert mask.type.tensor_type.shape.dim[1].dim_param == f"{CAPACITY} + sequence"


def test_a_length_of_another_axis_is_refused():
    """The batch read where the past's length is expected: nothing to move; refused."""
    model = positions_from_the_past(decoder_model(), "past.0.key", "cumsum")
    gather = next(n for n in model.graph.node if n.output[0] == "source_length")
    gather.input[1] = "zero"  # Shape(past)[0]
    with pytest.raises(UnsupportedFormError, match="computes its positions from the length"):
        fixed_capacity(model, CAPACITY)


def cast_back(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each present key a Cast of its Concat to the type it has, as GPT-J's and
    CodeGen's exports write it (keys computed in float32, cast back to the model's type)."""
    graph = model.graph
    for layer in range(LAYERS):
        present = f"present.{layer}.key"
        concat = next(n for n in graph.node if n.output[0] == present)
        concat.output[0] = f"{present}/joined"
        graph.node.insert(list(graph.node).index(concat) + 1, helper.make_node(
            "Cast", [f"{present}/joined"], [present], to=onnx.TensorProto.FLOAT))
    return model


def test_a_present_cast_to_its_own_type_is_a_cache():
    """Refused before ('Cast(Concat(...)), not Concat(past input, new entries)')."""
    decode_as_onnxruntime(cast_back(decoder_model()), decoder_model())


def with_window(model: onnx.ModelProto, window: int = 3) -> onnx.ModelProto:
    """`model` attending to the last `window` positions only (a sliding window, as
    transformers' Mistral builds it: key position > query position - window beside the
    causal key position <= query position)."""
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array(window, np.int64), "window"))
    causal = next(n for n in graph.node if n.output[0] == "causal")
    causal.output[0] = "causal_alone"
    return in_order(model, [
        helper.make_node("Sub", ["query_column", "window"], ["window_start"]),
        helper.make_node("Greater", ["key_at", "window_start"], ["in_window"]),
        helper.make_node("And", ["causal_alone", "in_window"], ["causal"])])


def test_a_sliding_window_compares_the_moved_positions():
    """Optimum's Mistral with sliding_window: the window's comparison of key and query
    positions read the capacity's positions, so every filled slot fell outside the window
    (exit 0, 1/32 tokens); they are the filled slots' positions now."""
    model = with_window(decoder_model())
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)


def with_linear_bias(model: onnx.ModelProto, slope: float = 0.5) -> onnx.ModelProto:
    """`model` with slope * (key position - query position) added to each layer's scores
    (a linear distance bias, as ALiBi is; made from the mask's Ranges, no table): a form the
    rewrite does not move."""
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array(slope, np.float32), "slope"))
    nodes = [helper.make_node("Sub", ["key_at", "query_column"], ["distance_lin"]),
             helper.make_node("Cast", ["distance_lin"], ["distance_f"],
                              to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["distance_f", "slope"], ["linear_bias"])]
    for layer in range(LAYERS):
        add = next(n for n in graph.node if n.output[0] == f"l{layer}_kept")
        add.input[1] = f"l{layer}_linear"
        nodes.append(helper.make_node("Add", ["mask_bias", "linear_bias"], [f"l{layer}_linear"]))
    return in_order(model, nodes)


def with_alibi(model: onnx.ModelProto, form: str = "table") -> onnx.ModelProto:
    """`model` with an ALiBi bias on each layer's scores, as MPT's export computes it: a
    constant [heads, 1, POSITIONS] table of slope * (j - (POSITIONS - 1)) whose last `keys`
    entries are taken, keys read from the present key's Shape (Slice(table, POSITIONS -
    keys, INT64_MAX, axis 2)). `form` "values": the table as an initializer, the Slice with
    its steps."""
    graph = model.graph
    slopes = 2.0 ** -np.arange(1, HEADS + 1)
    table = (slopes[:, None, None] * (np.arange(POSITIONS) - (POSITIONS - 1))
             ).astype(np.float32)
    if form == "values":
        graph.initializer.append(numpy_helper.from_array(table, "alibi_table"))
        nodes = []
    else:
        nodes = [helper.make_node("Constant", [], ["alibi_table"],
                                  value=numpy_helper.from_array(table))]
    graph.initializer.extend([
        numpy_helper.from_array(np.array(POSITIONS, np.int64), "alibi_positions"),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), "alibi_end"),
        numpy_helper.from_array(np.array([0], np.int64), "alibi_at_0")])
    for layer in range(LAYERS):
        p = f"l{layer}_alibi"
        nodes += [
            helper.make_node("Shape", [f"present.{layer}.key"], [p + "_shape"]),
            helper.make_node("Gather", [p + "_shape", "axis_2"], [p + "_keys"], axis=0),
            helper.make_node("Squeeze", [p + "_keys", "alibi_at_0"], [p + "_count"]),
            helper.make_node("Sub", ["alibi_positions", p + "_count"], [p + "_start_0"]),
            helper.make_node("Unsqueeze", [p + "_start_0", "alibi_at_0"], [p + "_start"]),
            helper.make_node("Slice", ["alibi_table", p + "_start", "alibi_end", "axis_2"]
                             + (["one_step"] if form == "values" else []), [p]),
            helper.make_node("Add", ["mask_bias", p], [p + "_biased"]),
        ]
        add = next(n for n in graph.node if n.output[0] == f"l{layer}_kept")
        add.input[1] = p + "_biased"
    if form == "values":
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "one_step"))
    return in_order(model, nodes)


def with_local_table(model: onnx.ModelProto, window: int = 3) -> onnx.ModelProto:
    """`model` attending to the last `window` positions, as GPT-Neo's local layers read it:
    a constant [1, 1, POSITIONS, POSITIONS] table of key <= query < key + window, its rows
    [keys - queries, keys) and columns [0, keys) taken by two Slices, keys read as
    Slice(Shape(Cast(present key)), -2, -1) and queries from the ids' Shape."""
    graph = model.graph
    rows, columns = np.indices((POSITIONS, POSITIONS))
    table = ((columns <= rows) & (rows - columns < window))[None, None]
    graph.initializer.extend([
        numpy_helper.from_array(table, "local_table"),
        numpy_helper.from_array(np.array([-2], np.int64), "at_minus_2"),
        numpy_helper.from_array(np.array([-1], np.int64), "at_minus_1"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_1d"),
        numpy_helper.from_array(np.array([3], np.int64), "axis_3")])
    causal = next(n for n in graph.node if n.output[0] == "causal")
    causal.output[0] = "causal_alone"
    return in_order(model, [
        helper.make_node("Cast", ["present.0.key"], ["keys_cast"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Shape", ["keys_cast"], ["keys_shape_local"]),
        helper.make_node("Slice", ["keys_shape_local", "at_minus_2", "at_minus_1"],
                         ["keys_1d"]),
        helper.make_node("Unsqueeze", ["sequence", "zero_1d"], ["queries_1d"]),
        helper.make_node("Sub", ["keys_1d", "queries_1d"], ["first_row"]),
        helper.make_node("Slice", ["local_table", "first_row", "keys_1d", "axis_2"],
                         ["table_rows"]),
        helper.make_node("Slice", ["table_rows", "zero_1d", "keys_1d", "axis_3"],
                         ["in_window"]),
        helper.make_node("And", ["causal_alone", "in_window"], ["causal"])])


def test_a_local_table_sliced_by_the_keys_length_reads_each_querys_and_keys_entry():
    """GPT-Neo's local attention: rows [keys - queries, keys) and columns [0, keys) of a
    constant window table. With a fixed-capacity cache those are the capacity's rows and
    slots (Optimum's GPT-Neo: refused by the check); now the rows start from the filled
    slots and a Gather reads each slot's column."""
    model = with_local_table(decoder_model())
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)


@pytest.mark.parametrize("form", ["table", "values"])
def test_an_alibi_table_sliced_by_the_keys_length_reads_each_keys_entry(form):
    """MPT's ALiBi: the last `keys` entries of a constant table, one per key. With a
    fixed-capacity cache the keys are capacity + sequence, so every filled slot read the
    entry of a key further back (Optimum's MPT: exit 0 and 4 of 32 tokens, then refused by
    the check); now a Gather reads each filled slot's entry and each step key's after them."""
    model = with_alibi(decoder_model(), form)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)


def with_window_cuts(model: onnx.ModelProto, keep: int) -> onnx.ModelProto:
    """`model` with each cache kept as transformers 5's DynamicSlidingWindowLayer keeps it
    (a TorchScript export): the past's last `keep` positions concatenated to the new
    entries, and the present the last `keep` of those, each cut by Slice(-keep, INT64_MAX)
    on the sequence axis."""
    graph = model.graph
    graph.initializer.extend([
        numpy_helper.from_array(np.array([-keep], np.int64), "keep_from"),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), "keep_to"),
        numpy_helper.from_array(np.array([2], np.int64), "sequence_axis")])
    nodes = []
    for name in PAST:
        concat = next(n for n in graph.node if n.input and n.input[0] == name
                      and n.op_type == "Concat")
        present = concat.output[0]
        concat.input[0], concat.output[0] = f"{name}/kept", f"{present}/all"
        readers = [n for n in graph.node if present in n.input]
        for reader in readers:  # attention reads the whole concatenation, as transformers 5's
            reader.input[:] = [f"{present}/all" if i == present else i for i in reader.input]
        nodes += [helper.make_node("Slice", [name, "keep_from", "keep_to", "sequence_axis"],
                                   [f"{name}/kept"]),
                  helper.make_node("Slice", [f"{present}/all", "keep_from", "keep_to",
                                             "sequence_axis"], [present])]
    return in_order(model, nodes)


def test_a_sliding_layers_cache_as_transformers_5_keeps_it_is_the_cache():
    """transformers 5's DynamicCache(config=) keeps a sliding-window layer's last W - 1
    positions (Mistral's configs have a window: a TorchScript export of Mistral was "no KV
    cache to fix", exit 2). With a capacity of at most W - 1 both cuts take everything:
    the cache converts and decodes as onnxruntime runs the original."""
    model = with_window_cuts(decoder_model(), CAPACITY)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    decode_as_onnxruntime(model, reference)


def test_a_capacity_past_a_sliding_layers_window_is_refused():
    """A capacity of more than the W - 1 positions a sliding layer's cache keeps would need
    the cache to slide: refused, naming the output, the window and the capacity to use."""
    with pytest.raises(UnsupportedFormError,
                       match=r"present output 'present\.0\.key' keeps only the last 8 "
                             r"positions .* Use --kv_cache_capacity 8 or less"):
        fixed_capacity(with_window_cuts(decoder_model(), 8), CAPACITY)


def test_a_rewrite_that_does_not_compute_the_original_is_refused():
    """passes/kv_check.py runs the original (past growing) and the rewritten decoder on the
    same prompt and next token in onnxruntime: a form the rewrite recognises only in part
    (here a distance bias it does not move) ends the conversion, naming the step."""
    model = with_linear_bias(decoder_model())
    with pytest.raises(UnsupportedFormError) as error:
        fixed_capacity(model, CAPACITY)
    assert str(error.value).startswith(
        "--kv_cache_capacity: the rewritten decoder does not compute the original's logits: "
        "run in onnxruntime on the same 3-token prompt, the "), str(error.value)


def test_the_check_runs_on_weights_kept_on_disk_whatever_their_size(tmp_path, monkeypatch):
    """A decoder whose weights stay on disk (external data, as every large decoder's do) is
    checked, whatever their size where the memory holds them (here counted as 5 GB of 16):
    onnxruntime reads them where they are. The check once stopped at 1 GB of weights, so a
    real LLM's rewrite was never run."""
    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.passes import kv_check

    monkeypatch.setattr(kv_check, "initializer_bytes", lambda model: 5 << 30)
    monkeypatch.setattr(kv_check, "_available_bytes", lambda: 16 << 30)
    source = tmp_path / "decoder.onnx"
    onnx.save(with_linear_bias(decoder_model()), source, save_as_external_data=True,
              location="decoder.data", size_threshold=0)
    model = load_model(source)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    with pytest.raises(UnsupportedFormError, match="does not compute the original's logits"):
        fixed_capacity(model, CAPACITY)


def test_a_check_that_cannot_run_says_so(monkeypatch, caplog):
    """Where the weights and caches do not fit in the memory available, the check is not
    run, and the run says so at -v info (it would read the weights from disk at every step)."""
    from onnx2tf_alt.passes import kv_check

    monkeypatch.setattr(kv_check, "_available_bytes", lambda: 1 << 10)
    with caplog.at_level("INFO", logger="onnx2tf_alt"):
        fixed_capacity(with_linear_bias(decoder_model()), CAPACITY)
    assert ("--kv_cache_capacity: the rewritten decoder is not run against the original"
            in caplog.text), caplog.text
    assert "of memory available" in caplog.text


def test_positions_counted_in_a_mask_that_is_not_a_2d_count_are_refused():
    """The filled slots replace the past's length only where a [batch, past + sequence]
    mask of ones and zeros counts them; a float mask (an additive bias of 0 and -inf, 2-D or
    4-D) would be counted wrong: refused, naming it."""
    model = positions_from_the_past(decoder_model(), "past.0.key")
    mask = next(i for i in model.graph.input if i.name == "attention_mask")
    mask.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    with pytest.raises(UnsupportedFormError, match="its mask 'attention_mask' is 2-D float"):
        fixed_capacity(model, CAPACITY)


FORMS = {
    "T5's (an encoder's mask, a relative bias)": lambda: with_relative_bias(with_encoder_mask(
        positions_from_the_past(without_mask(decoder_model()), "past.0.key"))),
    "transformers 5's T5 bias": lambda: with_relative_bias(decoder_model(),
                                                           form="transformers5"),
    "a sliding window": lambda: with_window(decoder_model()),
    "M2M100's positions": lambda: positions_from_the_past(decoder_model(), "past.0.key",
                                                          "cumsum"),
    "MPT's ALiBi": lambda: with_alibi(decoder_model()),
    "GPT-Neo's local table": lambda: with_local_table(decoder_model()),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_the_moved_positions_convert_as_onnxruntime_runs_them(form, tmp_path):
    """One static decode step (`--kv_cache_capacity` with -ois) of each form this stop's
    rewrite moves, written by the direct writer, on a partly filled cache: the TFLite file
    computes what onnxruntime computes on the rewritten model, step entries and logits."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt import convert

    model = FORMS[form]()
    source = tmp_path / "decoder.onnx"
    onnx.save(model, source)
    encoder = any(i.name == "encoder_attention_mask" for i in model.graph.input)
    shapes = [f"input_ids:{BATCH},1"] + ([f"encoder_attention_mask:{BATCH},{FRAMES}"]
                                         if encoder else [])
    convert(str(source), output_folder_path=str(tmp_path / "out"), kv_cache_capacity=CAPACITY,
            overwrite_input_shape=shapes, non_verbose=True)
    rewritten, _ = fixed_capacity(model, CAPACITY)
    rng = np.random.default_rng(4)
    start = 5
    mask = np.zeros((BATCH, CAPACITY + 1), np.int64)
    mask[:, :start] = mask[:, CAPACITY:] = 1
    feeds = {"input_ids": rng.integers(0, 512, (BATCH, 1)), "attention_mask": mask,
             "position_ids": np.full((BATCH, 1), start, np.int64), **ENCODER_MASK,
             **{name: rng.normal(size=(BATCH, KV_HEADS, CAPACITY, HEAD)).astype(np.float32)
                for name in PAST}}
    session = ort.InferenceSession(rewritten.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    taken = {i.name for i in session.get_inputs()}
    want = dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {k: v for k, v in feeds.items() if k in taken})))
    layout = json.loads((tmp_path / "out" / "decoder_io_layout.json").read_text())
    names = {e["onnx_name"]: e["tflite_name"] for e in layout["inputs"] + layout["outputs"]}
    runner = Interpreter(model_path=str(tmp_path / "out" / "decoder_float32.tflite")
                         ).get_signature_runner()
    kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
    got = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()
                    if k in names})
    for name, value in want.items():
        assert_close(got[names[name]], value, 1e-5, name)
