"""Matrix products: MatMul, Gemm and Einsum, as TFLite BATCH_MATMUL / FULLY_CONNECTED.

An operand whose layout only swaps its last two logical axes is used as it is, with the
matmul's transpose flag set instead of a TRANSPOSE op; this makes the K^T of attention free.
Einsum is translated into transposes, reshapes and one matmul per pair of operands (or a
broadcast multiply and a sum when nothing is contracted), never tf.einsum, which TFLite
lacks.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import CUSTOM, Decision, LayoutPolicy, custom_policy
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from ._dtypes import rounded_matmul
from ._matmul_common import operand, swaps_last_two
from ._shapes import dims_of


def _identity_outputs(node, graph) -> list:
    return [P.identity(graph.rank(o) or 0) for o in node.outputs]


def matmul_operands(*operands: int):
    """Layout of matrix products: the listed inputs are taken in identity or last-two-swapped
    perm, as they arrive; every other input and the outputs are identity."""

    def policy(node, graph, in_perms):
        wanted = [
            None if p is None
            else p if i in operands and swaps_last_two(p)
            else P.identity(len(p))
            for i, p in enumerate(in_perms)
        ]
        return Decision(wanted, _identity_outputs(node, graph))

    return LayoutPolicy(CUSTOM, "matmul_operands", policy)


@custom_policy
def as_arrived(node, graph, in_perms):
    """Every input in the perm it already has (the handler reads axes through it);
    outputs identity."""
    return Decision(list(in_perms), _identity_outputs(node, graph))


@handler("MatMul", since=1, layout=matmul_operands(0, 1))
def matmul(ctx):
    """numpy matmul: batch axes broadcast; a 1-D operand gets a unit axis, dropped after."""
    a, ta = operand(ctx, 0)
    b, tb = operand(ctx, 1)
    a_vector, b_vector = ctx.rank(0) == 1, ctx.rank(1) == 1
    if a_vector and ctx.rank(1) == 2:
        # TFLite cannot lower a row vector times a matrix to a 1-D result; b^T a it can.
        return tf.squeeze(tf.linalg.matmul(b, tf.expand_dims(a, 1), transpose_a=not tb), -1)
    if a_vector:
        a = tf.expand_dims(a, 0)
    if b_vector:
        b = tf.expand_dims(b, 1)
    y = rounded_matmul(a, b, transpose_a=ta, transpose_b=tb)
    if a_vector:
        y = tf.squeeze(y, -2)
    if b_vector:
        y = tf.squeeze(y, -1)
    return y


def _dense_direct(ctx, weights: np.ndarray, bias: np.ndarray | None) -> int:
    """FULLY_CONNECTED of input 0 (as it arrived, its last two axes not swapped) with
    `weights` (K, N) and `bias` (N), keeping input 0's leading axes."""
    if swaps_last_two(ctx.perm(0)):
        raise NotCovered("an operand with its last two axes swapped")
    out = ctx.output()
    inputs = [ctx.x(0), ctx.weight(np.asarray(weights, np.float32).T)]  # a view: written
    # a block of rows at a time (tflite/flatgraph.ArrayBuffer), never copied whole
    if bias is not None:
        inputs.append(ctx.weight(np.asarray(bias, np.float32), "bias"))
    ctx.op("FULLY_CONNECTED", inputs, out, options(
        "FullyConnectedOptions", fusedActivationFunction=0, keepNumDims=ctx.rank(0) > 2))
    return out


@direct("MatMul", since=1)
def matmul_direct(ctx):
    """FULLY_CONNECTED with constant 2-D weights, else BATCH_MATMUL of operands as they
    arrived (their swapped last two axes as adjoint flags), both of rank 2 or more."""
    w = ctx.const(1)
    if ctx.rank(0) < 2 or ctx.rank(1) < 2:
        raise NotCovered("a product with a vector")
    if w is not None and w.ndim == 2 and not swaps_last_two(ctx.perm(0)):
        return _dense_direct(ctx, w, None)
    out = ctx.output()
    ctx.op("BATCH_MATMUL", [ctx.x(0), ctx.x(1)], out, options(
        "BatchMatMulOptions", adjX=swaps_last_two(ctx.perm(0)),
        adjY=swaps_last_two(ctx.perm(1))))
    return out


