import numpy as np
import pytest
from onnx import helper

from harness import Rng, check_node, check_nodes

rng = Rng(0)


# --- MatMul ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((2, 3, 4, 5), (5, 6)), ((4, 5), (2, 3, 5, 6)), ((2, 1, 4, 5), (3, 5, 6)),
     ((5,), (5, 3)), ((5,), (2, 5, 3)), ((2, 4, 5), (5,)), ((5,), (5,)), ((2, 3, 7), (2, 7, 1))],
)
def test_matmul_broadcasting(a_shape, b_shape):
    check_node("MatMul", {"a": rng.randn(*a_shape), "b": rng.randn(*b_shape)})


@pytest.mark.parametrize("a_shape", [(3, 5), (2, 3, 5)])
def test_matmul_constant_weights_is_fully_connected(a_shape):
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    _, ops = check_nodes([node], {"a": rng.randn(*a_shape)}, {"w": rng.randn(5, 6)})
    assert ops.get("FULLY_CONNECTED") == 1 and "TRANSPOSE" not in ops, ops


@pytest.mark.parametrize("swap_a, swap_b", [(False, True), (True, False), (True, True)])
def test_matmul_takes_swapped_operands_without_transpose(swap_a, swap_b):
    a, b = rng.randn(2, 3, 4, 5), rng.randn(2, 3, 5, 6)
    feeds = {"a": np.swapaxes(a, -1, -2) if swap_a else a,
             "b": np.swapaxes(b, -1, -2) if swap_b else b}
    nodes = [helper.make_node("Transpose", [n], [f"{n}t"], perm=[0, 1, 3, 2])
             for n, swap in (("a", swap_a), ("b", swap_b)) if swap]
    operands = [f"{n}t" if swap else n for n, swap in (("a", swap_a), ("b", swap_b))]
    nodes.append(helper.make_node("MatMul", operands, ["y"]))
    _, ops = check_nodes(nodes, feeds, outputs=["y"])
    assert ops.get("BATCH_MATMUL") == 1 and "TRANSPOSE" not in ops, ops


# --- Gemm --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trans_a, trans_b, alpha, beta, c_shape, const_b",
    [(0, 0, 1.0, 1.0, None, False), (1, 0, 0.5, 2.0, (6,), False),
     (0, 1, 1.0, 0.5, (4, 6), False), (1, 1, 2.0, 1.0, (4, 1), False),
     (0, 1, 1.0, 1.0, (6,), True), (1, 0, 1.5, -1.0, (1, 6), True),
     (0, 0, 1.0, 1.0, (), True), (1, 1, 0.25, 3.0, (4, 6), True)],
)
def test_gemm(trans_a, trans_b, alpha, beta, c_shape, const_b):
    a = rng.randn(5, 4) if trans_a else rng.randn(4, 5)
    b = rng.randn(6, 5) if trans_b else rng.randn(5, 6)
    inputs, inits = {"a": a}, {}
    (inits if const_b else inputs)["b"] = b
    if c_shape is not None:
        inputs["c"] = rng.randn(*c_shape)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    check_node("Gemm", inputs, attrs, inits, opset=13, input_order=["a", "b", "c"][: 2 + (
        c_shape is not None)])


@pytest.mark.parametrize("trans_a", [0, 1])
def test_gemm_takes_transposed_input_without_transpose(trans_a):
    """A Transpose feeding Gemm becomes a transpose flag; with transA the two cancel, without
    it FULLY_CONNECTED still needs A's rows, so the data moves once (as in ONNX)."""
    a = rng.randn(4, 5) if trans_a else rng.randn(5, 4)
    nodes = [
        helper.make_node("Transpose", ["a"], ["at"]),
        helper.make_node("Gemm", ["at", "w"], ["y"], transA=trans_a, beta=0.5),
    ]
    _, ops = check_nodes(nodes, {"a": a}, {"w": rng.randn(5, 3)}, 13, outputs=["y"])
    assert ops.get("TRANSPOSE", 0) == 1 - trans_a, ops


@pytest.mark.parametrize("opset", [7, 11, 13])
def test_gemm_constant_weights_is_fully_connected(opset):
    inits = {"w": rng.randn(6, 5), "bias": rng.randn(6)}
    node = helper.make_node("Gemm", ["a", "w", "bias"], ["y"], transB=1, alpha=0.5)
    _, ops = check_nodes([node], {"a": rng.randn(3, 5)}, inits, opset)
    assert ops.get("FULLY_CONNECTED") == 1 and "TRANSPOSE" not in ops, ops


