"""Activations: layout-agnostic elementwise functions, written in the forms the TFLite
converter turns into its builtins (RELU, RELU6, LEAKY_RELU, PRELU, ELU, LOGISTIC, TANH,
HARD_SWISH, GELU).

With -rtpo (ctx.options.replaces), HardSwish, LeakyRelu, PRelu and Gelu are instead written
in forms the converter does not fuse: only ADD, MUL, MAXIMUM, MINIMUM, RELU(6), TANH, DIV,
which GPU and NNAPI delegates take (`_pseudo_*`).

Swish and SwiGLU are x * sigmoid(alpha * x) forms (SwiGLU times a second input)."""

from __future__ import annotations

import functools

import numpy as np
from onnx2tf_alt.ops._dtypes import widen
from onnx2tf_alt.ops._elementwise_common import unary
from onnx2tf_alt.ops._erf import erf

from onnx2tf_alt.layout.policies import agnostic
from onnx2tf_alt.tflite import direct as direct_writer
from onnx2tf_alt.translate.lazy import call, tf
from onnx2tf_alt.translate.registry import direct, handler


def relu(x):
    return tf.nn.relu(x) if x.dtype.is_floating else tf.maximum(x, tf.zeros_like(x))


def _log1p(u):
    """log(1 + u) for 0 <= u <= 1 with a small relative error: TFLite has no LOG1P, and
    LOG near 1 loses the digits of a small u, so below 0.01 a 4-term series replaces it."""
    series = (((u * -0.25 + 1 / 3) * u - 0.5) * u + 1) * u
    return tf.where(u < 0.01, series, tf.math.log(u + 1))


def softplus(x):
    """log(1 + exp(x)), without overflow (TFLite lowers tf.math.softplus to exactly that)
    and accurate in the far negative tail."""
    return tf.nn.relu(x) + _log1p(tf.exp(-tf.abs(x)))


def _elu(x, alpha: float):
    y = tf.nn.elu(x)
    return y if alpha == 1.0 else tf.where(x > 0, y, y * alpha)


unary("Relu", relu)
unary("Sigmoid", call("sigmoid"))
unary("Tanh", call("tanh"))
unary("Softplus", softplus)
unary("Softsign", call("nn.softsign"))
unary("Mish", lambda x: x * tf.tanh(softplus(x)))
for _op, _builtin in (("Relu", "RELU"), ("Sigmoid", "LOGISTIC"), ("Tanh", "TANH")):
    direct(_op)(functools.partial(direct_writer.unary, name=_builtin))


@handler("HardSwish", layout=agnostic)
def hard_swish(ctx):
    x = widen(ctx.x(0))
    if ctx.options.replaces("HardSwish"):  # (x / 6) first: not matched as HARD_SWISH
        return (x * (1 / 6)) * tf.nn.relu6(x + 3)
    return x * tf.nn.relu6(x + 3) * (1 / 6)


@direct("HardSwish")
def hard_swish_direct(ctx):
    if ctx.options.replaces("HardSwish"):
        raise direct_writer.NotCovered("-rtpo HardSwish")
    return direct_writer.unary(ctx, "HARD_SWISH")


def _pseudo_leaky_relu(x, alpha: float):
    """max(x, alpha x) where that is exact (0 <= alpha <= 1), else relu(x) + alpha min(x, 0)."""
    if 0 <= alpha <= 1:
        return tf.maximum(x, x * alpha)
    return tf.nn.relu(x) + tf.minimum(x, tf.zeros_like(x)) * alpha


@handler("LeakyRelu", layout=agnostic)
def leaky_relu(ctx):
    x, alpha = widen(ctx.x(0)), ctx.attr("alpha", 0.01)
    if ctx.options.replaces("LeakyRelu") and x.dtype.is_floating:
        return _pseudo_leaky_relu(x, alpha)
    return tf.nn.leaky_relu(x, alpha=alpha)


@direct("LeakyRelu")
def leaky_relu_direct(ctx):
    if ctx.options.replaces("LeakyRelu"):
        raise direct_writer.NotCovered("-rtpo LeakyRelu")
    out = ctx.output()
    ctx.op("LEAKY_RELU", [ctx.x(0)], out,
           direct_writer.options("LeakyReluOptions", alpha=float(ctx.attr("alpha", 0.01))))
    return out


@handler("Elu", layout=agnostic)
def elu(ctx):
    return _elu(widen(ctx.x(0)), ctx.attr("alpha", 1.0))


@handler("Selu", layout=agnostic)
def selu(ctx):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return _elu(widen(ctx.x(0)), alpha) * gamma


@handler("Celu", layout=agnostic)
def celu(ctx):
    alpha = ctx.attr("alpha", 1.0)
    return tf.nn.elu(widen(ctx.x(0)) / alpha) * alpha


