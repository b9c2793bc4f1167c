"""Linear algebra: Det.

TFLite has no determinant builtin (tf.linalg.det needs Flex), so small matrices use cofactor
expansion over their elements, and larger ones Gaussian elimination with partial pivoting,
unrolled over the static size with ARG_MAX, ONE_HOT and elementwise builtins.
"""

from __future__ import annotations

import itertools

from onnx2tf_alt.translate.context import reshape
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

COFACTOR_MAX = 4  # larger matrices are eliminated instead


def _cofactor_det(rows: list[list]):
    """Laplace expansion along the rows, sharing the minors of the lower rows."""
    n = len(rows)
    minors = {(c,): rows[n - 1][c] for c in range(n)}  # columns used by the last rows
    for size in range(2, n + 1):
        row = rows[n - size]
        for cols in itertools.combinations(range(n), size):
            terms = [row[c] * minors[cols[:i] + cols[i + 1:]] for i, c in enumerate(cols)]
            total = terms[0]
            for i, term in enumerate(terms[1:], 1):
                total = total - term if i % 2 else total + term
            minors[cols] = total
    return minors[tuple(range(n))]


def _eliminate_det(a, n: int):
    """det of (batch, n, n) by elimination with partial pivoting: product of the pivots,
    negated once per row swap."""
    det = None
    for k in range(n):
        m = n - k
        pivot_at = tf.one_hot(tf.argmax(tf.abs(a[:, :, 0]), axis=1), m, dtype=a.dtype)
        pivot_row = tf.reduce_sum(tf.expand_dims(pivot_at, -1) * a, 1)  # (batch, m)
        pivot = pivot_row[:, 0]
        sign = 2 * pivot_at[:, 0] - 1  # +1 when row 0 holds the pivot already, else -1
        factor = pivot * sign
        det = factor if det is None else det * factor
        if m == 1:
            break
        # swap rows 0 and p, then subtract multiples of the pivot row below it
        first_row = a[:, 0, :]
        swapped = a[:, 1:, :] + tf.expand_dims(pivot_at[:, 1:], -1) * tf.expand_dims(
            first_row - pivot_row, 1)
        safe = tf.where(tf.equal(pivot, 0), tf.ones_like(pivot), pivot)
        ratio = swapped[:, :, 0] / tf.expand_dims(safe, -1)
        a = swapped[:, :, 1:] - tf.expand_dims(ratio, -1) * tf.expand_dims(pivot_row[:, 1:], 1)
    return det


@handler("Det", since=11, limits="static matrix size")
def det(ctx):
    shape = ctx.shape(0)
    n = shape[-1]
    if n is None:
        raise NotImplementedError("Det of matrices of unknown size")
    x = ctx.x(0)
    if x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    if n <= COFACTOR_MAX:
        elements = tf.unstack(reshape(x, [*shape[:-2], n * n]), axis=-1)
        return _cofactor_det([elements[i * n:(i + 1) * n] for i in range(n)])
    result = _eliminate_det(tf.reshape(x, [-1, n, n]), n)
    return tf.reshape(result, tf.shape(x)[:-2]) if None in shape else tf.reshape(
        result, shape[:-2])
