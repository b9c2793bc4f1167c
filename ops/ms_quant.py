"""onnxruntime's quantized ops (com.microsoft): what `quantize_dynamic` and
`quantize_static(quant_format=QOperator)` write, and what onnxruntime's graph optimizer fuses
their output into (DynamicQuantizeMatMul, MatMulIntegerToFloat).

Each computes what onnxruntime's integer kernel computes, in float32 ops: activations are
quantized with the same scale and zero point, rounded half to even and saturated, and
integer sums stay exact (ops/quant.py). Where a kernel rounds a float intermediate (a ratio
of scales, a lookup table built from a float function) the result can differ from
onnxruntime's by one quantization step at an exact tie.

- QLinearAdd / QLinearMul: onnxruntime's formulas, round((a - za) * sa/sc + (b - zb) * sb/sc)
  + zc and round((a - za) * (b - zb) * sa*sb/sc) + zc, broadcasting like Add.
- QLinearSigmoid / QLinearLeakyRelu: the 256-entry table onnxruntime builds
  (quantize(f(dequantize(q)))), built at conversion time and gathered at run time (GATHER).
- QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QLinearSoftmax: as their
  kernels, on the input's layout (axis remapping, channel-last pools).
- DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm: exact int32 products scaled by
  a_scale * b_scale (and requantized by QGemm when it has an output scale).
- QAttention: com.microsoft Attention (ops/ms_transformer.py) of the dequantized input and
  weights.
- DynamicQuantizeLSTM: the LSTM of ops/rnn.py with its weights dequantized at conversion
  time; the operand of each product (the input sequence, each step's hidden state) is
  quantized at run time to uint8 per tensor, as onnxruntime does before its integer GEMMs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx2tf_alt.ops import pool, rnn
from onnx2tf_alt.ops._infer import dtype_of, infer_as, infer_attention
from onnx2tf_alt.ops._shapes import physical_axes
from onnx2tf_alt.ops.ms_transformer import ms_attention
from onnx2tf_alt.ops.quant import (
    centered,
    centered_operand,
    dequantize_linear,
    dynamic_uint8_params,
    exact_matmul,
    integer_range,
    matmul_accumulator,
    quant_dtype,
    quant_param,
    quantize,
    quantize_linear,
)
from onnx2tf_alt.ops.softmax import softmax

from onnx2tf_alt.layout.policies import agnostic, channel_last, same_as_input
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

MS = "com.microsoft"
_FLOAT = onnx.TensorProto.FLOAT


# --- output types (ONNX shape inference does not know these ops) ---------------------------
def _float(types) -> int:
    return _FLOAT


def _same_shape(dtype):
    return infer_as("Identity", [0], dtype)


# --- quantization parameters ---------------------------------------------------------------
def _scalar(ctx, i: int, default: float = 0.0):
    """Per-tensor parameter i as float32: a numpy scalar when constant, else a tensor."""
    if not ctx.has(i):
        return np.float32(default)
    value = ctx.const(i)
    if value is None:
        return tf.reshape(tf.cast(ctx.x(i), tf.float32), [])
    if value.size != 1:
        raise NotImplementedError(f"input {i} must be a per-tensor (one-element) parameter")
    return np.float32(value.reshape(()))


def _vector(ctx, i: int):
    """A per-tensor or per-column parameter as 1-D float32 (numpy when constant)."""
    value = ctx.const(i)
    if value is None:
        return tf.reshape(tf.cast(ctx.x(i), tf.float32), [-1])
    return np.asarray(value, np.float32).reshape(-1)


def _float32(*values):
    """The values as float32 tensors, unless all are numpy (then left as they are)."""
    if all(isinstance(v, (np.ndarray, np.generic)) for v in values):
        return values
    return [tf.convert_to_tensor(v, tf.float32) for v in values]


def _saturated(ctx, y):
    qmin, qmax = integer_range(quant_dtype(ctx))
    return tf.clip_by_value(y, float(qmin), float(qmax))


def _requantized(ctx, y, zero_point: int):
    """saturate(round(y) + the output zero point (input `zero_point`))."""
    return _saturated(ctx, tf.round(y) + _scalar(ctx, zero_point))


def _dequantized(ctx, i: int, scale: int, zero_point: int):
    return (tf.cast(ctx.x(i), tf.float32) - _scalar(ctx, zero_point)) * _scalar(ctx, scale)


def _quantized(ctx, y, scale: int, zero_point: int):
    qmin, qmax = integer_range(quant_dtype(ctx))
    return quantize(y, _scalar(ctx, scale), _scalar(ctx, zero_point), qmin, qmax)


# --- elementwise -----------------------------------------------------------------------------
_BINARY = "per-tensor scales and zero points"


@handler("QLinearAdd", domain=MS, layout=agnostic, limits=_BINARY,
         infer=infer_as("Add", [0, 3], dtype_of(0)))
def qlinear_add(ctx):
    a_ratio, b_ratio, c = _float32(_scalar(ctx, 1), _scalar(ctx, 4), _scalar(ctx, 6))
    y = centered(ctx, 0, 2, axis=0) * (a_ratio / c) + centered(ctx, 3, 5, axis=0) * (
        b_ratio / c)
    return _requantized(ctx, y, 7)


@handler("QLinearMul", domain=MS, layout=agnostic, limits=_BINARY,
         infer=infer_as("Mul", [0, 3], dtype_of(0)))
def qlinear_mul(ctx):
    a, b, c = _float32(_scalar(ctx, 1), _scalar(ctx, 4), _scalar(ctx, 6))
    product = centered(ctx, 0, 2, axis=0) * centered(ctx, 3, 5, axis=0)
    return _requantized(ctx, product * (a * b / c), 7)


def _lookup(ctx, fn):
    """fn as onnxruntime's kernel computes it: the table quantize(fn(dequantize(q))) over
    every 8-bit q, built at conversion time in the output's dtype, gathered at run time."""
    params = [ctx.const(i) if ctx.has(i) else np.zeros(()) for i in (1, 2, 3, 4)]
    if any(p is None for p in params):
        raise NotImplementedError(f"{ctx.node.op_type} needs constant scales and zero points")
    x_scale, x_zero, y_scale, y_zero = (np.float32(np.asarray(p).reshape(())) for p in params)
    qmin, qmax = integer_range(ctx.dtype(0))
    x = x_scale * (np.arange(qmin, qmax + 1, dtype=np.float32) - x_zero)
    out = quant_dtype(ctx)
    table = np.clip(np.rint(fn(x) / y_scale) + y_zero, *integer_range(out)).astype(out)
    index = tf.cast(ctx.x(0), tf.int32)
    return tf.gather(ctx.const_tensor(table), index - qmin if qmin else index)