@handler("HardSigmoid", layout=agnostic)
def hard_sigmoid(ctx):
    x = widen(ctx.x(0))
    return tf.minimum(tf.nn.relu(x * ctx.attr("alpha", 0.2) + ctx.attr("beta", 0.5)), 1.0)


@direct("HardSigmoid")
def hard_sigmoid_direct(ctx):
    """min(relu(x * alpha + beta), 1) as MUL, ADD (RELU fused) and MINIMUM."""
    shape, x = ctx.out_phys_shape(), ctx.x(0)
    scaled, shifted, rectified = (ctx.temp(shape, s) for s in ("scaled", "shifted", "relu"))
    ctx.op("MUL", [x, ctx.weight(np.float32(ctx.attr("alpha", 0.2)), "alpha")], scaled,
           direct_writer.options("MulOptions", fusedActivationFunction=0))
    ctx.op("ADD", [scaled, ctx.weight(np.float32(ctx.attr("beta", 0.5)), "beta")], shifted,
           direct_writer.options("AddOptions", fusedActivationFunction=0))
    ctx.op("RELU", [shifted], rectified)
    out = ctx.output()
    ctx.op("MINIMUM", [rectified, ctx.weight(np.float32(1.0), "one")], out)
    return out


def _pseudo_gelu(x, approximate: bool):
    """Gelu by its definition, with erf as the builtin polynomial (elementwise.erf); the
    tanh form is ordered so that the converter does not match it as GELU."""
    if approximate:
        return (tf.tanh((x + x * x * x * 0.044715) * float(np.sqrt(2 / np.pi))) + 1) * (x * 0.5)
    return (erf(x * float(np.sqrt(0.5))) + 1) * (x * 0.5)


def _gelu(ctx, approximate: bool):
    x = widen(ctx.x(0))
    if ctx.options.replaces("Gelu"):
        return _pseudo_gelu(x, approximate)
    return tf.nn.gelu(x, approximate=approximate)


def _gelu_direct(ctx, approximate: bool) -> int:
    if ctx.options.replaces("Gelu"):
        raise direct_writer.NotCovered("-rtpo Gelu")
    out = ctx.output()
    ctx.op("GELU", [ctx.x(0)], out, direct_writer.options("GeluOptions", approximate=approximate))
    return out


direct("Gelu", since=1)(lambda ctx: _gelu_direct(ctx, ctx.attr("approximate", "none") == "tanh"))
direct("Gelu", domain="com.microsoft")(lambda ctx: _gelu_direct(ctx, False))


@handler("Gelu", since=1, layout=agnostic)
def gelu(ctx):
    """Opset 20, and the nodes onnx2tf_alt.passes.fusion makes in models of any opset."""
    return _gelu(ctx, ctx.attr("approximate", "none") == "tanh")


@handler("Gelu", domain="com.microsoft", layout=agnostic)
def ms_gelu(ctx):
    """onnxruntime's contrib Gelu (erf form); also what fusion makes below opset 20."""
    return _gelu(ctx, approximate=False)


@handler("BiasGelu", domain="com.microsoft", layout=agnostic)
def ms_bias_gelu(ctx):
    return tf.nn.gelu(widen(ctx.x(0)) + widen(ctx.x(1)), approximate=False)


@handler("FastGelu", domain="com.microsoft", layout=agnostic)
def ms_fast_gelu(ctx):
    """Tanh-form Gelu with an optional bias added first."""
    x = widen(ctx.x(0))
    if ctx.has(1):
        x = x + widen(ctx.x(1))
    return tf.nn.gelu(x, approximate=True)


@handler("QuickGelu", domain="com.microsoft", layout=agnostic)
def ms_quick_gelu(ctx):
    x = widen(ctx.x(0))
    return x * tf.sigmoid(x * ctx.attr("alpha", 1.702))


@handler("ThresholdedRelu", layout=agnostic)
def thresholded_relu(ctx):
    x = widen(ctx.x(0))
    return tf.where(x > ctx.attr("alpha", 1.0), x, tf.zeros_like(x))


@handler("Shrink", layout=agnostic)
def shrink(ctx):
    """Integer inputs are shrunk in float32 and truncated back, as onnxruntime does."""
    x = ctx.x(0)
    x = x if x.dtype.is_floating else tf.cast(x, tf.float32)
    x = widen(x)
    bias, lambd = ctx.attr("bias", 0.0), ctx.attr("lambd", 0.5)
    return tf.where(x < -lambd, x + bias, tf.where(x > lambd, x - bias, tf.zeros_like(x)))


