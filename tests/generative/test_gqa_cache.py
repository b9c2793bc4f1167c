"""--kv_cache_capacity and --signature on a decoder in onnxruntime's model-builder form
(GroupQueryAttention with packed QKV and rotary embedding, seqlens_k from the mask,
MatMulNBits, Simplified/SkipSimplifiedLayerNormalization; issue 30): the present outputs are
found in the attention nodes, the rotary embedding moves out so the new keys can be
returned, the mask's `total_sequence_length` becomes `capacity + sequence_length`, and the
converted signatures decode as onnxruntime does on the original model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gqa_decoder import HEAD, KV_HEADS, PAST, VOCAB, builder_decoder, growing_steps

from onnx2tf_alt.passes.kv_cache import ALL_SUFFIX, fixed_capacity

from harness import assert_close

CAPACITY, PROMPT, NEW, BATCH = 16, 5, 6, 2


def cached_steps(run, prompt: np.ndarray, new: int, forced: list | None = None,
                 head: int = HEAD):
    """Greedy decoding with a fixed-capacity cache (filled slots a prefix, marked 1 in the
    mask, then the step's own positions): `run(signature, feeds)` returns the outputs."""
    batch = len(prompt)
    cache = {name: np.zeros((batch, KV_HEADS, CAPACITY, head), np.float32) for name in PAST}
    ids, start, tokens, logits = prompt, 0, [], []
    for step in range(new):
        length = ids.shape[1]
        mask = np.zeros((batch, CAPACITY + length), np.int64)
        mask[:, :start] = 1
        mask[:, CAPACITY:] = 1
        out = run("prefill" if step == 0 else "decode",
                  {"input_ids": ids, "attention_mask": mask, **cache})
        for name in PAST:
            cache[name][:, :, start:start + length] = out[name.replace("past_key_values",
                                                                       "present")]
        logits.append(out["logits"][:, -1])
        chosen = logits[-1].argmax(-1) if forced is None else forced[step]
        ids, start = chosen[:, None].astype(np.int64), start + length
        tokens.append(ids[:, 0])
    return tokens, logits


def _session(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=[-1, 3], ids=["full_attention", "window_3"])
def reference(request):
    """The decoder (with a sliding window of 3 in the second run), a prompt, and onnxruntime's
    greedy steps on it."""
    model = builder_decoder(window=request.param)
    prompt = np.random.default_rng(1).integers(0, VOCAB, (BATCH, PROMPT)).astype(np.int64)
    return model, prompt, growing_steps(_session(model), prompt, NEW)


def test_the_rewrite_moves_the_rotary_out_and_fixes_the_mask(reference):
    model, _, _ = reference
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rewritten, entries = fixed_capacity(copy, CAPACITY)
    assert [(e.past, e.axis, e.symbol) for e in entries] == [
        (name, 2, "past_sequence_length") for name in PAST]
    dims = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
            for i in rewritten.graph.input}
    assert dims["attention_mask"] == ["batch_size", f"{CAPACITY} + sequence_length"]
    assert dims[PAST[0]] == ["batch_size", KV_HEADS, CAPACITY, HEAD]
    attention = [n for n in rewritten.graph.node if n.op_type == "GroupQueryAttention"]
    assert all(helper_attr(n, "do_rotary") == 0 for n in attention)
    assert {n.output[1] for n in attention} == {f"present.{i}.key{ALL_SUFFIX}"
                                                for i in range(len(attention))}
    assert sum(n.op_type == "RotaryEmbedding" for n in rewritten.graph.node) == 2 * len(attention)


def helper_attr(node, name):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


@pytest.mark.parametrize("head, rotary, window", [(HEAD, None, -1), (32, 16, -1), (HEAD, None, 3)],
                         ids=["full", "partial", "window"])
def test_the_fixed_capacity_model_decodes_as_the_growing_one_in_onnxruntime(reference, head,
                                                                            rotary, window):
    """One row (onnxruntime's GroupQueryAttention takes a prompt after a past for batch 1
    only): the same tokens, and logits as the growing cache gives them; also with a rotary
    embedding of part of each head (phi-style), and with a sliding window of 3 (Mistral)."""
    _, prompt, _ = reference
    model = builder_decoder(head=head, rotary=rotary, window=window)
    tokens, logits = growing_steps(_session(model), prompt[:1], NEW, head)
    session = _session(fixed_capacity(builder_decoder(head=head, rotary=rotary, window=window),
                                      CAPACITY)[0])
    names = [o.name for o in session.get_outputs()]
    got_tokens, got_logits = cached_steps(
        lambda _, feeds: dict(zip(names, session.run(None, feeds))), prompt[:1], NEW,
        head=head)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")


@pytest.fixture(scope="module")
def converted(reference, tmp_path_factory):
    from onnx2tf_alt import convert

    model, _, _ = reference
    folder = tmp_path_factory.mktemp("gqa_cache")
    source = str(folder / "decoder.onnx")
    onnx.save(model, source)
    convert(source, output_folder_path=str(folder / "out"), kv_cache_capacity=CAPACITY,
            signatures=[["prefill", f"input_ids:{BATCH},{PROMPT}"],
                        ["decode", f"input_ids:{BATCH},1"]],
            output_dynamic_range_quantized_tflite=True, non_verbose=True)
    return folder / "out"


@pytest.mark.parametrize("suffix", ["float32", "dynamic_range_quant"])
def test_prefill_and_decode_signatures_decode_as_onnxruntime(reference, converted, suffix):
    """Two rows at once; only the token ids' shapes were given (the mask's follows)."""
    from ai_edge_litert.interpreter import Interpreter

    _, prompt, (tokens, logits) = reference
    interpreter = Interpreter(model_path=str(converted / f"decoder_{suffix}.tflite"))
    assert sorted(interpreter.get_signature_list()) == ["decode", "prefill"]
    layout = json.loads((converted / "decoder_io_layout.json").read_text())["signatures"]

    def run(name, feeds):
        runner, entries = interpreter.get_signature_runner(name), layout[name]
        kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
        names = {e["onnx_name"]: e["tflite_name"] for e in entries["inputs"]}
        out = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()})
        return {e["onnx_name"]: out[e["tflite_name"]] for e in entries["outputs"]}

    if suffix == "dynamic_range_quant":
        for got, want in zip(cached_steps(run, prompt, NEW, forced=tokens)[1], logits):
            cosine = (got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)
            assert cosine > 0.99, cosine
        return
    got_tokens, got_logits = cached_steps(run, prompt, NEW)
    np.testing.assert_array_equal(np.array(got_tokens), np.array(tokens))
    for step, (got, want) in enumerate(zip(got_logits, logits)):
        assert_close(got, want, 1e-5, f"step {step}")
    decode = {e["onnx_name"]: e["shape"] for e in layout["decode"]["inputs"]}
    assert decode["attention_mask"] == [BATCH, CAPACITY + 1]


def test_the_decode_step_runs_in_one_xnnpack_partition(converted):
    reports = json.loads((converted / "decoder_delegates.json").read_text())["signatures"]
    for name, report in reports.items():
        assert report["xnnpack_partitions"] == 1, (name, report["summary"])
        left = {op["op"] for op in report["ops"] if not op["delegated"]}
        assert not left & {"FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "MUL"}, (name, left)
