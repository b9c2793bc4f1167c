"""Elementwise math, casts and pass-through ops: layout-agnostic, so they run on whatever
layout their inputs arrive in.

TFLite builtins cover few dtypes (most arithmetic only float32, int32 and int64), so inputs
are first widened to a dtype they do cover (`widen`, ops/_dtypes.py); the builder casts each
result back to its ONNX dtype, which wraps integers exactly like the narrow arithmetic would.
Functions TFLite lacks (tan, the inverse and hyperbolic trigonometry, erf, int64 and
uint64 division, int64 powers) are composed from builtins (erf in ops/_erf.py, integer
division in ops/_integers.py); uint64 runs on its bits as int64 (BITCAST). float64 math
stays float64: exact in TF, Select TF ops in TFLite.

Python scalars only ever stand right of a tensor (`x * 0.5`, not `0.5 * x`): a reloaded
.h5 / .keras model converts a left-hand scalar with TF's default dtype, not the tensor's.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import helper

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import Decision, agnostic, custom_policy
from onnx2tf_alt.tflite import direct as direct_writer
from onnx2tf_alt.translate.lazy import call, tf
from onnx2tf_alt.translate.registry import direct, handler

from ._dtypes import from_ordered, ordered, widen
from ._elementwise_common import binary, unary
from ._erf import erf
from ._integers import int_div, trunc_mod, uint64_divmod


def modular(fn):
    """fn(a, b) that also takes uint64: two's complement add, sub and mul wrap like
    unsigned ones, so they run on the int64 bits."""

    def apply(a, b):
        if a.dtype != tf.uint64:
            return fn(a, b)
        result = fn(tf.bitcast(a, tf.int64), tf.bitcast(b, tf.int64))
        return tf.bitcast(result, tf.uint64)

    return apply


def _fold(ctx, fn, prepare=widen):
    return functools.reduce(fn, [prepare(ctx.x(i)) for i in range(ctx.num_inputs)])


def variadic(op_type: str, fn, limits: str = "") -> None:
    """Register an N-input broadcasting op (N >= 1) as a left fold of `fn`."""
    handler(op_type, layout=agnostic, limits=limits)(lambda ctx: _fold(ctx, fn))


def extremum(op_type: str, fn) -> None:
    """Max / Min: a fold on order-preserving values (uint64 included)."""
    handler(op_type, layout=agnostic, limits="NaN propagation as TF / TFLite")(
        lambda ctx: from_ordered(_fold(ctx, fn, ordered), ctx.x(0).dtype)
    )


# --- integer helpers -------------------------------------------------------------------------
def abs_(x):
    if x.dtype.is_unsigned:
        return x
    return tf.maximum(x, -x) if x.dtype == tf.int64 else tf.abs(x)  # no int64 ABS in TFLite


def sign(x):
    if x.dtype != tf.int64:
        return tf.sign(x)
    return tf.cast(x > 0, x.dtype) - tf.cast(x < 0, x.dtype)  # no int64 SIGN in TFLite


def _int64_power(x, e):
    """x ** e for int64 and e >= 0 by repeated squaring (TFLite has no int64 POW).
    Exponents above 63 overflow unless |x| <= 1, so they become 62 or 63 (same parity)."""
    e = tf.minimum(e, tf.math.floormod(e, 2) + 62)
    result, square = tf.ones_like(x), x
    for bit in range(6):
        on = tf.math.floormod(e, 2 ** (bit + 1)) >= 2**bit
        result = tf.where(on, result * square, result)
        square = square * square
    return result


def _int_pow(x, e):
    """x ** e for integer x and e; negative exponents truncate like onnxruntime's
    static_cast(pow(x, e)): 0 unless |x| == 1 (TFLite POW rejects them)."""
    e = tf.cast(e, x.dtype)
    exponent = tf.maximum(e, 0)
    power = _int64_power(x, exponent) if x.dtype == tf.int64 else tf.pow(x, exponent)
    odd = tf.equal(tf.math.floormod(e, 2), 1)
    inverse = tf.where(tf.equal(abs_(x), 1), tf.where(odd, x, tf.ones_like(x)), tf.zeros_like(x))
    return tf.where(e < 0, inverse, power)


# --- composed float functions ----------------------------------------------------------------
def _sqrt_one_minus_square(x):
    return tf.sqrt((x + 1) * -(x - 1))


_UNARY = {
    "Exp": call("exp"),
    "Log": call("math.log"),
    "Sqrt": call("sqrt"),
    "Reciprocal": call("math.reciprocal"),
    "Neg": call("negative"),
    "Abs": abs_,
    "Floor": call("floor"),
    "Ceil": call("math.ceil"),
    "Round": call("round"),  # half to even, as ONNX and TFLite ROUND
    "Sign": sign,
    "Sin": call("sin"),
    "Cos": call("cos"),
    "Tan": lambda x: tf.sin(x) / tf.cos(x),
    "Asin": lambda x: tf.math.atan2(x, _sqrt_one_minus_square(x)),
    "Acos": lambda x: tf.math.atan2(_sqrt_one_minus_square(x), x),
    "Atan": lambda x: tf.math.atan2(x, tf.ones_like(x)),
    "Sinh": lambda x: (tf.exp(x) - tf.exp(-x)) * 0.5,
    "Cosh": lambda x: (tf.exp(x) + tf.exp(-x)) * 0.5,
    "Asinh": lambda x: tf.sign(x) * tf.math.log(tf.abs(x) + tf.sqrt(x * x + 1)),
    "Acosh": lambda x: tf.math.log(x + tf.sqrt((x - 1) * (x + 1))),
    "Atanh": lambda x: tf.math.log((x + 1) / -(x - 1)) * 0.5,
    "Erf": erf,
    "IsNaN": lambda x: tf.not_equal(x, x),
    "Identity": call("identity"),
}
_UNARY_LIMITS = {
    "Sinh": "overflows to inf from |x| > 88.7 (exact: 89.4)",
    "Cosh": "overflows to inf from |x| > 88.7 (exact: 89.4)",
    "Asinh": "|x| > 1.8e19 overflows to inf",
    "Acosh": "x > 1.8e19 overflows to inf",
}
for _op, _fn in _UNARY.items():
    unary(_op, _fn, limits=_UNARY_LIMITS.get(_op, ""))
for _op, _builtin in (("Exp", "EXP"), ("Log", "LOG"), ("Sqrt", "SQRT"), ("Neg", "NEG"),
                      ("Abs", "ABS"), ("Floor", "FLOOR"), ("Ceil", "CEIL"), ("Round", "ROUND"),
                      ("Sign", "SIGN"), ("Sin", "SIN"), ("Cos", "COS")):
    direct(_op)(functools.partial(direct_writer.unary, name=_builtin))


# --- binary and variadic ---------------------------------------------------------------------
def _infinite_constant_kept(fn):
    """Add / Sub as `fn`, keeping a constant operand's infinities in TFLite.

    The TFLite converter stores an infinite constant as the largest finite float (an additive
    -inf mask would then leave finite scores). So the op runs with +-max in place of each
    infinity, and the result is then doubled where the constant was infinite, which
    overflows to +-inf at run time (a select keeps the converter from folding it back).
    """

    def convert(ctx):
        a, b = widen(ctx.x(0)), widen(ctx.x(1))
        for i, c in enumerate((a, b)):
            value = ctx.const(i)
            if value is None and isinstance(c, tf.__internal__.EagerTensor):
                value = c.numpy()  # computed at conversion time from constants
            if value is None or value.dtype.kind != "f" or not np.isinf(value).any():
                continue
            infinite = tf.math.is_inf(c)
            finite = tf.where(infinite, tf.sign(c) * c.dtype.max, c)
            y = fn(finite, b) if i == 0 else fn(a, finite)
            return y + tf.where(infinite, y, tf.zeros([], y.dtype))
        return fn(a, b)

    return convert


_INF_LIMIT = "a constant infinity meeting a run-time infinity gives an infinity, not NaN"
handler("Add", layout=agnostic, limits=_INF_LIMIT)(_infinite_constant_kept(modular(call("add"))))
handler("Sub", layout=agnostic, limits=_INF_LIMIT)(_infinite_constant_kept(modular(call("subtract"))))
binary("Mul", modular(call("multiply")))
binary(
    "Div",
    lambda a, b: int_div(a, b) if a.dtype.is_integer else tf.divide(a, b),
    limits="integers round toward zero (C semantics, as onnxruntime)",
)
# The direct writer keeps a constant's infinities as they are (TF's converter does not).
for _op, _builtin in (("Add", "ADD"), ("Sub", "SUB"), ("Mul", "MUL"), ("Div", "DIV")):
    direct(_op)(functools.partial(direct_writer.binary, name=_builtin))
variadic("Sum", call("add"))
extremum("Max", call("maximum"))
extremum("Min", call("minimum"))


def _extremum_direct(ctx, name: str) -> int:
    if ctx.num_inputs != 2:
        raise direct_writer.NotCovered("Max / Min of other than two inputs")
    return direct_writer.binary(ctx, name)


direct("Max")(functools.partial(_extremum_direct, name="MAXIMUM"))
direct("Min")(functools.partial(_extremum_direct, name="MINIMUM"))
handler("Mean", layout=agnostic)(lambda ctx: _fold(ctx, call("add")) / ctx.num_inputs)


@handler("Mod", layout=agnostic)
def mod(ctx):
    """fmod=0: sign of the divisor (Python %); fmod=1: sign of the dividend (C fmod)."""
    a, b = widen(ctx.x(0)), widen(ctx.x(1))
    if a.dtype == tf.uint64:
        return uint64_divmod(a, b)[1]  # both modes agree on unsigned values
    return trunc_mod(a, b) if ctx.attr("fmod", 0) else tf.math.floormod(a, b)


# x ** 2 as MUL, not SQUARE: TFLite's converter fuses SQUARE(a - b) into SQUARED_DIFFERENCE,
# whose kernel has no INT16-activation variant (a decomposed LayerNorm's INT16 file cannot
# run); MUL(d, d) reuses the SUB the normalization computes anyway: same op count
_POW_SHORTCUTS = {1.0: call("identity"), 2.0: lambda x: x * x, 0.5: call("sqrt"),
                  -1.0: call("math.reciprocal")}
_POW_MUL_LIMIT = 64  # -rtpo: |integer exponents| up to this become MULs (at most 11)


def _repeated_mul(x, n: int):
    """x ** n for an integer 0 < |n| <= _POW_MUL_LIMIT by square-and-multiply with MUL (a
    DIV more for n < 0): what -rtpo Pow makes instead of POW or SQUARE."""
    result, square, k = None, x, abs(n)
    while k:
        if k & 1:
            result = square if result is None else result * square
        k >>= 1
        if k:
            square = square * square
    return result if n > 0 else tf.math.reciprocal(result)


@handler(
    "Pow",
    layout=agnostic,
    limits="integer results beyond 2^53: exact here, rounded through double by onnxruntime",
)
def pow_(ctx):
    x = widen(ctx.x(0))
    e = ctx.const(1)
    if x.dtype.is_floating and e is not None and e.size == 1:
        exponent = float(e.reshape(-1)[0])
        if (ctx.options.replaces("Pow") and exponent.is_integer()
                and 0 < abs(exponent) <= _POW_MUL_LIMIT):
            return _repeated_mul(x, int(exponent))
        shortcut = _POW_SHORTCUTS.get(exponent)
        if shortcut is not None:
            return shortcut(x)
    e = widen(ctx.x(1))
    if e.dtype == tf.uint64:
        e = tf.bitcast(e, tf.int64)  # TFLite cannot CAST uint64; exponents are < 2^63
    if x.dtype.is_floating:
        return tf.pow(x, tf.cast(e, x.dtype))
    if e.dtype.is_integer:
        return _int_pow(x, e)
    return tf.pow(tf.cast(x, e.dtype), e)  # the builder truncates back to the integer type


@direct("Pow")
def pow_direct(ctx):
    """pow_ on float32 with a constant scalar exponent: its shortcuts (MUL for 2, SQRT for
    0.5), else POW."""
    e = ctx.const(1)
    if ctx.options.replaces("Pow"):
        raise direct_writer.NotCovered("-rtpo Pow")
    if e is None or e.size != 1:
        raise direct_writer.NotCovered("a run-time or non-scalar exponent")
    exponent = float(e.reshape(-1)[0])
    if exponent in (1.0, -1.0):
        raise direct_writer.NotCovered(f"an exponent of {exponent:g}")
    x, out = ctx.x(0), ctx.output()
    if exponent == 2.0:
        ctx.op("MUL", [x, x], out, direct_writer.options("MulOptions", fusedActivationFunction=0))
    elif exponent == 0.5:
        ctx.op("SQRT", [x], out)
    else:
        ctx.op("POW", [x, ctx.weight(e.astype(np.float32), "exponent")], out)
    return out


@handler("IsInf", layout=agnostic)
def is_inf(ctx):
    """Compares with the largest finite value: TFLite EQUAL with an inf constant is false."""
    x = widen(ctx.x(0))
    largest = float(np.finfo(x.dtype.as_numpy_dtype).max)
    positive, negative = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if positive and negative:
        return tf.abs(x) > largest
    if positive:
        return x > largest
    if negative:
        return x < -largest
    return tf.zeros_like(x, dtype=tf.bool)


# --- casts and pass-through ------------------------------------------------------------------
# 4-bit integers: TF casts them only from and to their 8-bit counterparts.
_FOUR_BIT = {"int4": "int8", "uint4": "uint8"}


def cast_to(x, dtype: np.dtype):
    """tf.cast; float -> int truncates toward zero, as onnxruntime's static_cast."""
    try:
        target = tf.as_dtype(np.dtype(dtype))
    except TypeError:
        raise NotImplementedError(f"Cast to {dtype} is not supported") from None
    if x.dtype.name in _FOUR_BIT and target != _FOUR_BIT[x.dtype.name]:
        x = tf.cast(x, _FOUR_BIT[x.dtype.name])
    if target.name in _FOUR_BIT and x.dtype != target:
        return tf.cast(_wrap_to_four_bits(x, target.name == "int4"), target)
    return tf.cast(x, target)