@direct("Gemm", since=1)
def gemm_direct(ctx):
    """gemm with a constant B and C of one row (or a scalar), A not transposed."""
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    w, c = ctx.const(1), ctx.const(2) if ctx.has(2) else None
    if w is None or ctx.attr("transA", 0) or (ctx.has(2) and c is None):
        raise NotCovered("transA, or run-time B or C")
    w = w.T if ctx.attr("transB", 0) else w
    if alpha != 1:  # a copy: only where it changes the values (a 537 MB weight counts twice)
        w = w * np.float32(alpha)
    bias = None
    if c is not None and beta != 0:
        if c.size not in (1, w.shape[1]) or (c.ndim == 2 and c.shape[0] != 1):
            raise NotCovered("a C of several rows")
        bias = np.broadcast_to(c.reshape(-1) * np.float32(beta), (w.shape[1],))
    return _dense_direct(ctx, w, bias)


@handler("Gemm", since=1, layout=matmul_operands(0, 1))
def gemm(ctx):
    """alpha * A' B' + beta * C; constant B (and C) are transposed and scaled in numpy, so
    TFLite sees a plain FULLY_CONNECTED."""
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    a, ta = operand(ctx, 0)
    ta ^= bool(ctx.attr("transA", 0))
    trans_b = bool(ctx.attr("transB", 0))
    w = ctx.const(1)
    if w is not None:
        w = w.T if trans_b else w
        b, tb = ctx.const_tensor((w * alpha).astype(w.dtype) if alpha != 1 else w), False
        alpha = 1.0
    else:
        b, tb = operand(ctx, 1)
        tb ^= trans_b
    y = tf.linalg.matmul(a, b, transpose_a=ta, transpose_b=tb)
    if alpha != 1:
        y = y * tf.constant(alpha, y.dtype)
    if ctx.has(2) and beta != 0:
        c = ctx.const(2)
        if c is not None:
            y = y + ctx.const_tensor((c * beta).astype(c.dtype) if beta != 1 else c)
        else:
            y = y + (ctx.x(2) * tf.constant(beta, y.dtype) if beta != 1 else ctx.x(2))
    return y


# --- Einsum ----------------------------------------------------------------------------


def parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], list[str], str]:
    """(letters of each operand, unit-axis letters to prepend to each, output letters).

    "..." becomes private letters. Ellipsis axes broadcast right-aligned: an operand with
    fewer of them gets the trailing ones, plus leading unit axes for the rest, so that they
    are batch axes of the matmul. Implicit output: the ellipsis, then the letters seen
    once, sorted.
    """
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum '{equation}' has {len(terms)} operands, node has {len(ranks)}")
    widths = [rank - (len(t) - 3) if "..." in t else None for t, rank in zip(terms, ranks)]
    ellipsis = "".join(chr(0x100 + k) for k in range(max([w or 0 for w in widths], default=0)))
    letters, pads = [], []
    for term, width in zip(terms, widths):
        split = len(ellipsis) - (width or 0)
        letters.append(term.replace("...", ellipsis[split:]))
        pads.append(ellipsis[:split] if width is not None else "")
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:
        named = lhs.replace("...", "").replace(",", "")
        out = ellipsis + "".join(sorted(c for c in set(named) if named.count(c) == 1))
    return letters, pads, out


def _product(dims: list):
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else tf.reduce_prod(
        tf.stack([tf.cast(d, tf.int32) for d in dims])
    )


def _reshape(x, dims: list):
    """tf.reshape to `dims` (ints or scalar tensors); -1 stands in for one unknown."""
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(unknown) <= 1:
        return tf.reshape(x, [-1 if i in unknown else d for i, d in enumerate(dims)])
    return tf.reshape(x, tf.stack([tf.cast(d, tf.int32) for d in dims]))


def _arrange(x, letters: str, order: list[str]):
    """x (axes named by `letters`) transposed into `order`; a reshape if only unit axes move."""
    move = [letters.index(c) for c in order]
    if move == sorted(move):
        return x
    if P.moves_only_unit_axes(tuple(x.shape.as_list()), move):
        return _reshape(x, [dims_of(x)[a] for a in move])
    return tf.transpose(x, move)


