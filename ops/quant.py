"""Quantization ops: QuantizeLinear, DequantizeLinear and the integer-arithmetic ops of
quantized ONNX models (DynamicQuantizeLinear, ConvInteger, MatMulInteger, QLinearConv,
QLinearMatMul), computed exactly as onnxruntime does, in float32 and int32 ops TFLite has.

Quantized values travel as float32 holding integers; the builder casts each result to its
ONNX dtype. Rounding is half to even (tf.round, TFLite ROUND), as in ONNX.

Integer products (convolutions, matrix products) run as float32 convolutions / matmuls,
which are exact while every partial sum stays below 2**24. Where the weights allow larger
sums, the runtime operand is split into base-2**b digits, one float product per digit,
recombined in int32 (`_exact_product`).

`FakeQuantize` (domain onnx2tf_alt) is not an ONNX op: the INT8 export rewrites each
QuantizeLinear -> DequantizeLinear pair of a QDQ model into it, so that TensorFlow's
FakeQuant op carries the model's ranges into the TFLite quantizer (quant/quantize.py).
The direct writer writes it as TFLite's FAKE_QUANT whose output tensor carries the pair's
grid exactly (scale, zero point on int8 codes), which the own quantizer takes
(quant/qdq_grids.py).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper
from onnx2tf_alt.ops._conv_common import depthwise_conv, grouped_conv
from onnx2tf_alt.ops._spatial import kernel_attrs, tf_padding

from onnx2tf_alt.layout.policies import agnostic, channel_last, same_as_input
from onnx2tf_alt.passes.qdq_pairs import DOMAIN, FUSED
from onnx2tf_alt.tflite.flatbuffer import schema
from onnx2tf_alt.tflite.flatgraph import options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

FAKE_QUANT_DOMAIN = DOMAIN
EXACT_LIMIT = 2.0**24  # float32 represents every integer up to here
_INTEGER_DTYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}


def integer_range(dtype) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def quant_dtype(ctx) -> np.dtype:
    """The integer type QuantizeLinear produces (its output's ONNX dtype)."""
    dtype = np.dtype(ctx.out_dtype()) if ctx.out_dtype() is not None else None
    if dtype not in _INTEGER_DTYPES:
        raise NotImplementedError(
            f"quantization to {dtype} is not supported (int8, uint8, int16, uint16 only)"
        )
    return dtype


def quant_param(ctx, i: int, axis: int, data: int = 0, default=0.0):
    """Input i, a per-tensor (scalar) or per-axis (1-D along logical `axis` of input `data`)
    quantization parameter, as float32 shaped to broadcast against input `data`: a numpy
    array when constant, else a tensor. `default` when the input is omitted. With a
    `block_size` attribute, it is blocked (input `data`'s rank, one entry per block)."""
    if not ctx.has(i):
        return np.float32(default)
    if ctx.attr("block_size", 0):
        return _unblocked(ctx, i, axis % ctx.rank(data), data, ctx.attr("block_size"))
    rank = ctx.rank(data)
    value = ctx.const(i)
    if value is not None:
        value = np.asarray(value, np.float32)
        if value.size == 1:
            return value.reshape(())
        shape = [1] * rank
        shape[ctx.axis(axis, data)] = -1
        return value.reshape(shape)
    tensor = tf.cast(ctx.x(i), tf.float32)
    if ctx.rank(i) == 0 or rank == 0:
        return tensor
    shape = [1] * rank
    shape[ctx.axis(axis, data)] = -1
    return tf.reshape(tensor, shape)


def _unblocked(ctx, i: int, axis: int, data: int, block: int):
    """A blocked parameter repeated `block` times along logical `axis` (cut to the data's
    length), in input `data`'s layout: numpy when constant, else one GATHER."""
    length = ctx.shape(data)[axis]
    value = ctx.const(i)
    if value is not None:
        if length is None:
            raise NotImplementedError("blocked quantization needs a static length along axis")
        value = np.repeat(np.asarray(value, np.float32), block, axis=axis)[
            (slice(None),) * axis + (slice(0, length),)]
        return ctx.physical(value, data)
    p = ctx.axis(axis, data)
    positions = np.arange(length, dtype=np.int32) if length is not None else tf.range(
        tf.shape(ctx.x(data))[p])
    return tf.gather(tf.cast(ctx.x(i), tf.float32), positions // block, axis=p)


def _is_numpy(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def quantize(x, scale, zero_point, qmin: int, qmax: int):
    """saturate(round(x / scale) + zero_point), as integer-valued float32."""
    return tf.clip_by_value(tf.round(x / scale) + zero_point, float(qmin), float(qmax))


@handler("QuantizeLinear", since=10, layout=same_as_input(0),
         limits="per-tensor, per-axis and blocked; int8, uint8, int16, uint16 (no float8, "
                "int4)")
def quantize_linear(ctx):
    qmin, qmax = integer_range(quant_dtype(ctx))
    axis = ctx.attr("axis", 1)
    scale, zero_point = quant_param(ctx, 1, axis), quant_param(ctx, 2, axis)
    x = ctx.const(0)
    if x is not None and _is_numpy(scale) and _is_numpy(zero_point):  # weights
        return np.clip(np.round(x.astype(np.float32) / scale) + zero_point, qmin, qmax)
    return quantize(tf.cast(ctx.x(0), tf.float32), scale, zero_point, qmin, qmax)


@handler("DequantizeLinear", since=10, layout=same_as_input(0),
         limits="per-tensor, per-axis and blocked; int8, uint8, int16, uint16, int32 (no "
                "float8, int4)")
def dequantize_linear(ctx):
    if np.dtype(ctx.dtype(0)).kind not in "iu":
        raise NotImplementedError(f"dequantization of {ctx.dtype(0)} is not supported")
    axis = ctx.attr("axis", 1)
    scale, zero_point = quant_param(ctx, 1, axis), quant_param(ctx, 2, axis)
    q = ctx.const(0)
    if q is not None and _is_numpy(scale) and _is_numpy(zero_point):
        return (q.astype(np.float32) - zero_point) * scale  # weights stay constant for Conv
    return (tf.cast(ctx.x(0), tf.float32) - zero_point) * scale


@handler(FUSED, domain=DOMAIN, layout=same_as_input(0),
         limits="internal: a QuantizeLinear -> DequantizeLinear pair (passes/qdq_pairs.py)")
def quantize_dequantize(ctx):
    """DequantizeLinear(QuantizeLinear(x)) in float32, without the integer tensor between:
    clip(round(x / s), qmin - zp, qmax - zp) * s, which equals (clip(round(x / s) + zp,
    qmin, qmax) - zp) * s exactly (every value is an integer below 2**24 until the scale)."""
    qmin, qmax = integer_range(helper.tensor_dtype_to_np_dtype(ctx.attr("qtype")))
    axis = ctx.attr("axis", 1)
    scale, zero_point = quant_param(ctx, 1, axis), quant_param(ctx, 2, axis)
    x = tf.cast(ctx.x(0), tf.float32)
    if _is_numpy(zero_point):
        low, high = qmin - zero_point, qmax - zero_point
        if np.all(low == low.flat[0]) and np.all(high == high.flat[0]):  # one range
            low, high = float(low.flat[0]), float(high.flat[0])
        return tf.clip_by_value(tf.round(x / scale), low, high) * scale
    return (quantize(x, scale, zero_point, qmin, qmax) - zero_point) * scale


@handler("FakeQuantize", domain=FAKE_QUANT_DOMAIN, layout=agnostic,
         limits="internal: a QuantizeLinear -> DequantizeLinear pair (8-bit, per-tensor), "
                "written by the INT8 export")
def fake_quantize(ctx):
    """tf.quantization.fake_quant over the pair's range [(qmin - zp) * s, (qmax - zp) * s]."""
    scale, zero_point = ctx.attr("scale"), ctx.attr("zero_point")
    qmin, qmax = ctx.attr("qmin"), ctx.attr("qmax")
    return tf.quantization.fake_quant_with_min_max_vars(
        tf.cast(ctx.x(0), tf.float32), (qmin - zero_point) * scale, (qmax - zero_point) * scale,
        num_bits=8,
    )


@direct("FakeQuantize", domain=FAKE_QUANT_DOMAIN)
def fake_quantize_direct(ctx):
    """FAKE_QUANT over the pair's range; its output tensor names the pair's grid on int8
    codes (a uint8 zero point 128 lower) for the own quantizer (quant/qdq_grids.py)."""
    scale, zero_point = float(ctx.attr("scale")), int(ctx.attr("zero_point"))
    qmin, qmax = int(ctx.attr("qmin")), int(ctx.attr("qmax"))
    out = ctx.output()
    ctx.op("FAKE_QUANT", [ctx.x(0)], out, options(
        "FakeQuantOptions", min=(qmin - zero_point) * scale, max=(qmax - zero_point) * scale,
        numBits=8, narrowRange=False))
    grid = schema.QuantizationParametersT()
    shift = -128 - qmin  # int8 codes: uint8's sit 128 above
    grid.scale, grid.zeroPoint = [scale], [zero_point + shift]
    grid.min, grid.max = [(qmin - zero_point) * scale], [(qmax - zero_point) * scale]
    ctx.flat.tensors[out].quantization = grid
    return out


@handler("DynamicQuantizeLinear", since=11, layout=same_as_input(0))
def dynamic_quantize_linear(ctx):
    x = tf.cast(ctx.x(0), tf.float32)
    scale, zero_point = dynamic_uint8_params(x)
    return [quantize(x, scale, zero_point, 0, 255), scale, zero_point]


def dynamic_uint8_params(x):
    """(scale, zero point) of float32 x as uint8 over [min(x, 0), max(x, 0)]; scale 1 when
    x is all zeros (as onnxruntime quantizes at run time)."""
    low = tf.minimum(tf.reduce_min(x), 0.0)
    high = tf.maximum(tf.reduce_max(x), 0.0)
    scale = tf.where(tf.equal(high, low), tf.ones_like(high), (high - low) / 255.0)
    return scale, tf.round(tf.clip_by_value(-low / scale, 0.0, 255.0))


# --- exact integer products ----------------------------------------------------------------
def _exact_product(v, bound: float, linear):
    """`linear(v)` as exact int32, for integer-valued float32 v with |v| <= 255.

    `bound` is the largest sum of |weights| over any output of `linear`, so |linear(d)| <=
    max|d| * bound. v is split into base-2**b digits d (|d| <= 2**b) with 2**b * bound <=
    2**24, one float product per digit, recombined in int32.
    """
    bits = min(8, math.floor(math.log2(EXACT_LIMIT / max(bound, 1.0))))
    if bits < 1:
        raise NotImplementedError(
            f"integer accumulation of up to {bound:.3g} * 255 cannot be computed exactly"
        )
    if bits == 8:
        return tf.cast(linear(v), tf.int32)
    base = float(2**bits)
    digits, rest = [], v
    for _ in range(math.ceil(8 / bits) - 1):  # the top digit then lies in [-base, base)
        high = tf.floor(rest * (1.0 / base))
        digits.append(rest - high * base)
        rest = high
    digits.append(rest)
    total = None
    for k, digit in enumerate(digits):
        part = tf.cast(linear(digit), tf.int32)
        if k:
            part = part * (2 ** (bits * k))
        total = part if total is None else total + part
    return total


def centered(ctx, i: int, zero_point_input: int, axis: int):
    """Input i minus its zero point (input `zero_point_input`), as float32."""
    return tf.cast(ctx.x(i), tf.float32) - quant_param(ctx, zero_point_input, axis, data=i)


def _centered_weights(ctx, i: int, zero_point_input: int):
    """ONNX-layout conv weights minus their per-output-channel zero point, as float32: a
    numpy array when both are constants, else a tensor (of static shape)."""
    zero_point = quant_param(ctx, zero_point_input, axis=0, data=i)
    w = ctx.const(i)
    if w is not None and _is_numpy(zero_point):
        return w.astype(np.float32) - zero_point
    if not ctx.shape(i) or any(d is None for d in ctx.shape(i)):
        raise NotImplementedError(f"{ctx.node.op_type} with run-time weights needs their "
                                  "static shape")
    return tf.cast(ctx.x(i), tf.float32) - zero_point


def _weight_bound(w) -> float:
    """Largest sum of |w| over one output channel's taps; for run-time uint8 / int8 weights
    minus their zero point, at most 255 per tap."""
    if _is_numpy(w):
        return float(np.abs(w).reshape(w.shape[0], -1).sum(axis=1).max())
    return 255.0 * math.prod(w.shape[1:])


def _conv_accumulator(ctx, x_zero_point: int, w_input: int, w_zero_point: int):
    """int32 ONNX Conv of (x - x_zp) with (w - w_zp), channel-last; padding is zero after
    centering, i.e. the zero point before it, as onnxruntime pads."""
    w = _centered_weights(ctx, w_input, w_zero_point)
    kernel = list(w.shape[2:])
    strides, dilations, pads = kernel_attrs(ctx, kernel)
    groups = ctx.attr("group", 1)
    depthwise = groups > 1 and groups == ctx.shape(0)[1] and len(kernel) <= 2

    def linear(x):
        x, padding = tf_padding(x, pads, kernel, strides, dilations, ctx.shape(0)[2:])
        if depthwise:
            return depthwise_conv(ctx, x, w, strides, dilations, padding)
        return grouped_conv(ctx, x, w, groups, strides, dilations, padding)

    if ctx.has(x_zero_point) and ctx.shape(x_zero_point) not in ((), (1,)):
        raise NotImplementedError("the input zero point must be a scalar")
    return _exact_product(centered(ctx, 0, x_zero_point, axis=1), _weight_bound(w), linear)


def matmul_accumulator(ctx, a: int, a_zero_point: int, b: int, b_zero_point: int):
    """int32 numpy-style matmul of (A - a_zp) and (B - b_zp); a_zp per row, b_zp per column."""
    a_value = centered(ctx, a, a_zero_point, axis=-2 if ctx.rank(a) > 1 else 0)
    return exact_matmul(ctx, a_value, centered_operand(ctx, b, b_zero_point, axis=-1))


def centered_operand(ctx, i: int, zero_point_input: int, axis: int):
    """Input i minus its zero point (scalar, or along logical `axis`) as float32: a numpy
    array when both are constants, else a tensor."""
    zero_point = quant_param(ctx, zero_point_input, axis, data=i)
    value = ctx.const(i)
    if value is not None and _is_numpy(zero_point):
        return value.astype(np.float32) - zero_point
    return tf.cast(ctx.x(i), tf.float32) - zero_point


def exact_matmul(ctx, a_value, b_value):
    """int32 numpy-style matmul of integer-valued float32 operands: a tensor `a_value` and a
    numpy array or tensor `b_value` of unsigned or signed 8-bit values minus zero points."""
    a_rank, b_rank = a_value.shape.rank, len(b_value.shape)
    if _is_numpy(b_value):
        bound = float(np.abs(b_value).reshape(-1, b_value.shape[-1]).sum(axis=0).max()
                      if b_value.ndim > 1 else np.abs(b_value).sum())
        b_value = ctx.const_tensor(b_value)
    else:
        bound = 255.0 * b_value.shape[0 if b_rank == 1 else -2]
    squeeze = []
    if b_rank == 1:
        b_value, squeeze = b_value[:, tf.newaxis], [-1]

    def linear(x):
        if a_rank == 1:
            return tf.squeeze(tf.matmul(x[tf.newaxis, :], b_value), [-2, *squeeze])
        y = tf.matmul(x, b_value)
        return tf.squeeze(y, squeeze) if squeeze else y

    return _exact_product(a_value, bound, linear)


def _requantize(ctx, accumulator, multiplier, y_zero_point: int, axis: int):
    """saturate(round(float(acc) * multiplier) + y_zp), as onnxruntime requantizes."""
    qmin, qmax = integer_range(ctx.out_dtype())
    zero_point = quant_param(ctx, y_zero_point, axis)
    scaled = tf.round(tf.cast(accumulator, tf.float32) * multiplier)
    return tf.clip_by_value(scaled + zero_point, float(qmin), float(qmax))


def _multiplier(ctx, a_scale: int, b_scale: int, y_scale: int):
    """a_scale * b_scale / y_scale in float32, per output channel (the output's last
    physical axis) when b_scale is 1-D; a numpy value when the scales are constants."""
    values = []
    for i in (a_scale, b_scale, y_scale):
        value = ctx.const(i)
        shape = [] if ctx.shape(i) is not None and np.prod(ctx.shape(i)) == 1 else [-1]
        if value is None:
            values.append(tf.reshape(tf.cast(ctx.x(i), tf.float32), shape))
        else:
            values.append(np.asarray(value, np.float32).reshape(shape))
    if not all(_is_numpy(v) for v in values):
        values = [tf.convert_to_tensor(v) if _is_numpy(v) else v for v in values]
    a, b, y = values
    return a * b / y


@handler("ConvInteger", since=10, layout=channel_last(0),
         limits="scalar input zero point; run-time weights need a static shape")
def conv_integer(ctx):
    return _conv_accumulator(ctx, 2, 1, 3)


@handler("QLinearConv", since=10, layout=channel_last(0),
         limits="scalar input zero point; run-time weights need a static shape")
def qlinear_conv(ctx):
    accumulator = _conv_accumulator(ctx, 2, 3, 5)
    if ctx.has(8):
        bias = ctx.const(8)
        bias = tf.cast(ctx.x(8), tf.int32) if bias is None else tf.constant(
            np.asarray(bias, np.int32))
        accumulator = accumulator + bias
    multiplier = _multiplier(ctx, 1, 4, 6)  # channel-last: output channels last
    return _requantize(ctx, accumulator, multiplier, 7, axis=1)


@handler("MatMulInteger", since=10,
         limits="A's zero point scalar (or per row), B's scalar or per column")
def matmul_integer(ctx):
    return matmul_accumulator(ctx, 0, 2, 1, 3)


@handler("QLinearMatMul", since=10)
def qlinear_matmul(ctx):
    accumulator = matmul_accumulator(ctx, 0, 2, 3, 5)
    multiplier = _multiplier(ctx, 1, 4, 6)
    return _requantize(ctx, accumulator, multiplier, 7, axis=-1)