@handler("PRelu", layout=agnostic, limits="TFLite PRELU needs a constant slope")
def prelu(ctx):
    x = widen(ctx.x(0))
    if ctx.const(1) is None or not x.dtype.is_floating:
        slope = tf.cast(ctx.x(1), x.dtype)
        return relu(x) + slope * tf.minimum(x, tf.zeros_like(x))
    slope = ctx.const(1, physical=True).astype(x.dtype.as_numpy_dtype)
    if ctx.options.replaces("PRelu"):  # RELU, MINIMUM, MUL, ADD instead of PRELU
        return tf.nn.relu(x) + tf.minimum(x, tf.zeros_like(x)) * ctx.const_tensor(slope)
    if slope.ndim > 1 and slope.shape[0] == 1:
        slope = slope[0]  # the converter makes PRELU only from a slope without batch axis
    return tf.nn.relu(x) + tf.nn.relu(-x) * ctx.const_tensor(-slope)


@direct("PRelu")
def prelu_direct(ctx):
    """prelu's constant slope: one PRELU (what TF's converter makes of the handler's
    relu(x) + relu(-x) * -slope)."""
    slope = ctx.const(1, physical=True)
    if slope is None or ctx.options.replaces("PRelu"):
        raise direct_writer.NotCovered("a run-time slope, or -rtpo PRelu")
    if slope.ndim > 1 and slope.shape[0] == 1:
        slope = slope[0]
    out = ctx.output()
    ctx.op("PRELU", [ctx.x(0), ctx.weight(slope.astype(np.float32), "slope")], out)
    return out


def _relu_form(low, high, is_float: bool) -> str | None:
    """The one builtin a clip with these constant bounds is: RELU6 for (0, 6), RELU for
    (0, none) (float only), else None."""
    if is_float and _equals(low, 0) and (high is None or _equals(high, 6)):
        return "RELU" if high is None else "RELU6"
    return None


def _clip(x, low, high):
    """min(max(x, low), high) (low > high gives high, as onnxruntime); None: no bound.

    Constant bounds (0, 6) and (0, none) become RELU6 and RELU."""
    form = _relu_form(low, high, x.dtype.is_floating)
    if form is not None:
        return tf.nn.relu(x) if form == "RELU" else tf.nn.relu6(x)
    if low is not None:
        x = tf.maximum(x, tf.cast(low, x.dtype))
    if high is not None:
        x = tf.minimum(x, tf.cast(high, x.dtype))
    return x


def _equals(bound, value) -> bool:
    return isinstance(bound, np.ndarray) and bound.size == 1 and float(bound.reshape(-1)[0]) == value


def _clip_direct(ctx, low, high) -> int:
    """_clip in the direct writer: RELU / RELU6, else MAXIMUM and MINIMUM with scalars."""
    form = _relu_form(low, high, True)
    if form is not None:
        return direct_writer.unary(ctx, form)
    x = ctx.x(0)
    for name, bound in (("MAXIMUM", low), ("MINIMUM", high)):
        if bound is None:
            continue
        if not isinstance(bound, np.ndarray) or bound.size != 1:
            raise direct_writer.NotCovered("run-time bounds")
        y = ctx.temp(ctx.out_phys_shape(), name.lower())
        ctx.op(name, [x, ctx.weight(np.float32(bound.reshape(())), name.lower())], y)
        x = y
    return x


@handler("Clip", since=1, layout=agnostic)
def clip_attributes(ctx):
    """Before opset 11 the bounds are attributes."""
    low, high = ctx.attr("min"), ctx.attr("max")
    return _clip(
        widen(ctx.x(0)),
        None if low is None else np.array(low),
        None if high is None else np.array(high),
    )


@handler("Clip", since=11, layout=agnostic)
def clip(ctx):
    """From opset 11 the bounds are optional inputs (constant or computed)."""

    def bound(i):
        if not ctx.has(i):
            return None
        value = ctx.const(i)
        return value if value is not None else ctx.x(i)

    return _clip(widen(ctx.x(0)), bound(1), bound(2))


@direct("Clip", since=1)
def clip_attributes_direct(ctx):
    low, high = ctx.attr("min"), ctx.attr("max")
    return _clip_direct(ctx, None if low is None else np.array(low),
                        None if high is None else np.array(high))


@direct("Clip", since=11)
def clip_direct(ctx):
    if (ctx.has(1) and ctx.const(1) is None) or (ctx.has(2) and ctx.const(2) is None):
        raise direct_writer.NotCovered("run-time bounds")
    return _clip_direct(ctx, ctx.const(1), ctx.const(2))


# --- Swish and SwiGLU ----------------------------------------------------------------------
@handler("Swish", since=24)
def swish(ctx):
    x = ctx.x(0)
    return x * tf.sigmoid(x * ctx.attr("alpha", 1.0))


@handler("SwiGLU", since=28, layout=agnostic)
def swiglu(ctx):
    gate, value = widen(ctx.x(0)), widen(ctx.x(1))
    return gate * tf.sigmoid(gate * ctx.attr("alpha", 1.0)) * value