def _diagonals(x, letters: str, constant):
    """Take the diagonal of every letter repeated within one operand ("ii->i").

    `constant(array)` makes the identity mask a tensor (ctx.const_tensor).
    """
    for c in dict.fromkeys(letters):
        while letters.count(c) > 1:
            p = letters.index(c)
            q = letters.index(c, p + 1)
            size = x.shape[p]
            if size is None or size != x.shape[q]:
                raise NotImplementedError("einsum diagonal needs equal static dimensions")
            mask = np.eye(size, dtype=x.dtype.as_numpy_dtype)
            mask = mask.reshape([size if a in (p, q) else 1 for a in range(len(letters))])
            x = tf.reduce_sum(x * constant(mask), axis=q)
            letters = letters[:q] + letters[q + 1:]
    return x, letters


def _sum_out(x, letters: str, needed: set[str]):
    """Sum over the axes whose letters nothing later needs."""
    drop = [i for i, c in enumerate(letters) if c not in needed]
    if not drop:
        return x, letters
    return tf.reduce_sum(x, axis=drop), "".join(c for c in letters if c in needed)


def _as_matrices(x, letters: str, batch, rows, cols):
    """x as [batch..., rows, cols] (or its transpose, flag True, when that needs no move)."""
    if letters == "".join(batch + cols + rows) and letters != "".join(batch + rows + cols):
        rows, cols, flag = cols, rows, True
    else:
        flag = False
    x = _arrange(x, letters, batch + rows + cols)
    if len(rows) != 1 or len(cols) != 1:
        dims = dims_of(x)
        nb, nr = len(batch), len(rows)
        x = _reshape(x, [*dims[:nb], _product(dims[nb:nb + nr]), _product(dims[nb + nr:])])
    return x, flag


def _aligned(x, letters: str, order: list[str]):
    """x arranged into `order`, with a unit axis for each letter it lacks."""
    x = _arrange(x, letters, [c for c in order if c in letters])
    for i, c in enumerate(order):
        if c not in letters:
            x = tf.expand_dims(x, i)
    return x


def _contract(a, la: str, b, lb: str, keep: set[str], want: str | None):
    """Product of two operands summed over their shared letters not in `keep`.

    Returns (tensor, its letters); `want`, when given, is the order to aim for.
    """
    a, la = _sum_out(a, la, keep | set(lb))
    b, lb = _sum_out(b, lb, keep | set(la))
    batch = [c for c in la if c in lb and c in keep]
    contract = [c for c in la if c in lb and c not in keep]
    a_only = [c for c in la if c not in lb]
    b_only = [c for c in lb if c not in la]
    if not contract or not (a_only or b_only):
        order = batch + a_only + b_only
        if want is not None and sorted(want) == sorted(order):
            order = list(want)
        y = _aligned(a, la, order + contract) * _aligned(b, lb, order + contract)
        if contract:
            y = tf.reduce_sum(y, axis=list(range(len(order), len(order) + len(contract))))
        return y, "".join(order)
    if want is not None and list(want) == batch + b_only + a_only != batch + a_only + b_only:
        return _contract(b, lb, a, la, keep, want)
    a_mat, ta = _as_matrices(a, la, batch, a_only, contract)
    b_mat, tb = _as_matrices(b, lb, batch, contract, b_only)
    y = tf.linalg.matmul(a_mat, b_mat, transpose_a=ta, transpose_b=tb)
    if len(a_only) != 1 or len(b_only) != 1:
        a_dims, b_dims = dims_of(a), dims_of(b)
        y = _reshape(
            y,
            dims_of(y)[: len(batch)]
            + [a_dims[la.index(c)] for c in a_only]
            + [b_dims[lb.index(c)] for c in b_only],
        )
    return y, "".join(batch + a_only + b_only)


@handler("Einsum", since=12, layout=as_arrived,
         limits="diagonals (a letter repeated in one operand) need static dimensions")
def einsum(ctx):
    n = ctx.num_inputs
    terms, pads, out = parse_einsum(ctx.attr("equation"), [ctx.rank(i) for i in range(n)])
    operands = []
    for i, (term, pad) in enumerate(zip(terms, pads)):
        x = ctx.x(i)
        for _ in pad:
            x = tf.expand_dims(x, 0)
        letters = pad + "".join(term[a] for a in ctx.perm(i))
        operands.append(_diagonals(x, letters, ctx.const_tensor))
    y, letters = operands[0]
    for k, (x, lx) in enumerate(operands[1:], start=1):
        later = {c for _, lo in operands[k + 1:] for c in lo}
        want = out if k == n - 1 else None
        y, letters = _contract(y, letters, x, lx, set(out) | later, want)
    y, letters = _sum_out(y, letters, set(out))
    return _arrange(y, letters, list(out))
