"""onnxruntime's weight-only quantized ops (com.microsoft): MatMulNBits and
GatherBlockQuantized, as `onnxruntime.quantization`'s MatMulNBitsQuantizer and the GenAI
builder write them.

GatherBlockQuantized keeps its table integer in every file when it is the usual 2-D
embedding blocked along its rows: the codes less their zero points as int8 (int16 for
8-bit codes with zero points), scaled per gathered row. That is exactly onnxruntime's
(code - zero_point) * scale, and a 4-bit vocabulary table of 32000 x 512 makes a float32
.tflite of 19.5 MB instead of 66.6 MB (its dynamic-range file: max|err| against
onnxruntime 0.022 instead of 0.035, where TF's quantizer rounded the float table to int8).

MatMulNBits weights are dequantized at conversion time into float constants
(code - zero_point) * scale per block, so the float files run a plain FULLY_CONNECTED /
BATCH_MATMUL; the result matches onnxruntime up to float summation order. The
dynamic-range and INT8 files round them again to int8 per output channel. TFLite's own
4-bit form (an INT4 FULLY_CONNECTED weight with BlockwiseQuantization) cannot hold these
codes, measured on ai-edge-litert 2.3: the XNNPACK delegate refuses negative block
scales, which onnxruntime's symmetric quantizer writes for about half of the blocks (it
maps each block's largest magnitude to code -8); both XNNPACK and the builtin kernel
ignore block zero points (the asymmetric form) and an INT8 blockwise weight; and the
builtin kernel's blockwise path is ~100x slower than its int8 one. The int8 rounding adds
a relative error of ~1.5e-3 to the ~7.5e-3 that the hybrid kernel's run-time quantization
of the activations costs anyway (one FULLY_CONNECTED, K=256, N=64).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

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
         "conversion time (int8 per output channel in the dynamic-range and INT8 files)")
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
         limits="constant data, scales and zero points; rows of a 2-D table quantized along "
         "their length stay integer codes in every file (int8, or int16 for 8-bit codes "
         "with zero points), other layouts are dequantized at conversion time")
def gather_block_quantized(ctx):
    """Gather from the table (the embedding of 4-bit LLMs). A 2-D table blocked along its
    rows keeps its codes (less their zero points) as an integer table, and only the
    gathered rows are scaled: exactly onnxruntime's (code - zero) * scale, with the table
    a quarter (int8) of its float size in every file. Other layouts gather from the
    dequantized float table."""
    indices = tf.cast(ctx.x(1), tf.int32)
    integer = integer_rows(ctx)
    if integer is None:
        table = gather_block_quantized_table(ctx).astype(ctx.dtype(2))
        axis = ctx.attr("gather_axis", 0) % table.ndim
        return tf.gather(ctx.const_tensor(table), _in_range(indices, table.shape[axis]),
                         axis=axis)
    codes, scales, length = integer
    indices = _in_range(indices, codes.shape[0])
    rows = tf.cast(tf.gather(ctx.const_tensor(codes), indices), scales.dtype)
    scaled = rows * tf.expand_dims(tf.gather(ctx.const_tensor(scales), indices), -1)
    padded = codes.shape[1] * codes.shape[2]
    if None in indices.shape:
        flat = tf.reshape(scaled, tf.concat([tf.shape(indices), [padded]], 0))
    else:
        flat = tf.reshape(scaled, [*indices.shape, padded])
    if length == padded:
        return flat
    rank = indices.shape.rank + 1
    return tf.slice(flat, [0] * rank, [-1] * (rank - 1) + [length])


def _in_range(indices, size: int):
    """Negative indices counted from the end, as ONNX's Gather does."""
    return tf.where(indices < 0, indices + size, indices)


def integer_rows(ctx) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(codes - zero points [rows, blocks, block] as int8, or int16 where they do not fit,
    the row ends padded with zeros; scales [rows, blocks]; the row length) of a 2-D table
    gathered along axis 0 and quantized along axis 1; None for other layouts."""
    data = _constant(ctx, 0, "table")
    bits, block = ctx.attr("bits", 4), ctx.attr("block_size", 128)
    packed = data.dtype == np.uint8 and bits == 4
    rank = data.ndim
    if rank != 2 or ctx.attr("gather_axis", 0) % rank != 0 or \
            ctx.attr("quantize_axis", rank - 1) % rank != 1:
        return None
    codes = unpack_codes(data, bits) if packed else data.astype(np.int32)
    scales = _constant(ctx, 2, "scale")
    rows, length = codes.shape
    blocks = -(-length // block)
    if ctx.has(3):
        zero_points = _constant(ctx, 3, "zero point")
        zero = unpack_codes(zero_points, bits) if packed else zero_points.astype(np.int32)
        zero = zero[:rows, :blocks]
    else:  # as gather_block_quantized_table: unsigned codes centred on their middle value
        zero = np.int32(1 << (bits - 1) if str(data.dtype).startswith("uint") else 0)
    padded = np.zeros((rows, blocks * block), np.int32)
    padded[:, :length] = codes
    centred = padded.reshape(rows, blocks, block) - np.broadcast_to(
        zero, (rows, blocks))[:, :, None]
    fits = -128 <= centred.min(initial=0) and centred.max(initial=0) <= 127
    small = np.int8 if fits else np.int16
    return centred.astype(small), scales.astype(ctx.dtype(2)).reshape(rows, blocks), length
