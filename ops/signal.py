"""Signal processing: DFT, STFT, the cosine-sum windows and MelWeightMatrix.

TFLite has no builtin for complex numbers or FFTs, so a DFT of static length is a real
matrix product: the complex pair (last axis) and the signal axis fold into one constant
matrix of cosines and sines built here in numpy (FULLY_CONNECTED or BATCH_MATMUL). STFT is
one strided convolution whose kernel is that matrix with the window folded in. Windows and
the mel filter bank of constant sizes are computed at conversion time.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

from ._shapes import scalar


# --- DFT matrices ------------------------------------------------------------------------------
def _angles(outputs: int, inputs: int, length: int, inverse: bool) -> np.ndarray:
    """2 pi k t / length (signed), with k t reduced modulo length for accuracy: (t, k)."""
    k_t = np.outer(np.arange(inputs), np.arange(outputs)) % length
    return (1.0 if inverse else -1.0) * 2 * np.pi * k_t / length


def dft_matrix(n: int, length: int, complex_input: bool, onesided: bool,
               inverse: bool) -> np.ndarray:
    """M with y[k, co] = sum over t, ci of x[t, ci] M[t, ci, k, co], for n input samples.

    Samples past `length` are dropped, missing ones are zeros. Inverse with onesided is the
    inverse real FFT (numpy's irfft): the n bins are a half spectrum, the output is real.
    """
    if inverse and onesided:
        return _irfft_matrix(n, length)
    outputs = length // 2 + 1 if onesided else length
    used = min(n, length)
    angle = _angles(outputs, used, length, inverse)
    cos, sin = np.cos(angle), np.sin(angle)
    scale = 1 / length if inverse else 1.0
    m = np.zeros((n, 2 if complex_input else 1, outputs, 2))
    # (a + ib)(cos + i sin) = (a cos - b sin) + i (a sin + b cos)
    m[:used, 0, :, 0], m[:used, 0, :, 1] = cos * scale, sin * scale
    if complex_input:
        m[:used, 1, :, 0], m[:used, 1, :, 1] = -sin * scale, cos * scale
    return m


def _irfft_matrix(n: int, length: int) -> np.ndarray:
    """Real output of a Hermitian spectrum given by its first bins (imaginary parts of the
    zero and Nyquist bins ignored, as numpy does)."""
    used = min(n, length // 2 + 1)
    angle = _angles(length, used, length, inverse=True)
    twice = np.full(used, 2.0)
    twice[0] = 1
    if length % 2 == 0 and used == length // 2 + 1:
        twice[-1] = 1
    weight = twice[:, None] / length
    m = np.zeros((n, 2, length, 1))
    m[:used, 0, :, 0] = weight * np.cos(angle)
    m[:used, 1, :, 0] = -weight * np.sin(angle)
    return m


def apply_along(x, shape, axis: int, matrix: np.ndarray, const_tensor):
    """y[..., k, ..., co] = sum of x[..., t, ..., ci] * matrix[t, ci, k, co] over t (on
    `axis`) and ci (the last axis): one matmul with the constant matrix."""
    n, cin, outputs, cout = matrix.shape
    out_shape = [*shape[:axis], outputs, *shape[axis + 1 : -1], cout]
    if sum(d is None for d in out_shape) > 1:
        raise NotImplementedError(f"DFT with several unknown dims: {shape}")
    dtype = x.dtype.as_numpy_dtype
    post = math.prod(shape[axis + 1 : -1])
    if post == 1:  # the signal axis is the last one before the complex pair
        flat = tf.reshape(x, [-1, n * cin])
        y = tf.matmul(flat, const_tensor(matrix.reshape(n * cin, -1).astype(dtype)))
    else:  # per ci: (cout * k, t) constant left factors times (batch, t, post); not one
        # matmul of the parts concatenated: TF 2.21's TFLite converter folds UNPACK +
        # CONCATENATION into a RESHAPE, which interleaves them wrongly
        parts = tf.unstack(tf.reshape(x, [-1, n, post, cin]), axis=-1)
        left = matrix.transpose(1, 3, 2, 0).reshape(cin, cout * outputs, n).astype(dtype)
        y = tf.add_n([tf.matmul(const_tensor(m), part) for m, part in zip(left, parts)])
        y = tf.reshape(y, [-1, cout, outputs * post])
        y = tf.expand_dims(y[:, 0], -1) if cout == 1 else tf.stack(tf.unstack(y, axis=1), -1)
    return tf.reshape(y, [-1 if d is None else d for d in out_shape])


def _dft_length(ctx, i: int, default: int) -> int:
    if not ctx.has(i):
        return default
    value = ctx.const(i)
    if value is None:
        raise NotImplementedError(f"{ctx.node.op_type} with a run-time dft_length/frame_length")
    return int(value)


def _dft_matrix_on(ctx, axis: int) -> np.ndarray:
    """The DFT matrix for transforming logical `axis` of input 0."""
    shape = ctx.shape(0)
    rank = len(shape)
    axis = axis % rank
    if axis == rank - 1 or shape[-1] not in (1, 2):
        raise NotImplementedError("DFT input needs a last axis of 1 (real) or 2 (complex)")
    n = shape[axis]
    if n is None or None in shape[axis + 1 :]:
        raise NotImplementedError("DFT needs static dims from the transformed axis on")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    length = _dft_length(ctx, 1, 2 * (n - 1) if inverse and onesided else n)
    return dft_matrix(n, length, shape[-1] == 2, onesided, inverse)


def _dft(ctx, axis: int):
    shape = ctx.shape(0)
    axis = axis % len(shape)
    matrix = _dft_matrix_on(ctx, axis)
    x = ctx.x(0)
    if x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    return apply_along(x, shape, axis, matrix, ctx.const_tensor)


@handler("DFT", since=17,
         limits="static dims from the transformed axis on; constant dft_length; inverse "
                "onesided is numpy's irfft (onnxruntime 1.32 agrees only when the input holds "
                "dft_length // 2 + 1 bins)")
def dft_17(ctx):
    return _dft(ctx, ctx.attr("axis", 1))


@handler("DFT", since=20,
         limits="a run-time axis computes the DFT on every axis that fits the output shape "
                "and selects one (SELECT_V2)")
def dft_20(ctx):
    """The axis moved from an attribute to input 2 (default -2)."""
    axis = ctx.const(2) if ctx.has(2) else np.array(-2)
    if axis is None:
        return _runtime_axis_dft(ctx)
    return _dft(ctx, int(axis))


def _runtime_axis_dft(ctx):
    """DFT along an axis known only at run time: the transform on each axis whose result
    has the output's inferred shape, the one asked for picked with a run-time compare."""
    shape, out = ctx.shape(0), ctx.out_shape(0)
    candidates, shapes = [], {}
    for axis in range(len(shape) - 1):
        try:
            matrix = _dft_matrix_on(ctx, axis)
        except NotImplementedError:
            continue
        shapes[axis] = (*shape[:axis], matrix.shape[2], *shape[axis + 1 : -1], matrix.shape[3])
        if out is None or all(o is None or o == d for o, d in zip(out, shapes[axis])):
            candidates.append(axis)
    if not candidates or len({shapes[a] for a in candidates}) > 1:
        raise NotImplementedError(f"DFT with a run-time axis: the axes {candidates} of {shape} "
                                  f"give different shapes and the output's is {out}")
    chosen = tf.cast(tf.reshape(ctx.x(2), []), tf.int32)
    chosen = tf.where(chosen < 0, chosen + len(shape), chosen)
    y = _dft(ctx, candidates[-1])
    for axis in candidates[-2::-1]:
        y = tf.where(tf.equal(chosen, axis), _dft(ctx, axis), y)
    return y


# --- STFT --------------------------------------------------------------------------------------
def _sin_quarters(quarters, n):
    """sin(pi / 2 * quarters / n) for int32 `quarters`, folded into [-n, n] first, so that
    whole half turns give exactly 0 and quarter turns exactly +-1 in float32."""
    a = tf.math.floormod(quarters, 4 * n)
    a = tf.where(a > 2 * n, a - 4 * n, a)
    a = tf.where(a > n, 2 * n - a, tf.where(a < -n, -2 * n - a, a))
    return tf.sin(np.pi / 2 * tf.cast(a, tf.float32) / tf.cast(n, tf.float32))


def _runtime_dft_matrix(frame, complex_input: bool, onesided: bool):
    """dft_matrix(frame, frame, ...) for a run-time frame length, flattened to
    (frame * ci, bins * 2), in float32; and the bin count."""
    bins = frame // 2 + 1 if onesided else frame
    k_t = tf.math.floormod(tf.range(frame)[:, None] * tf.range(bins)[None, :], frame)
    # angle -2 pi k t / frame, i.e. -4 k t quarter turns of frame units
    cos, sin = _sin_quarters(4 * k_t + frame, frame), _sin_quarters(-4 * k_t, frame)
    matrix = tf.stack([cos, sin], -1)  # (t, k, re/im) of a real sample
    if complex_input:  # an imaginary sample contributes i (cos + i sin)
        matrix = tf.stack([matrix, tf.stack([-sin, cos], -1)], 1)
    return tf.reshape(matrix, tf.stack([-1, bins * 2])), bins


def _framed_dft(ctx, x, step, frame: int | None):
    """STFT with a run-time window, frame_step, signal length or frame_length: frames
    gathered (GATHER), windowed, then one DFT matmul. The frame starts are constants when
    step and length are; a run-time frame length builds the DFT matrix with COS and SIN."""
    shape = ctx.shape(0)
    if step is not None and shape[1] is not None and frame is not None:
        starts = np.arange((shape[1] - frame) // int(step) + 1) * int(step)
        where = ctx.const_tensor((starts[:, None] + np.arange(frame)).astype(np.int32))
    else:
        step = tf.cast(tf.reshape(scalar(ctx, 1), []), tf.int32)
        size = frame if frame is not None else tf.cast(tf.reshape(ctx.x(3), []), tf.int32)
        starts = tf.range((tf.shape(x)[1] - size) // step + 1) * step
        where = starts[:, None] + tf.range(size)[None, :]
    frames = tf.gather(x, where, axis=1)  # (batch, frames, frame, c)
    if ctx.has(2):
        frames = frames * tf.reshape(tf.cast(ctx.x(2), x.dtype), [-1, 1])
    onesided = bool(ctx.attr("onesided", 1))
    if frame is not None:
        bins = dft_matrix(frame, frame, shape[-1] == 2, onesided, False)
        return apply_along(frames, [shape[0], frames.shape[1], frame, shape[-1]], 2, bins,
                           ctx.const_tensor)
    matrix, bins = _runtime_dft_matrix(size, shape[-1] == 2, onesided)
    y = tf.matmul(tf.reshape(frames, tf.stack([-1, size * shape[-1]])), tf.cast(matrix, x.dtype))
    dims = tf.shape(frames)
    return tf.reshape(y, tf.stack([dims[0], dims[1], bins, 2]))


@handler("STFT", since=17,
         limits="run-time frame_step, frame_length or signal length: frames gathered at run "
                "time (a run-time frame_length builds the DFT matrix with COS/SIN)")
def stft(ctx):
    """A constant (or no) window folds into the DFT matrix: one strided convolution."""
    shape = ctx.shape(0)
    step, window = ctx.const(1), ctx.const(2)
    frame = ctx.shape(2)[0] if ctx.has(2) else None
    if ctx.has(3) and ctx.const(3) is not None:
        frame = int(ctx.const(3))
    x = ctx.x(0)
    if x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    if step is None or shape[1] is None or frame is None or (ctx.has(2) and window is None):
        return _framed_dft(ctx, x, step, frame)
    bins = dft_matrix(frame, frame, shape[-1] == 2, bool(ctx.attr("onesided", 1)), False)
    if window is not None:
        bins = bins * window.astype(np.float64)[:, None, None, None]
    kernel = bins.reshape(1, frame, bins.shape[1], -1).astype(x.dtype.as_numpy_dtype)
    y = tf.nn.conv2d(tf.expand_dims(x, 1), ctx.const_tensor(kernel), [1, 1, int(step), 1],
                     "VALID")
    return tf.reshape(y, [-1 if shape[0] is None else shape[0], y.shape[2], bins.shape[2], 2])


# --- windows -----------------------------------------------------------------------------------
def _cosine_sum(ctx, coeffs: list[float]):
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric);
    in numpy when the size is constant."""
    periodic = bool(ctx.attr("periodic", 1))
    size = ctx.const(0)
    if size is not None:
        n, cos = np.arange(int(size), dtype=np.float64), np.cos
        with np.errstate(divide="ignore", invalid="ignore"):  # size 1, symmetric: NaN
            phase = 2 * np.pi * n / (int(size) if periodic else int(size) - 1)
    else:
        size = tf.cast(tf.reshape(ctx.x(0), []), tf.int32)
        n, cos = tf.cast(tf.range(size), tf.float32), tf.cos
        phase = 2 * np.pi * n / tf.cast(size if periodic else size - 1, tf.float32)
    result = coeffs[0]
    for k, a in enumerate(coeffs[1:], 1):
        result = result + (-1) ** k * a * cos(k * phase)
    return result


@handler("HannWindow", since=17)
def hann_window(ctx):
    return _cosine_sum(ctx, [0.5, 0.5])


@handler("HammingWindow", since=17)
def hamming_window(ctx):
    return _cosine_sum(ctx, [25 / 46, 21 / 46])


@handler("BlackmanWindow", since=17)
def blackman_window(ctx):
    return _cosine_sum(ctx, [0.42, 0.5, 0.08])


# --- MelWeightMatrix ---------------------------------------------------------------------------
def mel_weight_matrix(bins: int, dft_length: int, rate: int, low: float, high: float):
    """Triangular mel filters, (dft_length // 2 + 1, bins), in onnxruntime's float32 steps
    (which decide the integer frequency bins at their edges)."""
    f32 = np.float32

    def to_mel(hz):
        return f32(2595) * np.log10(f32(1) + f32(hz) / f32(700), dtype=f32)

    low_mel, high_mel = to_mel(low), to_mel(high)
    step = (high_mel - low_mel) / f32(bins + 2)
    mels = low_mel + step * np.arange(bins + 2, dtype=f32)
    hz = (700 * (10.0 ** (mels / f32(2595)).astype(np.float64) - 1)).astype(f32)
    edges = np.floor(f32(dft_length + 1) * hz / f32(rate)).astype(np.int64)
    weights = np.zeros((dft_length // 2 + 1, bins), f32)
    for i in range(bins):
        left, center, right = edges[i : i + 3]
        if center == left:
            weights[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            weights[j, i] = (j - left) / f32(center - left)
        if right > center:
            j = np.arange(center, right)
            weights[j, i] = (right - j) / f32(right - center)
    return weights


def _runtime_mel_weight_matrix(bins, length, rate, low, high):
    """mel_weight_matrix of run-time int32 / float32 scalars, in float32 throughout."""

    def to_mel(hz):
        return 2595 * tf.math.log(1 + hz / 700) / np.log(10.0).astype(np.float32)

    low_mel, high_mel = to_mel(low), to_mel(high)
    step = (high_mel - low_mel) / tf.cast(bins + 2, tf.float32)
    mels = low_mel + step * tf.cast(tf.range(bins + 2), tf.float32)
    hz = 700 * (tf.pow(10.0, mels / 2595) - 1)
    edges = tf.cast(tf.floor(tf.cast(length + 1, tf.float32) * hz / tf.cast(rate, tf.float32)),
                    tf.int32)
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    j = tf.range(length // 2 + 1)[:, None]

    def ramp(num, den):
        return tf.cast(num, tf.float32) / tf.cast(tf.maximum(den, 1), tf.float32)

    rising = tf.where(center > left, ramp(j - left, center - left), 1.0)
    rising = tf.where((j >= left) & (j <= center), rising, 0.0)
    return tf.where((j >= center) & (j < right), ramp(right - j, right - center), rising)


@handler("MelWeightMatrix", since=17,
         limits="run-time inputs: computed in float32 (onnxruntime takes float64 steps), so "
                "a filter edge within float32 rounding of an integer bin may move")
def mel_weight(ctx):
    values = [ctx.const(i) for i in range(5)]
    if any(v is None for v in values):
        return _runtime_mel_weight_matrix(
            *(tf.cast(tf.reshape(scalar(ctx, i), []), tf.int32) for i in range(3)),
            *(tf.cast(tf.reshape(scalar(ctx, i), []), tf.float32) for i in (3, 4)))
    bins, length, rate, low, high = values
    return mel_weight_matrix(int(bins), int(length), int(rate), float(low), float(high))
