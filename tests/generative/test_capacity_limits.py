"""--kv_cache_capacity against what the model and the target can hold (issue 47): a capacity
past the model's positions, or whose cache TFLite or this machine cannot hold, is refused
before anything is built, with the limit and where it comes from; --signature's own input
names are checked under its name; and -odrqt with --signature works where the weights are too
small to be bound after conversion."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from gqa_decoder import builder_decoder

from onnx2tf_alt.cli.main import main
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.passes import kv_cache
from onnx2tf_alt.passes.kv_cache import fixed_capacity, max_positions

import kv_decoder
from kv_decoder import decoder_model


def first_line(error: pytest.ExceptionInfo) -> str:
    return str(error.value).splitlines()[0]


def without_position_ids(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder with its `position_ids` input named `steps`: nothing says its positions."""
    for info in model.graph.input:
        if info.name == "position_ids":
            info.name = "steps"
    for node in model.graph.node:
        node.input[:] = ["steps" if name == "position_ids" else name for name in node.input]
    return model


def test_the_position_table_gives_the_max_positions():
    limit = max_positions(decoder_model())
    assert limit.positions == 64
    assert limit.source == "the rows of the position table 'positions' that Gather 'placed' reads"
    assert max_positions(without_position_ids(decoder_model())) is None


def test_a_capacity_past_the_position_table_is_refused_naming_it():
    with pytest.raises(InputError) as error:
        fixed_capacity(decoder_model(), 65)
    assert first_line(error) == (
        "--kv_cache_capacity 65 is more than the 64 positions the model places (the rows of "
        "the position table 'positions' that Gather 'placed' reads): it has nothing for a token "
        "at position 64 or later. Pass --kv_cache_capacity 64 or less.")
    _, entries = fixed_capacity(decoder_model(), 64)  # the whole table is fine
    assert len(entries) == 4


def test_a_capacity_past_the_rotary_cache_is_refused_naming_it():
    with pytest.raises(InputError) as error:
        fixed_capacity(builder_decoder(), 100)
    assert first_line(error).startswith(
        "--kv_cache_capacity 100 is more than the 64 positions the model places (the rows of "
        "the cos cache 'cos_cache' of GroupQueryAttention 'l0_attended'):")


def test_the_metadata_context_length_is_a_limit_too():
    model = without_position_ids(decoder_model())
    onnx.helper.set_model_props(model, {"max_position_embeddings": "32"})
    with pytest.raises(InputError) as error:
        fixed_capacity(model, 33)
    assert "(metadata_props max_position_embeddings = 32)" in first_line(error)


def test_a_cache_larger_than_a_tflite_tensor_is_refused_with_its_size(monkeypatch):
    monkeypatch.setattr(kv_cache, "physical_memory", lambda: None)
    with pytest.raises(InputError) as error:
        fixed_capacity(without_position_ids(decoder_model()), 1_000_000_000)
    assert first_line(error) == (
        "--kv_cache_capacity 1000000000 needs 128.0 GB per past input and 512.0 GB for all 4 "
        "(symbolic dims such as the batch counted as 1): more than the 2^31 - 1 elements "
        "TFLite's kernels index in one tensor ('past.0.key' ['batch', 2, 1000000000, 16] "
        "float32 would have 32000000000).")
    assert str(error.value).splitlines()[1] == (
        "Pass a smaller --kv_cache_capacity: at most 67108863 positions fit; the model's max "
        "positions are unknown (its config's max_position_embeddings says them).")


def test_a_cache_larger_than_the_memory_is_refused_with_its_size(monkeypatch):
    monkeypatch.setattr(kv_cache, "physical_memory", lambda: 4 * 10**9)
    with pytest.raises(InputError) as error:
        fixed_capacity(without_position_ids(decoder_model()), 10_000_000)
    assert first_line(error) == (
        "--kv_cache_capacity 10000000 needs 1.3 GB per past input and 5.1 GB for all 4 "
        "(symbolic dims such as the batch counted as 1): more than this machine's 4.0 GB of "
        "memory.")
    assert "at most 7812500 positions fit" in str(error.value)
    fixed_capacity(without_position_ids(decoder_model()), 7_812_500)


def test_the_command_line_refuses_a_typo_before_building(tmp_path, capfd):
    source = tmp_path / "decoder.onnx"
    onnx.save(decoder_model(), source)
    out = tmp_path / "out"
    code = main(["-i", str(source), "-o", str(out), "--kv_cache_capacity", "1000000000",
                 "-ois", "input_ids:1,1", "-n"])
    message = capfd.readouterr().err
    assert code == 2, message
    assert message.splitlines()[0].endswith(
        "--kv_cache_capacity 1000000000 is more than the 64 positions the model places (the "
        "rows of the position table 'positions' that Gather 'placed' reads): it has nothing "
        "for a token at position 64 or later. Pass --kv_cache_capacity 64 or less."), message
    assert not out.exists()