# --- Einsum ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "equation, shapes",
    [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
     ("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 7, 4)]),
     ("bhij,bhjd->bhid", [(2, 3, 5, 7), (2, 3, 7, 4)]),
     ("bid,bjd->bij", [(2, 5, 3), (2, 4, 3)]),
     ("ij,jk->ik", [(3, 4), (4, 5)]),
     ("bnd,dk->bnk", [(2, 5, 3), (3, 7)]),
     ("...ij,...jk->...ik", [(2, 1, 4, 5), (1, 3, 5, 6)]),
     ("bij->bji", [(2, 3, 5)]),
     ("ii->i", [(4, 4)]),
     ("i,i->", [(5,), (5,)]),
     ("i,j->ij", [(3,), (4,)]),
     ("bshd,bthd->bhst", [(2, 5, 3, 4), (2, 6, 3, 4)]),
     ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
     ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
     ("abc->ca", [(2, 3, 4)]),
     ("bi,bi->b", [(3, 5), (3, 5)]),
     ("bkj,bik->bji", [(2, 4, 3), (2, 5, 4)])],
)
def test_einsum(equation, shapes):
    inputs = {f"x{i}": rng.randn(*s) for i, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(inputs), ["y"], equation=equation)
    _, ops = check_nodes([node], inputs, opset=12)
    assert not any("Einsum" in op for op in ops), ops


@pytest.mark.parametrize(
    "equation", ["bchw,cd->bdhw", "bchw,bchw->bhw", "bchw->bhwc", "bchw,dc->bdhw"]
)
def test_einsum_reads_channel_last_inputs(equation):
    shapes = {"b": 2, "c": 3, "h": 5, "w": 4, "d": 6}
    terms = equation.split("->")[0].split(",")
    inputs = {f"x{i}": rng.randn(*[shapes[c] for c in t]) for i, t in enumerate(terms)}
    node = helper.make_node("Einsum", list(inputs), ["y"], equation=equation)
    rank4 = [n for n, a in inputs.items() if a.ndim == 4]
    check_nodes([node], inputs, opset=12, keep_nwc_or_nhwc_or_ndhwc_input_names=rank4)


# --- attention ---------------------------------------------------------------------------


@pytest.mark.parametrize("k_perms", [[[0, 2, 3, 1]], [[0, 2, 1, 3], [0, 1, 3, 2]]])
def test_attention_block_matches_onnxruntime_with_no_extra_transpose(k_perms):
    """K^T either as one Transpose(0,2,3,1) or as heads-first then last-two-swapped."""
    batch, seq, heads, dim = 2, 5, 3, 4
    embed = heads * dim
    x = rng.randn(batch, seq, embed)
    inits = {f"w{n}": rng.randn(embed, embed) / 4 for n in "qkvo"}
    inits["heads_shape"] = np.array([batch, seq, heads, dim], np.int64)
    inits["merged_shape"] = np.array([batch, seq, embed], np.int64)
    inits["scale"] = np.array(dim ** -0.5, np.float32)
    node = helper.make_node
    nodes = [node("MatMul", ["x", f"w{n}"], [f"{n}_proj"]) for n in "qkv"]
    nodes += [node("Reshape", [f"{n}_proj", "heads_shape"], [f"{n}_heads"]) for n in "qv"]
    nodes.append(node("Reshape", ["k_proj", "heads_shape"], ["k0"]))
    nodes += [
        node("Transpose", ["q_heads"], ["q"], perm=[0, 2, 1, 3]),
        *[node("Transpose", [f"k{i}"], [f"k{i + 1}"], perm=p) for i, p in enumerate(k_perms)],
        node("Transpose", ["v_heads"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", f"k{len(k_perms)}"], ["scores"]),
        node("Mul", ["scores", "scale"], ["scaled"]),
        node("Softmax", ["scaled"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v"], ["context"]),
        node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["context_t", "merged_shape"], ["merged"]),
        node("MatMul", ["merged", "wo"], ["y"]),
    ]
    _, ops = check_nodes(nodes, {"x": x}, inits, 13, outputs=["y"])
    onnx_transposes = sum(n.op_type == "Transpose" for n in nodes)
    print(f"attention: TFLite TRANSPOSE {ops.get('TRANSPOSE', 0)}, ONNX Transpose "
          f"{onnx_transposes}; TFLite ops {ops}")
    assert ops.get("TRANSPOSE", 0) <= onnx_transposes, ops
