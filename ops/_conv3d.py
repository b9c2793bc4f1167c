"""3-D Conv as 2-D convolutions over frames: TFLite's CONV_3D falls off the XNNPACK delegate,
CONV_2D, DEPTHWISE_CONV_2D, PAD, STRIDED_SLICE, RESHAPE and ADD do not.

The data is channel-last (N, D, H, W, C). Output frame d sums, over the depth taps a of the
kernel, a 2-D conv of input frame d * sd + a * dd - pad_begin with the kernel's slice a. So
each tap is one (grouped, depthwise or plain) CONV_2D whose batch is the frames it reads,
only the real ones (none in the depth padding): its output is padded in depth to the output
frames and the taps are summed; the bias goes on a tap that reads every output frame, fused
into its conv. A depth stride reads every sd-th frame by a RESHAPE of the depth axis to
(D / sd, sd) and a SLICE of one phase (XNNPACK's slices take no strides). A tap that reads
only padding is dropped (r3d_18's last stage has one frame: its 3x3x3 convs are 3x3 ones).

Measured (float32 TFLite, XNNPACK, 1 thread, best of 11-15 runs, ms, on a busy 2-core
machine, so +-15%), CONV_3D vs this form: r3d_18's layers: stem 3x7x7 49 vs 32, 3x3x3 on
8x56x56x64 160 vs 59-66, 4x28x28x128 73 vs 24-33, 2x14x14x256 33 vs 10-11, 1x7x7x512 35 vs
4.1, with stride 2 40 vs 24, 18 vs 12, 16 vs 4.7; its strided 1x1x1 downsample 1.5 vs 2.7
(the phase SLICE copies half the input; kept lowered: CONV_3D would split the delegate's
graph, and the whole model is faster so); depthwise 3x3x3 on 8x28x28x96 52 vs 5.2 (CONV_3D
per group), groups 4 24 vs 7.4; 5x5x5 219 vs 42. The alternative that concatenates the
taps' frames on the channel axis for ONE CONV_2D (the depth padding's zeros multiplied) ran
the layers about as fast, but r3d_18 as a whole 5-13% slower (5 interleaved runs: 644, 602,
441, 651, 604 against 556, 523, 386, 585, 578 ms), so it is not kept. r3d_18 TFLite /
onnxruntime, 1 thread: 2.03 with CONV_3D, 0.84-0.95 so (benchmarks/bench_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2tf_alt.translate.lazy import tf

from ._conv_common import array_module, depthwise_conv2d, kernel_tensor, per_group
from ._spatial import dilate_kernel, is_tf_same, pad_spatial


def lowers_to_2d(x, pads) -> bool:
    """Can a Conv of channel-last data x with these pads run as 2-D convs here (3-D, static
    D, H, W and pads)?"""
    return (len(x.shape) == 5 and all(size is not None for size in x.shape[1:4])
            and all(p is not None for p in pads))


@dataclass(frozen=True)
class _Read:
    """The frames one kept depth tap reads: `count` frames from `start` (padded input index)
    one depth stride apart, for the output frames from `first_out`."""

    tap: int
    start: int
    first_out: int
    count: int


@dataclass(frozen=True)
class _Depth:
    """The depth axis of the conv: its output frames, what each kept tap reads, and the zeros
    added before and after the input's depth axis."""

    out: int
    stride: int
    reads: tuple[_Read, ...]
    pads: tuple[int, int]