def test_signatures_check_the_capacity_and_their_own_input_names(tmp_path):
    from onnx2tf_alt import convert

    source = tmp_path / "decoder.onnx"
    onnx.save(decoder_model(), source)
    prefill, decode = ["prefill", "input_ids:1,5"], ["decode", "input_ids:1,1"]

    def refusal(capacity: int | None, signatures: list) -> str:
        with pytest.raises(InputError) as error:
            convert(str(source), output_folder_path=str(tmp_path / "out"),
                    kv_cache_capacity=capacity, signatures=signatures, non_verbose=True)
        return first_line(error)

    assert refusal(1000, [prefill, decode]).startswith(
        "--kv_cache_capacity 1000 is more than the 64 positions the model places")
    assert refusal(16, [prefill, [*decode, "inputids:1,1"]]) == (
        "--signature decode names input(s) ['inputids'] that the -i model does not have; its "
        "inputs are ['attention_mask', 'input_ids', 'past.0.key', 'past.0.value', "
        "'past.1.key', 'past.1.value', 'position_ids'].")
    assert refusal(16, [[*prefill, "input_ids:1,x"]]) == (
        "--signature prefill: bad input shape 'input_ids:1,x': expected NAME:D1,D2,... with "
        "positive integers, e.g. input_ids:1,1.")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def small_decoder(monkeypatch):
    """small_decoder(vocab, positions): the decoder with 16 features and those tables, its
    every weight under the 16384 elements bound after conversion."""
    def build(vocab: int, positions: int) -> onnx.ModelProto:
        for name, value in (("VOCAB", vocab), ("WIDTH", 16), ("HEADS", 2), ("KV_HEADS", 1),
                            ("HEAD", 8), ("POSITIONS", positions)):
            monkeypatch.setattr(kv_decoder, name, value)
        return kv_decoder.decoder_model()
    return build


def test_dynamic_range_signatures_of_a_small_decoder(small_decoder, tmp_path):
    """Its weights cannot be bound after conversion: the -odrqt file is the float32 one with
    int8 weights (once refused), and computes as the float32 one does."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt import convert

    source = tmp_path / "small.onnx"
    onnx.save(small_decoder(64, 64), source)
    out = tmp_path / "out"
    convert(str(source), output_folder_path=str(out), kv_cache_capacity=16,
            signatures=[["prefill", "input_ids:1,5"], ["decode", "input_ids:1,1"]],
            output_dynamic_range_quantized_tflite=True, non_verbose=True)
    layout = json.loads((out / "small_io_layout.json").read_text())["signatures"]["decode"]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 64, (1, 1)), "attention_mask": np.ones((1, 17)),
             "position_ids": np.full((1, 1), 3),
             **{f"past.{i}.{k}": rng.normal(size=(1, 1, 16, 8)) for i in range(2)
                for k in ("key", "value")}}
    logits = {}
    for suffix in ("float32", "dynamic_range_quant"):
        interpreter = Interpreter(model_path=str(out / f"small_{suffix}.tflite"))
        runner = interpreter.get_signature_runner("decode")
        kinds = {k: d["dtype"] for k, d in runner.get_input_details().items()}
        names = {e["onnx_name"]: e["tflite_name"] for e in layout["inputs"]}
        got = runner(**{names[k]: v.astype(kinds[names[k]]) for k, v in feeds.items()})
        logits[suffix] = got[next(e["tflite_name"] for e in layout["outputs"]
                                  if e["onnx_name"] == "logits")].ravel()
        if suffix != "float32":
            assert any(d["dtype"] == np.int8 for d in interpreter.get_tensor_details())
    a, b = logits.values()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999


def test_dynamic_range_signatures_without_a_weight_to_quantize_warn(small_decoder, tmp_path,
                                                                    caplog):
    from onnx2tf_alt import convert

    source = tmp_path / "tiny.onnx"
    onnx.save(small_decoder(32, 32), source)
    logger = logging.getLogger("onnx2tf_alt")  # it does not propagate to the root logger
    logger.addHandler(caplog.handler)
    try:
        convert(str(source), output_folder_path=str(tmp_path / "out"), kv_cache_capacity=16,
                signatures=[["prefill", "input_ids:1,5"], ["decode", "input_ids:1,1"]],
                output_dynamic_range_quantized_tflite=True, verbosity="warn")
    finally:
        logger.removeHandler(caplog.handler)
    assert (tmp_path / "out" / "tiny_dynamic_range_quant.tflite").exists()
    assert ("-odrqt: no FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, BATCH_MATMUL or GATHER "
            "reads a float32 weight of 1024 elements or more: tiny_dynamic_range_quant.tflite "
            "holds the float32 weights") in caplog.messages


@pytest.mark.parametrize("small", [True, False], ids=["weights_in_the_graph", "bound_weights"])
def test_a_single_signature_keeps_its_key(small_decoder, tmp_path, small):
    """TF's converter keys one function `serving_default`; the file, its delegate report and
    io_layout.json must say `decode` (a single --signature ended in StopIteration)."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt import convert

    source = tmp_path / "one.onnx"
    onnx.save(small_decoder(64, 64) if small else kv_decoder.decoder_model(), source)
    out = tmp_path / "out"
    convert(str(source), output_folder_path=str(out), kv_cache_capacity=16,
            signatures=[["decode", "input_ids:1,1"]], output_dynamic_range_quantized_tflite=True,
            disable_model_save=True, non_verbose=True)
    for suffix in ("float32", "float16", "dynamic_range_quant"):
        interpreter = Interpreter(model_path=str(out / f"one_{suffix}.tflite"))
        assert list(interpreter.get_signature_list()) == ["decode"], suffix
    for name in ("one_io_layout.json", "one_delegates.json"):
        assert list(json.loads((out / name).read_text())["signatures"]) == ["decode"]
