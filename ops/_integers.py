"""Shared integer arithmetic TFLite has no builtin for, composed from its builtins: int64
and uint64 division and remainders (uint64 runs on its bits as int64)."""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.translate.lazy import tf

from ._dtypes import INT64_MIN, ordered


def trunc_mod(a, b):
    """Remainder with the sign of the dividend (C fmod), from FLOOR_MOD."""
    r = tf.math.floormod(a, b)
    wrong_sign = tf.logical_and(tf.not_equal(r, 0), tf.not_equal(r < 0, a < 0))
    return tf.where(wrong_sign, r - b, r)


def _int64_truncdiv(a, b, remainder):
    """Exact a / b rounded toward zero for int64, from builtins TFLite has for int64 (MUL,
    SUB, CAST): a - remainder is an exact multiple of b no larger than a, whose quotient a
    float32 estimate finds; each refinement shrinks the error about 2^22-fold, so three
    reach it for any int64."""
    rest = a - remainder
    divisor = tf.cast(b, tf.float32)
    quotient = tf.zeros_like(rest)
    for _ in range(3):
        step = tf.cast(tf.round(tf.cast(rest, tf.float32) / divisor), tf.int64)
        quotient += step
        rest -= step * b
    return quotient


def int_div(a, b):
    """Integer division rounding toward zero, as onnxruntime (C++) computes it."""
    if a.dtype == tf.uint64:
        return uint64_divmod(a, b)[0]
    if a.dtype != tf.int64:
        return tf.truncatediv(a, b)  # TFLite DIV truncates for int32
    return _int64_truncdiv(a, b, trunc_mod(a, b))


def uint64_halve(s):
    """(u >> 1, u & 1) as non-negative int64, for the uint64 u whose bits int64 `s` holds:
    an arithmetic halving, then the top bit cleared (adding 2^63 wraps to that)."""
    low = tf.math.floormod(s, np.int64(2))  # the lowest bit, whatever the sign
    half = _int64_truncdiv(s, np.int64(2), low)
    return tf.where(s < 0, half + INT64_MIN, half), low


def uint64_divmod(a, b):
    """(a // b, a % b) for uint64 from int64 builtins (TFLite has no uint64 arithmetic).

    Divisors of 2^63 and more go into a at most once. Smaller ones divide a >> 1 (which
    fits int64) exactly; the remainder doubled plus a's last bit is below 2 b < 2^64, so
    one unsigned comparison (on `ordered` values) gives the last quotient bit.
    """
    s, d = tf.bitcast(a, tf.int64), tf.bitcast(b, tf.int64)
    once = tf.cast(ordered(a) >= ordered(b), tf.int64)
    divisor = tf.where(d > 0, d, tf.ones_like(d))  # d <= 0: 2^63 and more (or zero)
    half, low = uint64_halve(s)
    rest = tf.math.floormod(half, divisor)
    twice = rest * 2 + low
    carry = tf.cast(tf.logical_or(twice < 0, twice >= divisor), tf.int64)
    big = d <= 0
    quotient = tf.where(big, once, _int64_truncdiv(half, divisor, rest) * 2 + carry)
    remainder = tf.where(big, s - once * d, twice - carry * divisor)
    return tf.bitcast(quotient, tf.uint64), tf.bitcast(remainder, tf.uint64)


def int64_floordiv(a, b):
    """floor(a / b) for int64 (no int64 FLOOR_DIV in TFLite)."""
    remainder = trunc_mod(a, b)
    inexact_negative = tf.logical_and(tf.not_equal(remainder, 0), tf.not_equal(a < 0, b < 0))
    return _int64_truncdiv(a, b, remainder) - tf.cast(inexact_negative, tf.int64)