def _depth_plan(size: int, k: int, s: int, d: int, pads) -> _Depth:
    """Which real frames (inside the input) each tap reads, for which output frames."""
    begin, end = pads
    out = (size + begin + end - (k - 1) * d - 1) // s + 1
    reads = []
    for tap in range(k):
        first = tap * d - begin  # input frame of output frame 0
        lo, hi = max(0, -(first // s)), min(out, (size - 1 - first) // s + 1)
        if hi > lo:
            reads.append(_Read(tap, first + lo * s, lo, hi - lo))
    if not reads:  # every tap reads padding only: the output is the bias
        reads = [_Read(0, -begin, 0, out)]
    lo = min(r.start for r in reads)
    hi = max(r.start + (r.count - 1) * s + 1 for r in reads)
    before, after = max(-lo, 0), max(hi - size, 0)
    if s > 1:  # the reshape to (frames / s, s) needs a multiple of s
        after += -(before + size + after) % s
    reads = [_Read(r.tap, r.start + before, r.first_out, r.count) for r in reads]
    return _Depth(out, s, tuple(reads), (before, after))


def _frames(x, depth: _Depth, read: _Read):
    """The frames `read` names of padded x (N, D, H, W, C), as a batch of 2-D images
    (N * count, H, W, C)."""
    _, frames, height, width, channels = x.shape
    s, start, count = depth.stride, read.start, read.count
    if s > 1:
        x = tf.reshape(x, [-1, frames // s, s, height * width * channels])
        x = x[:, start // s : start // s + count, start % s : start % s + 1]
    elif start or count != frames:
        x = x[:, start : start + count]
    return tf.reshape(x, [-1, height, width, channels])


def _tapwise(ctx, x, w, bias, depth: _Depth, conv_args):
    """A grouped, depthwise or plain CONV_2D per kept tap on the frames it reads, padded in
    depth to the output frames and summed; the bias on a tap that reads every output frame
    (fused into its conv) when there is one."""
    strides, dilations, padding = conv_args
    channels, (out_ch, _, _, kh, kw) = x.shape[-1], w.shape
    depthwise = w.shape[1] == 1 and out_ch % channels == 0
    if depthwise and max(strides) > 1 and max(dilations) > 1:  # TF: not both in depthwise
        w, dilations = dilate_kernel(w, [1, *dilations]), [1, 1]
        kh, kw = w.shape[3:]
    xp = array_module(w)
    # One TRANSPOSE of a run-time kernel, to TFLite's layout per tap: (kd, O, kh, kw, I / g),
    # depthwise (kd, 1, kh, kw, O); the move to TF's layout and the converter's move back
    # cancel.
    kernels = xp.transpose(w, [2, 1, 3, 4, 0] if depthwise else [2, 0, 3, 4, 1])
    y = None
    for read in sorted(depth.reads, key=lambda r: r.count != depth.out):
        images = _frames(x, depth, read)
        if depthwise:
            kernel = kernel_tensor(ctx, xp.reshape(kernels[read.tap], [kh, kw, channels, -1]))
            term = depthwise_conv2d(ctx, images, kernel, strides, dilations, padding)
        else:
            kernel = kernel_tensor(ctx, xp.transpose(kernels[read.tap], [1, 2, 3, 0]))
            term = tf.nn.conv2d(images, kernel, strides=[1, *strides, 1], padding=padding,
                                dilations=[1, *dilations, 1])
        if y is None and bias is not None and read.count == depth.out:
            term, bias = tf.nn.bias_add(term, bias), None
        term = tf.reshape(term, [-1, read.count, *term.shape[1:]])
        after = depth.out - read.first_out - read.count
        if read.first_out or after:
            term = tf.pad(term, [[0, 0], [read.first_out, after], [0, 0], [0, 0], [0, 0]])
        y = term if y is None else y + term
    return y if bias is None else tf.nn.bias_add(y, bias)


def conv3d_by_frames(ctx, x, w, bias, groups: int, strides, dilations, pads):
    """The 3-D Conv of channel-last x (static spatial dims) with the ONNX-layout kernel w
    and optional bias, as 2-D convs (see the module docstring).

    x's spatial axes are taken as they lie: the layout plan gives them in ONNX order except
    to a pointwise conv, whose per-axis attributes are all alike."""
    spatial = x.shape[1:4]
    plane = list(w.shape[3:]), strides[1:], dilations[1:]
    same = any(tuple(p) != (0, 0) for p in pads[1:]) and is_tf_same(pads[1:], *plane,
                                                                     spatial[1:])
    conv_args = (strides[1:], dilations[1:], "SAME" if same else "VALID")
    depth = _depth_plan(spatial[0], w.shape[2], strides[0], dilations[0], pads[0])
    x = pad_spatial(x, [depth.pads, *([(0, 0)] * 2 if same else pads[1:])])
    if groups == 1 or not ctx.options.disable_group_convolution:
        return _tapwise(ctx, x, w, bias, depth, conv_args)
    y = per_group(x, w, groups, lambda xi, wi: _tapwise(ctx, xi, wi, None, depth, conv_args))
    return y if bias is None else tf.nn.bias_add(y, bias)  # -dgc: no grouped conv in the file
