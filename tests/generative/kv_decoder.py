"""A small decoder with a KV cache, built with onnx.helper, in the form transformers exports:
inputs `input_ids` [batch, sequence], `attention_mask` [batch, past + sequence],
`position_ids` [batch, sequence] and per layer `past.{i}.key` / `.value` [batch, heads,
past, head]; outputs `logits` and `present.{i}.key` / `.value` = Concat(past, new) on the
sequence axis. Attention is causal over the concatenated positions (query i at past + i)
and masked by `attention_mask` (an additive bias, as transformers makes it); positions enter through a learned table. Keys and values
have KV_HEADS heads, each read by HEADS // KV_HEADS query heads (grouped-query attention:
Unsqueeze, Expand, Reshape, as transformers exports it)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, WIDTH, HEADS, KV_HEADS, HEAD, LAYERS, POSITIONS = 512, 32, 4, 2, 16, 2, 64
CAPACITY, PROMPT, NEW, BATCH = 16, 5, 6, 2
PAST = [f"past.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]


def cached_steps(run, prompt: np.ndarray, new: int, capacity: int = CAPACITY,
                 forced: list | None = None, extra: dict | None = None):
    """Greedy decoding with a fixed-capacity cache: `run(signature, feeds)` returns a dict of
    outputs; the new entries of each step are written into the cache at its position.
    `forced`: the tokens fed after each step instead of the greedy ones; `extra`: more
    inputs fed to every step (an encoder's mask)."""
    batch = len(prompt)
    cache = {name: np.zeros((batch, KV_HEADS, capacity, HEAD), np.float32) for name in PAST}
    ids, start, tokens, logits = prompt, 0, [], []
    for step in range(new):
        length = ids.shape[1]
        mask = np.zeros((batch, capacity + length), np.int64)
        mask[:, :start] = 1
        mask[:, capacity:] = 1
        feeds = {"input_ids": ids, "attention_mask": mask,
                 "position_ids": np.tile(np.arange(start, start + length), (batch, 1)),
                 **cache, **(extra or {})}
        out = run("prefill" if step == 0 else "decode", feeds)
        for name in PAST:
            cache[name][:, :, start:start + length] = out[name.replace("past", "present")]
        logits.append(out["logits"][:, -1])
        chosen = logits[-1].argmax(-1) if forced is None else forced[step]
        ids, start = chosen[:, None].astype(np.int64), start + length
        tokens.append(ids[:, 0])
    return tokens, logits


def decoder_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = {"embed": rng.normal(0, 1, (VOCAB, WIDTH)),
               "positions": rng.normal(0, 0.5, (POSITIONS, WIDTH)),
               "lm_head": rng.normal(0, 0.3, (WIDTH, VOCAB))}
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["tokens"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["placed"]),
        helper.make_node("Add", ["tokens", "placed"], ["h0"]),
        # the causal and padding mask over past + sequence positions
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "one"], ["sequence"], axis=0),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total"], axis=0),
        helper.make_node("Sub", ["total", "sequence"], ["past_length"]),
        helper.make_node("Range", ["zero", "total", "one"], ["key_at"]),
        helper.make_node("Range", ["zero", "sequence", "one"], ["query_index"]),
        helper.make_node("Add", ["query_index", "past_length"], ["query_at"]),
        helper.make_node("Unsqueeze", ["query_at", "axis_1"], ["query_column"]),
        helper.make_node("LessOrEqual", ["key_at", "query_column"], ["causal"]),
        helper.make_node("Cast", ["attention_mask"], ["filled"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["filled", "axes_1_2"], ["filled_4d"]),
        helper.make_node("And", ["causal", "filled_4d"], ["allowed"]),
        helper.make_node("Where", ["allowed", "kept", "masked"], ["mask_bias"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                      ["batch", "past_sequence + sequence"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch", "sequence", VOCAB])]
    hidden = "h0"
    for layer in range(LAYERS):
        p = f"l{layer}_"
        for name in ("q", "o"):
            weights[p + name] = rng.normal(0, WIDTH ** -0.5, (WIDTH, HEADS * HEAD))
        weights[p + "o"] = weights[p + "o"].T.copy()
        for name in ("k", "v"):
            weights[p + name] = rng.normal(0, WIDTH ** -0.5, (WIDTH, KV_HEADS * HEAD))
        for kind in ("key", "value"):
            past = f"past.{layer}.{kind}"
            inputs.append(helper.make_tensor_value_info(
                past, TensorProto.FLOAT, ["batch", KV_HEADS, "past_sequence", HEAD]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{layer}.{kind}", TensorProto.FLOAT,
                ["batch", KV_HEADS, "past_sequence + sequence", HEAD]))
        for name in ("q", "k", "v"):
            nodes += [
                helper.make_node("MatMul", [hidden, p + name], [p + name + "_flat"]),
                helper.make_node("Reshape", [p + name + "_flat",
                                             "split_heads" if name == "q" else "split_kv"],
                                 [p + name + "_heads"]),
                helper.make_node("Transpose", [p + name + "_heads"], [p + name + "_new"],
                                 perm=[0, 2, 1, 3]),
            ]
        nodes += [
            helper.make_node("Concat", [f"past.{layer}.key", p + "k_new"],
                             [f"present.{layer}.key"], axis=2),
            helper.make_node("Concat", [f"past.{layer}.value", p + "v_new"],
                             [f"present.{layer}.value"], axis=-2),
            *(node for kind in ("key", "value") for node in _repeated_kv(
                f"present.{layer}.{kind}", p + kind)),
            helper.make_node("Transpose", [p + "key"], [p + "kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [p + "q_new", p + "kt"], [p + "raw"]),
            helper.make_node("Mul", [p + "raw", "scale"], [p + "scores"]),
            helper.make_node("Add", [p + "scores", "mask_bias"], [p + "kept"]),
            helper.make_node("Softmax", [p + "kept"], [p + "weights"], axis=-1),
            helper.make_node("MatMul", [p + "weights", p + "value"], [p + "mixed"]),
            helper.make_node("Transpose", [p + "mixed"], [p + "mixed_t"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "mixed_t", "merge_heads"], [p + "merged"]),
            helper.make_node("MatMul", [p + "merged", p + "o"], [p + "attended"]),
            helper.make_node("Add", [hidden, p + "attended"], [p + "out"]),
        ]
        hidden = p + "out"
    nodes.append(helper.make_node("MatMul", [hidden, "lm_head"], ["logits"]))
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis_1"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes_1_2"),
        numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([0, 0, KV_HEADS, HEAD], np.int64), "split_kv"),
        numpy_helper.from_array(np.array([2], np.int64), "axis_2"),
        numpy_helper.from_array(np.array([1, 1, HEADS // KV_HEADS, 1, 1], np.int64), "repeat"),
        numpy_helper.from_array(np.array([0, HEADS, -1, HEAD], np.int64), "all_heads"),
        numpy_helper.from_array(np.array([0, 0, HEADS * HEAD], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array(HEAD ** -0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(-1e9, np.float32), "masked"),
        numpy_helper.from_array(np.array(0, np.float32), "kept"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name)
                    for name, w in weights.items()]
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializers + constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _repeated_kv(name: str, out: str) -> list:
    """[batch, KV_HEADS, length, HEAD] -> [batch, HEADS, length, HEAD], each KV head repeated
    for its query heads."""
    return [helper.make_node("Unsqueeze", [name, "axis_2"], [out + "_5d"]),
            helper.make_node("Expand", [out + "_5d", "repeat"], [out + "_repeated"]),
            helper.make_node("Reshape", [out + "_repeated", "all_heads"], [out])]


def growing_steps(session, prompt: np.ndarray, new: int, extra: dict | None = None
                  ) -> tuple[list, list[np.ndarray]]:
    """Greedy decoding with the original model in onnxruntime (the past grows by
    concatenation): the tokens and each step's last logits, [batch, vocab]. `extra`: more
    inputs fed to every step."""
    batch = len(prompt)
    past = {f"past.{i}.{k}": np.zeros((batch, KV_HEADS, 0, HEAD), np.float32)
            for i in range(LAYERS) for k in ("key", "value")}
    ids, start, tokens, logits = prompt, 0, [], []
    for _ in range(new):
        length = start + ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, length), np.int64),
                 "position_ids": np.tile(np.arange(start, length), (batch, 1)), **past,
                 **(extra or {})}
        taken = {i.name for i in session.get_inputs()}  # a form without mask or positions
        out = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {k: v for k, v in feeds.items() if k in taken})))
        past = {name: out[name.replace("past", "present")] for name in past}
        logits.append(out["logits"][:, -1])
        ids, start = logits[-1].argmax(-1)[:, None].astype(np.int64), length
        tokens.append(ids[:, 0])
    return tokens, logits
