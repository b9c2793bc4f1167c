"""A small decoder in the form onnxruntime's model builder writes (onnxruntime_genai's
`builder.py`), built with onnx.helper: inputs `input_ids` [batch, sequence_length] and
`attention_mask` [batch, total_sequence_length] (no position ids), per layer
`past_key_values.{i}.key` / `.value` [batch, KV_HEADS, past_sequence_length, HEAD];
outputs `logits` and `present.{i}.key` / `.value` [batch, KV_HEADS, total_sequence_length,
HEAD]. Each layer: SimplifiedLayerNormalization, one packed QKV MatMul, a com.microsoft
GroupQueryAttention with do_rotary (seqlens_k = sum(mask) - 1, total_sequence_length =
the mask's length), the output projection as a 4-bit MatMulNBits, and a
SkipSimplifiedLayerNormalization carrying the residual."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, WIDTH, HEADS, KV_HEADS, HEAD, LAYERS, POSITIONS = 512, 64, 4, 2, 16, 2, 64
MS = "com.microsoft"
PAST = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]


def _nbits(weight: np.ndarray, block: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float -> (MatMulNBits codes [N, K / block, block / 2] uint8, scales [N * blocks]):
    symmetric 4-bit codes (zero point 8), packed low nibble first."""
    k, n = weight.shape
    blocks = weight.T.reshape(n, k // block, block)
    scales = np.abs(blocks).max(-1, keepdims=True) / 7
    codes = np.clip(np.round(blocks / scales) + 8, 0, 15).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scales.reshape(-1).astype(np.float32)


def builder_decoder(seed: int = 0, head: int = HEAD, rotary: int | None = None,
                    window: int = -1) -> onnx.ModelProto:
    """The decoder with heads of `head` features, of which the first `rotary` (all by
    default) rotate (phi-style partial rotary: cos/sin caches of rotary / 2 columns), and
    attention over the `window` latest positions when > 0 (Mistral's sliding window)."""
    rng = np.random.default_rng(seed)
    rotary = rotary or head
    angles = np.arange(POSITIONS)[:, None] / 10000 ** (np.arange(0, rotary, 2) / rotary)
    weights = {"embed": rng.normal(0, 1, (VOCAB, WIDTH)),
               "lm_head": rng.normal(0, 0.3, (WIDTH, VOCAB)),
               "final_norm": rng.normal(1, 0.1, WIDTH),
               "cos_cache": np.cos(angles), "sin_cache": np.sin(angles)}
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis_1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens"]),
        helper.make_node("Cast", ["seqlens"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one_scalar"], ["total"], axis=0),
        helper.make_node("Cast", ["total"], ["total_sequence_length"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embed", "input_ids"], ["h0"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                      ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                      ["batch_size", "total_sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch_size", "sequence_length", VOCAB])]
    initializers = []
    hidden = "h0"
    for layer in range(LAYERS):
        p = f"l{layer}_"
        weights[p + "norm"] = rng.normal(1, 0.1, WIDTH)
        weights[p + "qkv"] = rng.normal(0, WIDTH ** -0.5, (WIDTH, (HEADS + 2 * KV_HEADS) * head))
        codes, scales = _nbits(rng.normal(0, WIDTH ** -0.5, (HEADS * head, WIDTH)))
        initializers += [numpy_helper.from_array(codes, p + "o_codes"),
                         numpy_helper.from_array(scales, p + "o_scales")]
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{layer}.{kind}", TensorProto.FLOAT,
                ["batch_size", KV_HEADS, "past_sequence_length", head]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{layer}.{kind}", TensorProto.FLOAT,
                ["batch_size", KV_HEADS, "total_sequence_length", head]))
        normed = p + "normed"
        if layer == 0:
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [hidden, p + "norm"],
                                          [normed], axis=-1, epsilon=1e-6))
        else:
            nodes.append(helper.make_node(
                "SkipSimplifiedLayerNormalization", [hidden, p + "skip", p + "norm"],
                [normed, "", "", p + "residual"], domain=MS, epsilon=1e-6))
        nodes += [
            helper.make_node("MatMul", [normed, p + "qkv"], [p + "packed"]),
            helper.make_node(
                "GroupQueryAttention",
                [p + "packed", "", "", f"past_key_values.{layer}.key",
                 f"past_key_values.{layer}.value", "seqlens_k", "total_sequence_length",
                 "cos_cache", "sin_cache"],
                [p + "attended", f"present.{layer}.key", f"present.{layer}.value"],
                domain=MS, num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
                scale=head ** -0.5, local_window_size=window),
            helper.make_node("MatMulNBits", [p + "attended", p + "o_codes", p + "o_scales"],
                             [f"l{layer + 1}_skip"], domain=MS, K=HEADS * head, N=WIDTH,
                             bits=4, block_size=16),
        ]
        hidden = "h0" if layer == 0 else p + "residual"  # the residual stream so far
    last = f"l{LAYERS}_"
    nodes += [
        helper.make_node("SkipSimplifiedLayerNormalization",
                         [hidden, last + "skip", "final_norm"],
                         ["final", "", "", last + "residual"], domain=MS,
                         epsilon=1e-6),
        helper.make_node("MatMul", ["final", "lm_head"], ["logits"]),
    ]
    constants = [numpy_helper.from_array(np.array([1], np.int64), "axis_1"),
                 numpy_helper.from_array(np.array(1, np.int64), "one"),
                 numpy_helper.from_array(np.array(1, np.int64), "one_scalar")]
    initializers += [numpy_helper.from_array(w.astype(np.float32), name)
                     for name, w in weights.items()]
    graph = helper.make_graph(nodes, "builder_decoder", inputs, outputs,
                              initializers + constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def growing_steps(session, prompt: np.ndarray, new: int, head: int = HEAD
                  ) -> tuple[list, list[np.ndarray]]:
    """Greedy decoding with the original model in onnxruntime (the past grows with each
    step, as onnxruntime-genai runs it without a shared buffer): the tokens and each step's
    last logits [batch, vocab]."""
    batch = len(prompt)
    past = {name: np.zeros((batch, KV_HEADS, 0, head), np.float32) for name in PAST}
    ids, tokens, logits = prompt, [], []
    length = 0
    for _ in range(new):
        length += ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, length), np.int64), **past}
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        past = {name: out[name.replace("past_key_values", "present")] for name in past}
        logits.append(out["logits"][:, -1])
        ids = logits[-1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(ids[:, 0])
    return tokens, logits
