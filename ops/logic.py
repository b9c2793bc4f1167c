"""Comparisons, boolean logic, Where and bitwise ops: layout-agnostic and broadcasting.

TFLite has BITWISE_XOR and RIGHT_SHIFT but no AND, OR, NOT or left shift, so those are
built from XOR, shifts and integer arithmetic on 32-bit lanes.
"""

from __future__ import annotations

from onnx2tf_alt.ops._dtypes import ordered, widen
from onnx2tf_alt.ops._elementwise_common import binary
from onnx2tf_alt.ops._integers import int64_floordiv, uint64_halve

from onnx2tf_alt.layout.policies import agnostic
from onnx2tf_alt.translate.lazy import call, tf
from onnx2tf_alt.translate.registry import handler

binary("Equal", call("equal"), prepare=ordered)
binary("Less", call("less"), prepare=ordered)
binary("LessOrEqual", call("less_equal"), prepare=ordered)
binary("Greater", call("greater"), prepare=ordered)
binary("GreaterOrEqual", call("greater_equal"), prepare=ordered)
binary("And", call("logical_and"))
binary("Or", call("logical_or"))
binary("Xor", call("not_equal"))
handler("Not", layout=agnostic)(lambda ctx: tf.logical_not(ctx.x(0)))


@handler("Where", layout=agnostic)
def where(ctx):
    return tf.where(ctx.x(0), widen(ctx.x(1)), widen(ctx.x(2)))


# --- bitwise ---------------------------------------------------------------------------------
def _to_lanes(x):
    """x's bits as int32: 64-bit values as lane pairs (a trailing axis of 2), 32-bit ones
    reinterpreted, narrower ones extended (the builder truncates the result back)."""
    if x.dtype == tf.int32:
        return x
    return tf.bitcast(x, tf.int32) if x.dtype.size >= 4 else tf.cast(x, tf.int32)


def _from_lanes(y, dtype: tf.DType):
    return tf.bitcast(y, dtype) if dtype.size >= 4 and dtype != tf.int32 else y


def _and(a, b):
    """a & b on int32 from a + b == (a ^ b) + 2 (a & b), applied to the upper 31 bits
    (a >> 1, b >> 1, whose sum cannot overflow) and to the lowest bit separately."""
    high_a, high_b = tf.bitwise.right_shift(a, 1), tf.bitwise.right_shift(b, 1)
    high = high_a + high_b - tf.bitwise.bitwise_xor(high_a, high_b)  # 2 (high_a & high_b)
    return high + (a - high_a * 2) * (b - high_b * 2)


def _or(a, b):
    return tf.bitwise.bitwise_xor(a, b) + _and(a, b)  # disjoint bits: the sum is the union


def _bitwise(op_type: str, fn) -> None:
    @handler(op_type, layout=agnostic)
    def convert(ctx):
        inputs = [ctx.x(i) for i in range(ctx.num_inputs)]
        return _from_lanes(fn(*map(_to_lanes, inputs)), inputs[0].dtype)


_bitwise("BitwiseAnd", _and)
_bitwise("BitwiseOr", _or)
_bitwise("BitwiseXor", call("bitwise.bitwise_xor"))
_bitwise("BitwiseNot", lambda x: tf.bitwise.bitwise_xor(x, -1))


def _power_of_two(amount):
    """2^amount as int64, for 0 <= amount <= 62."""
    return tf.cast(tf.pow(2.0, tf.cast(amount, tf.float32)), tf.int64)


def _shift_left(x, amount):
    """x * 2^amount in int64, wrapping (no LEFT_SHIFT builtin); the builder truncates
    narrower types back. int64 takes the scale in two factors that each fit int64; uint64
    wraps the same way on its int64 bits (returned as int64)."""
    if x.dtype == tf.uint64:
        return _shift_left(tf.bitcast(x, tf.int64), amount)
    if x.dtype != tf.int64:
        return tf.cast(x, tf.int64) * _power_of_two(amount)
    return x * _power_of_two(tf.minimum(amount, 31)) * _power_of_two(tf.maximum(amount - 31, 0))


def _shift_right(x, amount):
    """Arithmetic for signed x, logical for unsigned x (uint64: its bits as int64)."""
    if x.dtype == tf.int64:  # no int64 RIGHT_SHIFT: floor division by 2^amount
        return int64_floordiv(x, _power_of_two(amount))
    if x.dtype == tf.uint64:  # one logical halving makes it non-negative, then as int64
        bits = tf.bitcast(x, tf.int64)
        rest = int64_floordiv(uint64_halve(bits)[0], _power_of_two(tf.maximum(amount - 1, 0)))
        return tf.where(amount > 0, rest, bits)
    lanes = x.dtype if x.dtype == tf.uint32 else tf.int32
    return tf.bitwise.right_shift(tf.cast(x, lanes), tf.cast(amount, lanes))


@handler("BitShift", layout=agnostic)
def bit_shift(ctx):
    """Shift amounts outside [0, width) give the sign fill alone: -1 for a negative x shifted
    right, else 0 (ONNX; onnxruntime agrees for unsigned types)."""
    x, shift = ctx.x(0), ctx.x(1)
    shift = tf.cast(tf.bitcast(shift, tf.int64) if shift.dtype == tf.uint64 else shift, tf.int64)
    right = ctx.attr("direction") == "RIGHT"
    bits = x.dtype.size * 8
    if right and x.dtype == tf.int64:
        bits = 63  # x >> 63 is the sign fill too, and 2^63 does not fit the int64 divisor
    amount = tf.clip_by_value(shift, 0, bits - 1)
    shifted = _shift_right(x, amount) if right else _shift_left(x, amount)
    fill = tf.zeros_like(shifted)
    if right and not x.dtype.is_unsigned:
        fill = fill - tf.cast(widen(x) < 0, shifted.dtype)
    outside = tf.logical_or(shift < 0, shift >= bits)
    result = tf.where(outside, fill, shifted)  # TFLite has no uint64 SELECT: int64 bits
    return tf.bitcast(result, tf.uint64) if x.dtype == tf.uint64 else result