_TABLE = "constant scales and zero points"


@handler("QLinearSigmoid", domain=MS, layout=agnostic, limits=_TABLE,
         infer=_same_shape(dtype_of(0)))
def qlinear_sigmoid(ctx):
    return _lookup(ctx, lambda x: (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(
        np.float32))


@handler("QLinearLeakyRelu", domain=MS, layout=agnostic, limits=_TABLE,
         infer=_same_shape(dtype_of(0)))
def qlinear_leaky_relu(ctx):
    alpha = np.float32(ctx.attr("alpha", 0.01))
    return _lookup(ctx, lambda x: np.where(x >= 0, x, x * alpha))


# --- axis remapping and pools ----------------------------------------------------------------
@handler("QLinearConcat", domain=MS, layout=same_as_input(None),
         infer=infer_as("Concat", None, dtype_of(2)))
def qlinear_concat(ctx):
    """Inputs whose scale and zero point differ from the output's are requantized through
    float, as onnxruntime's per-input tables do; the others are copied."""
    parts = []
    for i in range(2, ctx.num_inputs, 3):
        if _same_constants(ctx, [i + 1, i + 2], [0, 1]):
            parts.append(tf.cast(ctx.x(i), tf.float32))
        else:
            parts.append(_quantized(ctx, _dequantized(ctx, i, i + 1, i + 2), 0, 1))
    return tf.concat(parts, axis=ctx.axis(ctx.attr("axis"), 2))


def _same_constants(ctx, inputs: list[int], others: list[int]) -> bool:
    values = [ctx.const(i) for i in [*inputs, *others]]
    if any(v is None for v in values):
        return False
    half = len(inputs)
    return all(np.array_equal(a, b) for a, b in zip(values[:half], values[half:]))


@handler("QLinearGlobalAveragePool", domain=MS, layout=same_as_input(0),
         limits="static spatial dims", infer=lambda node, types: [(types[0][0], [
             d if k in (0, _channel_axis(node, len(types[0][1]))) else 1
             for k, d in enumerate(types[0][1])])])
def qlinear_global_average_pool(ctx):
    """sum(x) - zp * n requantized with x_scale / (y_scale * n), as onnxruntime."""
    rank = ctx.rank(0)
    channel = _channel_axis(ctx.node.proto, rank)
    spatial = [a for a in range(1, rank) if a != channel]
    dims = [ctx.shape(0)[a] for a in spatial]
    if None in dims:
        raise NotImplementedError("QLinearGlobalAveragePool needs static spatial dims")
    count = int(np.prod(dims))
    total = tf.reduce_sum(tf.cast(ctx.x(0), tf.float32), ctx.axes(spatial), keepdims=True)
    x_scale, y_scale = _float32(_scalar(ctx, 1), _scalar(ctx, 3))
    multiplier = x_scale / (y_scale * np.float32(count))
    return _requantized(ctx, (total - _scalar(ctx, 2) * np.float32(count)) * multiplier, 4)


def _channel_axis(node, rank: int) -> int:
    last = any(a.name == "channels_last" and a.i for a in node.attribute)
    return rank - 1 if last else 1


@handler("QLinearAveragePool", domain=MS, layout=channel_last(0),
         limits="channels_last=0; as AveragePool",
         infer=infer_as("AveragePool", [0], dtype_of(0)))
def qlinear_average_pool(ctx):
    """The float average of the dequantized input, quantized (onnxruntime's kernel)."""
    if ctx.attr("channels_last", 0):
        raise NotImplementedError("QLinearAveragePool with channels_last=1 is not supported")
    return _quantized(ctx, pool.average(ctx, _dequantized(ctx, 0, 1, 2)), 3, 4)


@handler("QLinearSoftmax", domain=MS, layout=same_as_input(0),
         limits="int8 outputs saturate at 127 where onnxruntime's kernel wraps 128 to -128",
         infer=_same_shape(dtype_of(0)))
def qlinear_softmax(ctx):
    """round(softmax(x * x_scale) * floor(1 / y_scale)) + y_zp: onnxruntime's kernel scales
    by the integer part of 1 / y_scale; the input zero point cancels out."""
    rank = ctx.rank(0)
    if ctx.attr("opset", 13) < 13:
        axes = list(range(ctx.attr("axis", 1) % rank, rank))
    else:
        axes = [ctx.attr("axis", -1) % rank]
    x_scale, y_scale = _float32(_scalar(ctx, 1), _scalar(ctx, 3))
    probabilities = softmax(tf.cast(ctx.x(0), tf.float32) * x_scale, physical_axes(ctx, axes))
    steps = np.floor(1 / y_scale) if isinstance(y_scale, np.generic) else tf.floor(1 / y_scale)
    return _requantized(ctx, probabilities * steps, 4)


# --- matrix products -----------------------------------------------------------------------
@handler("DynamicQuantizeMatMul", domain=MS, limits="B's scale and zero point per tensor or "
         "per column", infer=infer_as("MatMul", [0, 1], _float))
def dynamic_quantize_matmul(ctx):
    """A quantized at run time to uint8 over its whole tensor, then MatMulIntegerToFloat."""
    x = tf.cast(ctx.x(0), tf.float32)
    scale, zero_point = dynamic_uint8_params(x)
    a = quantize(x, scale, zero_point, 0, 255) - zero_point
    accumulator = exact_matmul(ctx, a, centered_operand(ctx, 1, 3, axis=-1))
    return _scaled(ctx, accumulator, scale * _vector(ctx, 2), bias=4)


@handler("MatMulIntegerToFloat", domain=MS, limits="per-tensor A; B per tensor or per column",
         infer=infer_as("MatMul", [0, 1], dtype_of(2)))
def matmul_integer_to_float(ctx):
    a_scale, b_scale = _float32(_scalar(ctx, 2), _vector(ctx, 3))
    return _scaled(ctx, matmul_accumulator(ctx, 0, 4, 1, 5), a_scale * b_scale, bias=6)


def _scaled(ctx, accumulator, multiplier, bias: int):
    """float(acc) * multiplier (+ bias), as onnxruntime's scale-and-bias output step."""
    y = tf.cast(accumulator, tf.float32) * multiplier
    return y + ctx.x(bias) if ctx.has(bias) else y


def _qgemm_type(node, types):
    out = infer_as("Gemm", [0, 3], _float)(node, types)
    if len(types) > 8 and types[8] is not None and out[0] is not None:
        out[0] = (types[8][0], out[0][1])
    return out


@handler("QGemm", domain=MS, limits="per-tensor A; B per tensor or per column",
         infer=_qgemm_type)
def qgemm(ctx):
    """int32 (A - za)(B - zb) + C scaled by alpha * sa * sb, and requantized with y_scale /
    y_zero_point when given (as onnxruntime's requantizing output step)."""
    a = centered(ctx, 0, 2, axis=0)
    if ctx.attr("transA", 0):
        a = tf.transpose(a)
    trans_b = bool(ctx.attr("transB", 0))
    b = centered_operand(ctx, 3, 5, axis=0 if trans_b else 1)
    if trans_b:
        b = np.ascontiguousarray(b.T) if isinstance(b, np.ndarray) else tf.transpose(b)
    accumulator = exact_matmul(ctx, a, b)
    if ctx.has(6):
        accumulator = accumulator + tf.cast(ctx.x(6), tf.int32)
    a_scale, b_scale = _float32(_scalar(ctx, 1), _vector(ctx, 4))
    multiplier = np.float32(ctx.attr("alpha", 1.0)) * a_scale * b_scale
    if not ctx.has(7):
        return tf.cast(accumulator, tf.float32) * multiplier
    multiplier, y_scale = _float32(multiplier, _scalar(ctx, 7))
    return _requantized(ctx, tf.cast(accumulator, tf.float32) * (multiplier / y_scale), 8)


# --- LSTM ----------------------------------------------------------------------------------
def _fake_quantized(x):
    """x through uint8 at run time (per tensor, onnxruntime's dynamic parameters)."""
    scale, zero_point = dynamic_uint8_params(x)
    return (quantize(x, scale, zero_point, 0, 255) - zero_point) * scale


_LSTM_PARAMS = {1: (8, 9), 2: (10, 11)}  # W, R: their scale and zero point inputs


class _DynamicallyQuantized(rnn.Recurrence):
    """W and R ([directions, in, 4 * hidden] integers, scales and zero points per direction
    or per column) dequantized into ONNX LSTM weights; each product's operand quantized."""

    def weight(self, i: int):
        if i not in _LSTM_PARAMS:
            return super().weight(i)
        q, scale, zero_point = (self.ctx.const(k) for k in (i, *_LSTM_PARAMS[i]))
        if q is None or scale is None or zero_point is None:
            raise NotImplementedError("DynamicQuantizeLSTM needs constant weights, scales "
                                      "and zero points")
        shape = (q.shape[0], 1, -1)
        w = (q.astype(np.float32) - zero_point.reshape(shape)) * scale.reshape(shape)
        return np.ascontiguousarray(np.transpose(w, (0, 2, 1))).astype(self.dtype)

    def linear(self, weight):
        project = super().linear(weight)
        return lambda x: project(_fake_quantized(x))


@handler("DynamicQuantizeLSTM", domain=MS, layout=rnn.sequence_as_arrived,
         limits=rnn.LIMITS + "; constant weights",
         infer=infer_as("LSTM", [0, 1, 2], _float))
def dynamic_quantize_lstm(ctx):
    return rnn.lstm(ctx, recurrence=_DynamicallyQuantized)


# --- QAttention ----------------------------------------------------------------------------
_ATTENTION_INPUTS = {0: 0, 1: 1, 2: 2, 3: 5, 4: 8}  # Attention's input i is QAttention's


class _AttentionView:
    """A QAttention node as com.microsoft Attention's handler reads it: inputs renumbered,
    the input and the weights dequantized (their float product is onnxruntime's
    float(int32 product) * input_scale * weight_scale, up to float rounding)."""

    def __init__(self, ctx):
        self._ctx = ctx
        w = centered_operand(self._ctx, 1, 7, axis=1)
        scale = quant_param(ctx, 4, axis=1, data=1)
        if not isinstance(w, np.ndarray) or not isinstance(scale, (np.ndarray, np.generic)):
            raise NotImplementedError("QAttention needs constant weights and weight scales")
        self._weights = (w * scale).astype(np.float32)

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def x(self, i: int):
        if i == 0:
            return centered(self._ctx, 0, 6, axis=0) * _scalar(self._ctx, 3)
        if i == 1:
            return self._ctx.const_tensor(self._weights)
        return self._ctx.x(_ATTENTION_INPUTS[i])

    def has(self, i: int) -> bool:
        return i in _ATTENTION_INPUTS and self._ctx.has(_ATTENTION_INPUTS[i])

    def const(self, i: int):
        return self._weights if i == 1 else self._ctx.const(_ATTENTION_INPUTS[i])

    def shape(self, i: int):
        return self._ctx.shape(_ATTENTION_INPUTS[i])


def _qattention_types(node, types):
    picked = [types[i] if i < len(types) else None for i in _ATTENTION_INPUTS.values()]
    picked[0] = (_FLOAT, types[0][1])
    return infer_attention(node, picked)


@handler("QAttention", domain=MS, infer=_qattention_types,
         limits="constant weights; otherwise as com.microsoft Attention")
def qattention(ctx):
    """com.microsoft Attention of the dequantized input and weights (QAttention's integer
    QKV projection, scaled to float, then float attention, as onnxruntime)."""
    return ms_attention(_AttentionView(ctx))


# --- QuantizeLinear / DequantizeLinear of the com.microsoft domain -------------------------
def _quantize_type(types) -> int:
    """The zero point's type; uint8 without one."""
    return types[2][0] if len(types) > 2 and types[2] else onnx.TensorProto.UINT8


handler("QuantizeLinear", domain=MS, layout=same_as_input(0),
        limits="per-tensor and per-axis; int8, uint8, int16, uint16",
        infer=_same_shape(_quantize_type))(quantize_linear)
handler("DequantizeLinear", domain=MS, layout=same_as_input(0),
        limits="per-tensor and per-axis; int8, uint8, int16, uint16, int32",
        infer=_same_shape(dtype_of(1)))(dequantize_linear)
