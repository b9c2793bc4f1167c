"""Small ONNX models shared by the end-to-end tests, built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from harness import make_model


def tiny_cnn(batch="N", seed: int = 0):
    """Conv -> Relu -> Conv(stride 2) -> Add(residual-free) -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal((8,)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal((16,)).astype(np.float32) * 0.1,
        "fc_w": rng.standard_normal((10, 16)).astype(np.float32) * 0.3,
        "fc_b": rng.standard_normal((10,)).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
    ]
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    model = make_model(
        nodes, {"input": x}, ["logits"], inits, opset=17, input_shapes={"input": [batch, 3, 16, 16]}
    )
    return model, {"input": x}


def custom_op_model():
    """Two nodes of an unknown custom domain between standard ops."""
    x = np.ones((1, 4), np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("FancyOp", ["a"], ["b"], domain="com.example", name="fancy_1"),
        helper.make_node("OtherOp", ["b"], ["y"], domain="com.example", name="other_2"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", 1, [1, 4])],
        [helper.make_tensor_value_info("y", 1, [1, 4])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    ), {"x": x}


def attention_gru_decoder(end_token: int, max_steps: int = 80, seed: int = 0,
                          frames: int = 12, hidden: int = 32, vocab: int = 40):
    """A greedy attention-GRU decoder as Paddle2ONNX and torch.jit.script export them: one
    Loop over at most `max_steps` steps that stops once the emitted token is `end_token`.

    Each step attends over the encoder frames `enc` (1, frames, hidden) with the hidden
    state, feeds [embedding of the last token + a position code, attention context] to a GRU
    cell written out gate by gate, and emits the ArgMax token; scan outputs are the logits
    and the tokens. The body declares no value_info. Returns (model, feeds).
    """
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.4):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    emb_dim = 16
    inits = {
        "embedding": w(vocab, emb_dim, scale=1.0), "w_q": w(hidden, hidden, scale=0.2),
        "w_x": w(emb_dim + hidden, 3 * hidden), "w_h": w(hidden, 3 * hidden, scale=0.1),
        "b_x": w(3 * hidden, scale=0.1), "w_out": w(hidden, vocab, scale=1.0),
        "position": w(1, emb_dim, scale=1.0), "end": np.array([end_token], np.int64),
        "axis1": np.array([1], np.int64), "axis2": np.array([2], np.int64),
        "trip": np.array(max_steps, np.int64), "go": np.array(True),
        "start_token": np.array([0], np.int64), "h0": np.zeros((1, hidden), np.float32),
    }
    n = helper.make_node
    body_nodes = [
        n("Cast", ["i"], ["i_f"], to=1),
        n("Gather", ["embedding", "tok_in"], ["emb"]),
        n("Mul", ["position", "i_f"], ["pos_scaled"]),
        n("Sin", ["pos_scaled"], ["pos"]),
        n("Add", ["emb", "pos"], ["emb_pos"]),
        n("MatMul", ["h_in", "w_q"], ["q"]),
        n("Unsqueeze", ["q", "axis2"], ["q3"]),
        n("MatMul", ["enc", "q3"], ["scores"]),
        n("Softmax", ["scores"], ["attn"], axis=1),
        n("Mul", ["enc", "attn"], ["weighted"]),
        n("ReduceSum", ["weighted", "axis1"], ["context"], keepdims=0),
        n("Concat", ["emb_pos", "context"], ["x"], axis=1),
        n("MatMul", ["x", "w_x"], ["gx_"]),
        n("Add", ["gx_", "b_x"], ["gx"]),
        n("MatMul", ["h_in", "w_h"], ["gh"]),
        n("Split", ["gx"], ["xr", "xz", "xn"], axis=1, num_outputs=3),
        n("Split", ["gh"], ["hr", "hz", "hn"], axis=1, num_outputs=3),
        n("Add", ["xr", "hr"], ["r_"]), n("Sigmoid", ["r_"], ["r"]),
        n("Add", ["xz", "hz"], ["z_"]), n("Sigmoid", ["z_"], ["z"]),
        n("Mul", ["r", "hn"], ["rhn"]), n("Add", ["xn", "rhn"], ["n_"]), n("Tanh", ["n_"], ["nn"]),
        n("Sub", ["h_in", "nn"], ["h_minus_n"]), n("Mul", ["z", "h_minus_n"], ["zh"]),
        n("Add", ["nn", "zh"], ["h_out"]),
        n("MatMul", ["h_out", "w_out"], ["logits"]),
        n("ArgMax", ["logits"], ["tok_out"], axis=1, keepdims=0),
        n("Equal", ["tok_out", "end"], ["is_end"]),
        n("ReduceMax", ["is_end_i"], ["any_end"], keepdims=0),
        n("Not", ["any_end_b"], ["cond_out"]),
        n("Identity", ["tok_out"], ["tok_scan"]),
    ]
    # Equal gives bool; ReduceMax wants numbers: cast around it
    body_nodes[30:30] = [n("Cast", ["is_end"], ["is_end_i"], to=6)]
    body_nodes.insert(32, n("Cast", ["any_end"], ["any_end_b"], to=9))
    body = helper.make_graph(
        body_nodes, "decoder_step",
        [helper.make_tensor_value_info("i", 7, []), helper.make_tensor_value_info("cond_in", 9, []),
         helper.make_tensor_value_info("h_in", 1, None),
         helper.make_tensor_value_info("tok_in", 7, None)],
        [helper.make_tensor_value_info("cond_out", 9, None),
         helper.make_tensor_value_info("h_out", 1, None),
         helper.make_tensor_value_info("tok_out", 7, None),
         helper.make_tensor_value_info("logits", 1, None),
         helper.make_tensor_value_info("tok_scan", 7, None)],
    )
    loop = n("Loop", ["trip", "go", "h0", "start_token"], ["h_last", "tok_last", "all_logits",
                                                           "tokens"], body=body)
    enc = rng.standard_normal((1, frames, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [loop], "attention_gru_decoder",
        [helper.make_tensor_value_info("enc", 1, [1, frames, hidden])],
        [helper.make_tensor_value_info("all_logits", 1, [None, 1, vocab]),
         helper.make_tensor_value_info("tokens", 7, [None, 1])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, {"enc": enc}
