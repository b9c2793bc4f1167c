"""Shared dtype helpers: the dtypes TFLite arithmetic covers, and the ones ops compute in.

TFLite builtins cover few dtypes (most arithmetic only float32, int32 and int64), so inputs
are widened to one they cover; the builder casts each result back to its ONNX dtype.
"""

from __future__ import annotations

from onnx2tf_alt.translate.lazy import tf

_WIDER = {
    "int8": "int32",
    "int16": "int32",
    "uint8": "int32",
    "uint16": "int32",
    "uint32": "int64",
    "float16": "float32",
    "bfloat16": "float32",
}

INT64_MIN = -(2**63)


def widen(x):
    """x in the nearest dtype TFLite arithmetic supports (small ints -> int32, uint32 ->
    int64, half floats -> float32); other dtypes unchanged."""
    wider = _WIDER.get(x.dtype.name)
    return x if wider is None else tf.cast(x, wider)


def ordered(x):
    """x widened into a signed dtype with the same order. TFLite has no uint64 math nor
    uint64 CAST, so uint64 becomes its bits as int64 (BITCAST) with the top bit flipped."""
    if x.dtype != tf.uint64:
        return widen(x)
    return tf.bitcast(x, tf.int64) + INT64_MIN  # adding 2^63 wraps: it flips the top bit


def from_ordered(y, dtype: tf.DType):
    """Undo `ordered` for a value of the original dtype (the builder casts the others)."""
    return tf.bitcast(y + INT64_MIN, tf.uint64) if dtype == tf.uint64 else y


def compute_dtype(tensor) -> tf.DType:
    """float32 for half-precision tensors (TFLite and most TF kernels prefer it)."""
    return tf.float32 if tensor.dtype in (tf.float16, tf.bfloat16) else tensor.dtype


def rounded_conv(op, x, kernel, **kwargs):
    """op(x, kernel) (tf.nn.conv2d, depthwise_conv2d...); of half-precision operands
    accumulated in float32 and rounded once, as the ONNX reference computes it. TF's own
    float16 convolutions round as the CPU's kernels do (one ulp apart from the reference
    on some CPUs, not on others)."""
    if x.dtype not in (tf.float16, tf.bfloat16):
        return op(x, kernel, **kwargs)
    wide = op(tf.cast(x, tf.float32), tf.cast(kernel, tf.float32), **kwargs)
    return tf.cast(wide, x.dtype)


def rounded_matmul(a, b, **kwargs):
    """tf.matmul; of bfloat16 operands accumulated in float32 and rounded once, as the ONNX
    reference computes it. TF's own bfloat16 matmul does that with oneDNN (Intel CPUs) but
    rounds partial sums without it (on an AMD EPYC 52 of 120 products differed)."""
    if a.dtype != tf.bfloat16:
        return tf.matmul(a, b, **kwargs)
    product = tf.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32), **kwargs)
    return tf.cast(product, tf.bfloat16)