def _wrap_to_four_bits(x, signed: bool):
    """x as int8 / uint8 holding its low 4 bits (sign-extended when `signed`), floats first
    rounded half away from zero: what onnxruntime's Cast to INT4 / UINT4 computes."""
    if x.dtype.is_floating:
        x = tf.sign(x) * tf.floor(tf.abs(x) + 0.5)
    low = tf.bitwise.bitwise_and(tf.cast(x, tf.int32), 15)
    if signed:
        return tf.cast(low - 16 * tf.cast(low > 7, tf.int32), tf.int8)
    return tf.cast(low, tf.uint8)


@handler("Cast", layout=agnostic,
         limits="numeric and bool targets (INT4/UINT4: TF model only, TFLite has no 4-bit "
                "type); no float8, no strings")
def cast(ctx):
    target = ctx.out_dtype()
    if target is None:
        target = helper.tensor_dtype_to_np_dtype(ctx.attr("to"))
    return cast_to(ctx.x(0), target)


@custom_policy
def _first_input_only(node, graph, in_perms) -> Decision:
    """CastLike reads only the dtype of its second input: its data keeps its own layout."""
    outs = [in_perms[0]] + [P.identity(graph.rank(o) or 0) for o in node.outputs[1:]]
    return Decision([in_perms[0], *[None] * (len(in_perms) - 1)], outs)


