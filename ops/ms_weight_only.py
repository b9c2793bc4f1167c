"""onnxruntime's weight-only quantized ops (com.microsoft): MatMulNBits and
GatherBlockQuantized, as `onnxruntime.quantization`'s MatMulNBitsQuantizer and the GenAI
builder write them.

Their weights are constants: they are dequantized at conversion time into float constants
(code - zero_point) * scale per block, so the float files run a plain FULLY_CONNECTED /
BATCH_MATMUL or GATHER; the result matches onnxruntime up to float summation order.
"""

from __future__ import annotations

import numpy as np
import onnx
import tensorflow as tf

from onnx2tf_alt.registry import handler

from ._infer import attrs_of

MS = "com.microsoft"


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> their `bits`-wide codes, low bits first, along the last axis."""
    packed = packed.astype(np.uint8)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte).astype(np.int32)


def _constant(ctx, i: int, what: str) -> np.ndarray:
    value = ctx.const(i)
    if value is None:
        raise NotImplementedError(f"{ctx.node.op_type} with a run-time {what} (it must be a "
                                  "constant to be dequantized at conversion time)")
    return value


def _infer_matmul_nbits(node, types):
    dtype, a = types[0]
    return [(dtype, [*a[:-1], attrs_of(node)["N"]])]


def matmul_nbits_weight(ctx) -> np.ndarray:
    """The float [K, N] weight of a MatMulNBits node."""
    k, n = ctx.attr("K"), ctx.attr("N")
    bits, block = ctx.attr("bits", 4), ctx.attr("block_size")
    blocks = -(-k // block)
    codes = unpack_codes(_constant(ctx, 1, "weight"), bits).reshape(n, blocks, block)
    scales = _constant(ctx, 2, "scale").astype(np.float32).reshape(n, blocks, 1)
    zero_points = ctx.const(3) if ctx.has(3) else None
    if ctx.has(3) and zero_points is None:
        _constant(ctx, 3, "zero point")
    if zero_points is None:
        zero = np.float32(1 << (bits - 1))
    elif zero_points.dtype == np.uint8:  # packed like the codes, one row per output column
        zero = unpack_codes(zero_points.reshape(n, -1), bits)[:, :blocks, None]
    else:  # float zero points: (code - zero) * scale with the float zero
        zero = zero_points.astype(np.float32).reshape(n, blocks, 1)
    if ctx.has(4) and ctx.const(4) is not None and ctx.const(4).size:
        raise NotImplementedError("MatMulNBits with g_idx (act-order) is not supported")
    weight = ((codes - zero) * scales).reshape(n, blocks * block)[:, :k]
    return weight.T.astype(ctx.dtype(0))


@handler("MatMulNBits", domain=MS, infer=_infer_matmul_nbits,
         limits="constant weights, scales and zero points; no g_idx; dequantized at "
         "conversion time")
def matmul_nbits(ctx):
    """A [.., K] times the dequantized weight [K, N], plus the optional bias (input 5)."""
    y = tf.linalg.matmul(ctx.x(0), ctx.const_tensor(matmul_nbits_weight(ctx)))
    if ctx.has(5):
        y = y + ctx.x(5)
    return y


def _infer_gather_block_quantized(node, types):
    attrs = attrs_of(node)
    (data_type, data), (_, indices), (scale_type, _) = types[:3]
    data = list(data)
    if data_type == onnx.TensorProto.UINT8 and attrs.get("bits", 4) == 4:
        data[-1] = data[-1] * 2 if isinstance(data[-1], int) else None
    axis = attrs.get("gather_axis", 0) % len(data)
    return [(scale_type, [*data[:axis], *indices, *data[axis + 1:]])]


def gather_block_quantized_table(ctx) -> np.ndarray:
    """The dequantized float table of a GatherBlockQuantized node, in ONNX order."""
    data = _constant(ctx, 0, "table")
    bits, block = ctx.attr("bits", 4), ctx.attr("block_size", 128)
    packed = data.dtype == np.uint8 and bits == 4
    codes = unpack_codes(data, bits) if packed else data.astype(np.int32)
    axis = ctx.attr("quantize_axis", codes.ndim - 1) % codes.ndim
    if packed and axis != codes.ndim - 1:
        raise NotImplementedError("GatherBlockQuantized with packed uint8 data quantized "
                                  "along another axis than the last")
    scales = _constant(ctx, 2, "scale").astype(np.float32)
    if ctx.has(3):
        zero_points = _constant(ctx, 3, "zero point")
        zero = unpack_codes(zero_points, bits) if packed else zero_points.astype(np.int32)
        zero = zero[tuple(slice(0, s) for s in scales.shape)]
    else:  # unsigned codes (uint8, uint4) are centred on their middle value, signed on 0
        zero = np.int32(1 << (bits - 1) if str(data.dtype).startswith("uint") else 0)
    zero = np.broadcast_to(zero, scales.shape)
    length = codes.shape[axis]
    return (codes - _per_element(zero, axis, block, length)) * _per_element(
        scales, axis, block, length)


def _per_element(per_block: np.ndarray, axis: int, block: int, length: int) -> np.ndarray:
    """A per-block array repeated over each block's `block` elements along `axis`."""
    return np.repeat(per_block, block, axis=axis).take(range(length), axis=axis)


@handler("GatherBlockQuantized", domain=MS, infer=_infer_gather_block_quantized,
         limits="constant data, scales and zero points; dequantized at conversion time")
def gather_block_quantized(ctx):
    """Gather from the dequantized table (the embedding of 4-bit LLMs)."""
    table = gather_block_quantized_table(ctx).astype(ctx.dtype(2))
    axis = ctx.attr("gather_axis", 0) % table.ndim
    indices = tf.cast(ctx.x(1), tf.int32)
    size = table.shape[axis]
    indices = tf.where(indices < 0, indices + size, indices)
    return tf.gather(ctx.const_tensor(table), indices, axis=axis)
