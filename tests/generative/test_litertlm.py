"""--litertlm (issue 49): a decoder as a .litertlm bundle that LiteRT-LM's own engine
(litert_lm.Engine, CPU) opens and generates with: its greedy tokens are onnxruntime's on the
same prompt. The tokenizer is a WordLevel tokenizer.json whose token k is the word `w<k>`,
so that ids go in and come back through text exactly."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx2tf_alt.cli.main import main
from onnx2tf_alt.errors import InputError, UnsupportedFormError
from onnx2tf_alt.generative.litertlm import find_tokenizer, litert_lm_model
from onnx2tf_alt.passes.kv_cache import fixed_capacity

from kv_decoder import VOCAB, decoder_model, growing_steps

NEW, PROMPT, CAPACITY = 32, 21, 64  # a prompt of 2 prefill chunks of 8 and a remainder


def word_tokenizer(folder, vocab: int, config: dict | None = None) -> None:
    """tokenizer.json (WordLevel: <pad> 0, <bos> 1, <eos> 2, <unk> 3, then `w<k>` = k) and
    generation_config.json (`config`, default eos 2) in `folder`."""
    folder.mkdir(exist_ok=True)
    words = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3,
             **{f"w{k}": k for k in range(4, vocab)}}
    special = [{"id": k, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for w, k in list(words.items())[:3]]
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}}))
    (folder / "generation_config.json").write_text(json.dumps(config or {"eos_token_id": 2}))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("litertlm")
    word_tokenizer(folder / "model", VOCAB)
    onnx.save(decoder_model(), folder / "model" / "decoder.onnx")
    code = main(["-i", str(folder / "model" / "decoder.onnx"), "-o", str(folder / "out"),
                 "-dms", "-n", "--kv_cache_capacity", str(CAPACITY), "--litertlm",
                 "--tokenizer", str(folder / "model"), "--litertlm_prefill", "8", "-odrqt"])
    assert code == 0
    return folder / "out"


def engine_tokens(path, prompt: list[int], new: int, cache) -> list[int]:
    import litert_lm

    engine = litert_lm.Engine(str(path), backend=litert_lm.Backend.CPU(thread_count=1),
                              cache_dir=str(cache))
    session = engine.create_session(
        apply_prompt_template=False, max_output_tokens=new,
        sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=1.0, top_p=1.0, seed=0))
    session.run_prefill([" ".join(f"w{k}" for k in prompt)])
    return engine.tokenize(session.run_decode().texts[0])


def onnxruntime_tokens(prompt: list[int], new: int) -> list[int]:
    session = ort.InferenceSession(decoder_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    tokens, _ = growing_steps(session, np.array([prompt], np.int64), new)
    return [int(t[0]) for t in tokens]


def test_litert_lms_engine_generates_onnxruntimes_tokens(bundle, tmp_path):
    prompt = [int(k) for k in np.random.default_rng(1).integers(4, VOCAB, PROMPT)]
    want = onnxruntime_tokens(prompt, NEW)
    assert 2 not in want  # no stop token in the way
    assert engine_tokens(bundle / "decoder_float32.litertlm", prompt, NEW, tmp_path) == want


def test_the_int8_bundle_runs_and_mostly_agrees(bundle, tmp_path):
    """Random weights put the top two logits close: the int8 file is judged by how long it
    follows onnxruntime (the trained-weight figures are in docs/benchmarks.md)."""
    prompt = [int(k) for k in np.random.default_rng(1).integers(4, VOCAB, PROMPT)]
    got = engine_tokens(bundle / "decoder_dynamic_range_quant.litertlm", prompt, NEW, tmp_path)
    assert len(got) == NEW and got[:4] == onnxruntime_tokens(prompt, NEW)[:4]


def test_the_files_follow_litert_lms_conventions(bundle):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(bundle / "decoder_float32.tflite"))
    assert sorted(interpreter.get_signature_list()) == ["decode", "prefill_8"]
    caches = [f"kv_cache_{k}_{i}" for k in "kv" for i in range(2)]
    for name, length in (("prefill_8", 8), ("decode", 1)):
        runner = interpreter.get_signature_runner(name)
        inputs, outputs = runner.get_input_details(), runner.get_output_details()
        assert sorted(inputs) == sorted(["tokens", "input_pos", *caches])
        assert sorted(outputs) == sorted(["logits", *caches])
        assert list(inputs["tokens"]["shape"]) == [1, length]
        assert list(inputs["input_pos"]["shape"]) == [length]
        assert list(inputs["kv_cache_k_0"]["shape"]) == [1, 2, CAPACITY, 16]
        assert list(outputs["logits"]["shape"]) == [1, length, VOCAB]
    layout = json.loads((bundle / "decoder_io_layout.json").read_text())["signatures"]
    assert {e["tflite_name"] for e in layout["decode"]["outputs"]} == {"logits", *caches}


def test_the_tokenizer_folder_gives_the_start_stop_tokens_and_template(tmp_path):
    word_tokenizer(tmp_path, 16, {"bos_token_id": 1, "eos_token_id": [2, 3]})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages }}"}))
    found = find_tokenizer(str(tmp_path))
    assert (found.kind, found.start, found.stops, found.chat_template) == (
        "hf", 1, [2, 3], "{{ messages }}")
    assert found.read == ["generation_config.json", "tokenizer_config.json"]
    (tmp_path / "generation_config.json").unlink()
    with pytest.raises(InputError, match="no stop token found"):
        find_tokenizer(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputError, match="neither tokenizer.json nor tokenizer.model"):
        find_tokenizer(str(tmp_path / ".."))


@pytest.mark.parametrize("flags, phrase", [
    ([], "--litertlm needs --kv_cache_capacity N and --tokenizer PATH"),
    (["--kv_cache_capacity", "64", "--tokenizer", "."], "holds neither tokenizer.json"),
    (["--kv_cache_capacity", "64", "--tokenizer", ".", "--signature", "decode",
      "input_ids:1,1"], "drop --signature")], ids=["flags", "tokenizer", "signature"])
def test_what_it_needs_is_asked_for_before_anything_is_read(tmp_path, capfd, flags, phrase):
    source = tmp_path / "decoder.onnx"
    onnx.save(decoder_model(), source)
    flags = [str(tmp_path) if f == "." else f for f in flags]
    code = main(["-i", str(source), "-o", str(tmp_path / "out"), "--litertlm", "-n", *flags])
    assert code == 2 and phrase in capfd.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_input_litert_lm_does_not_give_is_refused_naming_it():
    model, entries = fixed_capacity(decoder_model(), CAPACITY)
    model.graph.input.append(onnx.helper.make_tensor_value_info(
        "encoder_hidden_states", onnx.TensorProto.FLOAT, [1, 7, 32]))
    with pytest.raises(UnsupportedFormError, match=r"needs \['encoder_hidden_states'\]"):
        litert_lm_model(model, entries, CAPACITY)


def test_token_ids_past_the_vocabulary_give_way_to_the_named_tokens(tmp_path):
    """GPT-2's config keeps bos / eos 50256 in a model of a smaller vocabulary: the tokens
    tokenizer_config.json names are taken instead."""
    word_tokenizer(tmp_path, 16, {"bos_token_id": 50256, "eos_token_id": 50256})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": {"content": "<eos>"}}))
    found = find_tokenizer(str(tmp_path))
    assert (found.start, found.stops) == (1, [2])
    assert found.read == ["tokenizer_config.json"]