@handler("CastLike", layout=_first_input_only,
         limits="numeric and bool targets (INT4/UINT4: TF model only, TFLite has no 4-bit "
                "type); no float8, no strings")
def cast_like(ctx):
    return cast_to(ctx.x(0), ctx.dtype(1))


@handler("BitCast", since=26)
def bit_cast(ctx):
    x = ctx.x(0)
    to = tf.as_dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("to")))
    if tf.bool in (to, x.dtype):  # one byte holding 0 or 1; tf.bitcast has no bool
        return tf.cast(x, to)
    return tf.bitcast(x, to)


def _dropout(ctx, mask: bool):
    """Identity in inference; with training_mode (constant or run-time) true, elements are
    zeroed with probability `ratio` and the rest scaled by 1 / (1 - ratio)."""
    x = ctx.x(0)
    training = ctx.const(2) if ctx.has(2) else False
    want_mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    if training is not None and not bool(training):
        outputs = [tf.identity(x)]
        if want_mask:
            like = tf.ones_like if mask else tf.zeros_like
            outputs.append(like(x, dtype=tf.bool))
        return outputs
    ratio = ctx.x(1) if ctx.has(1) else tf.constant(0.5)
    ratio = tf.cast(tf.reshape(ratio, []), x.dtype)
    keep = tf.random.uniform(tf.shape(x), dtype=x.dtype) >= ratio
    y = tf.where(keep, x / (1 - ratio), tf.zeros_like(x))
    if training is None:  # run-time flag: keep everything when it is false
        on = tf.reshape(tf.cast(ctx.x(2), tf.bool), [])
        y = tf.where(on, y, x)
        keep = tf.logical_or(keep, tf.logical_not(on))
    return [y, keep] if want_mask else [y]


@handler("Dropout", layout=agnostic)
def dropout(ctx):
    """Inference: identity; before opset 12 onnxruntime returns an all-False mask."""
    return _dropout(ctx, mask=False)


@handler("Dropout", since=12, layout=agnostic,
         limits="training_mode true draws a new mask per run (RANDOM_UNIFORM)")
def dropout_12(ctx):
    """Inference: identity; the optional mask is all True."""
    return _dropout(ctx, mask=True)
