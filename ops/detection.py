"""Detection ops: NonMaxSuppression, RoiAlign, MaxRoiPool.

NonMaxSuppression runs one TFLite NON_MAX_SUPPRESSION_V4 per (batch, class) pair, so the
batch and class counts must be static. The ROI ops take the feature map channel-last and
produce (rois, out_h, out_w, C) channel-last outputs; their sampling positions are computed
per axis (bilinear and max-pool windows are separable) and applied with matmuls or gathers.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2tf_alt.layout.policies import channel_last
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

INT32_MAX = 2**31 - 1


# --- NonMaxSuppression -----------------------------------------------------------------------
def _scalar_input(ctx, i: int, default, dtype):
    """Optional scalar input i: a Python number when constant (or absent), else a tensor."""
    if not ctx.has(i):
        return default
    value = ctx.const(i)
    if value is not None:
        return dtype(np.reshape(value, -1)[0])
    value = tf.reshape(ctx.x(i), [])
    if dtype is float:
        return tf.cast(value, tf.float32)
    return tf.cast(tf.minimum(value, tf.cast(INT32_MAX, value.dtype)), tf.int32)


def _strictly_above(threshold):
    """The threshold t' with iou >= t' exactly when iou > t, for float32 iou >= 0: the next
    float32 up for t >= 0 (t + 1 ulp through its bits, a BITCAST at run time), t itself
    below 0 (every iou then exceeds both). -0.0 counts as 0."""
    smallest = np.nextafter(np.float32(0), np.float32(1))  # what 0 and -0.0 become
    if isinstance(threshold, float):
        t = np.float32(threshold)
        above = np.nextafter(t, np.float32(np.inf)) if t > 0 else smallest
        return float(above) if t >= 0 else float(t)
    above = tf.bitcast(tf.bitcast(threshold, tf.int32) + 1, tf.float32)
    return tf.where(threshold > 0, above, tf.where(threshold < 0, threshold, smallest))


def _corner_boxes(boxes):
    """[x_center, y_center, width, height] -> [y1, x1, y2, x2]."""
    center, size = boxes[..., 0:2], boxes[..., 2:4]
    low, high = center - size / 2, center + size / 2
    return tf.concat([low[..., 1:2], low[..., 0:1], high[..., 1:2], high[..., 0:1]], axis=-1)


def _selected_plus_one(boxes, scores, limit, iou, score_threshold):
    """One (batch, class) run: the selected box indices + 1, with 0 for TFLite's padding.

    onnxruntime takes boxes by decreasing score and, among equal scores, by increasing
    index; TFLite's NMS orders equal scores its own way. So the boxes are sorted first (TOPK
    keeps equal scores in index order) and NMS gets their ranks, n down to 1 (0 below the
    score threshold: never selected), which select exactly what onnxruntime selects. A
    never-selected box in front stands for TFLite's padding of its fixed-size output with
    index 0, so that padding maps to 0 here and is dropped the same way in TF.
    """
    count = scores.shape[0]
    if count is None:
        count = tf.shape(scores)[0]
        ranks = tf.cast(tf.range(count, 0, -1), tf.float32)
    else:
        ranks = tf.constant(np.arange(count, 0, -1, dtype=np.float32))
    ordered, order = tf.math.top_k(scores, k=count)
    ranks = tf.where(ordered > score_threshold, ranks, 0.0)
    ranks = tf.concat([[0.0], ranks], axis=0)
    ordered_boxes = tf.concat([tf.zeros([1, 4], boxes.dtype), tf.gather(boxes, order)], 0)
    keep = tf.image.non_max_suppression(ordered_boxes, ranks, limit, iou, 0.5)
    return tf.gather(tf.concat([[-1], order], axis=0), keep) + 1


@handler("NonMaxSuppression", since=10,
         limits="static batch and class counts; TF keeps an IoU one float32 step above "
                "iou_threshold")
def non_max_suppression(ctx):
    """Selected [batch, class, box] triples, by batch, then class, then decreasing score.

    ONNX (and onnxruntime) suppress IoU > threshold and keep score > score_threshold. TF
    does the same, but TFLite's NON_MAX_SUPPRESSION_V4 suppresses IoU >= threshold, so the
    threshold is raised to the next float32 (`_strictly_above`): exact in TFLite; TF then
    keeps an IoU exactly one float32 step above the threshold, which ONNX suppresses.
    """
    batches, boxes_count = ctx.shape(0)[:2]
    classes = ctx.shape(1)[1]
    if batches is None or classes is None:
        raise NotImplementedError("NonMaxSuppression needs static batch and class counts")
    limit = _scalar_input(ctx, 2, 0, int)
    if isinstance(limit, int):
        limit = min(limit, boxes_count or INT32_MAX, INT32_MAX)
        if limit <= 0:
            return np.zeros((0, 3), np.int64)
    if boxes_count is None or not isinstance(limit, int):
        # TFLite sizes (and zero-fills) NMS outputs to max_output_size: a limit of INT32_MAX
        # (torchvision exports INT64_MAX) would allocate 8 GB and take seconds, so never
        # ask for more boxes than there are.
        limit = tf.minimum(limit, tf.shape(ctx.x(0))[1])
    iou = _strictly_above(_scalar_input(ctx, 3, 0.0, float))
    score_threshold = _scalar_input(ctx, 4, float("-inf"), float)
    boxes, scores = ctx.x(0), ctx.x(1)
    if ctx.attr("center_point_box", 0):
        boxes = _corner_boxes(boxes)
    # Indexed, not unstacked: TFLite's UNPACK refuses an empty input even in an IF branch
    # that is not taken (torchvision's batched_nms when no box is left)
    boxes = [boxes[b] for b in range(batches)]
    scores = tf.reshape(scores, [batches * classes, -1])
    scores = [scores[k] for k in range(batches * classes)]
    width = boxes_count + 1 if boxes_count is not None else tf.shape(boxes[0])[0] + 1
    codes = []  # (batch * classes + class) * width + box + 1, one run per (batch, class)
    for pair, class_scores in enumerate(scores):
        keep = _selected_plus_one(boxes[pair // classes], class_scores, limit, iou,
                                  score_threshold)
        codes.append(keep + pair * width if pair else keep)
    codes = tf.concat(codes, axis=0) if len(codes) > 1 else codes[0]
    codes = tf.gather(codes, tf.reshape(tf.where(codes % width > 0), [-1]))
    pair = codes // width
    return tf.stack([pair // classes, pair % classes, codes % width - 1], axis=1)


# --- RoiAlign --------------------------------------------------------------------------------
def _divided(x, bins: int):
    """x / bins rounded as onnxruntime rounds it: a ceil or floor of it (or of its multiples)
    decides sampling grids and bin edges, where 6 / 3 is 2 but 6 * fl(1/3) is above 2. TF's
    converter turns a division by a constant into a product with its reciprocal, so the
    divisor is made at run time (x * 0 + bins; x is finite) and the DIV stays."""
    return x / (x * 0.0 + float(bins))


def _bilinear_taps(start, length, grid, bins: int, max_grid: int, extent: int):
    """Bilinear taps along one axis for every roi (R), output bin and sample (G).

    start, length, grid: (R,) float32. Returns (low, high) int32 indices and their weights,
    each (R, bins, G), as onnxruntime computes them (a sample beyond [-1, extent] weighs
    nothing), and the (R, 1, G) mask of samples inside each roi's sampling grid.
    """
    step = _divided(length, bins)
    samples = np.arange(max_grid, dtype=np.float32)[None, None, :]
    pos = (start[:, None, None] + step[:, None, None] * np.arange(bins, dtype=np.float32)[:, None]
           + (step / grid)[:, None, None] * (samples + 0.5))
    inside = tf.cast((pos >= -1.0) & (pos <= extent), tf.float32)
    pos = tf.maximum(pos, 0.0)
    low = tf.minimum(tf.floor(pos), extent - 1.0)
    frac = tf.where(pos >= extent - 1.0, 0.0, pos - low)
    high = tf.minimum(low + 1.0, extent - 1.0)
    in_grid = grid[:, None, None] > samples
    weights = ((1.0 - frac) * inside, frac * inside)
    return (tf.cast(low, tf.int32), tf.cast(high, tf.int32)), weights, in_grid


def _max_grid(ctx, rois_index: int, column: int, bins: int, extent: int, scale: float,
              ratio: int) -> int:
    """Static bound on the adaptive sampling grid (ceil(roi size / bins)) along one axis."""
    if ratio > 0:
        return ratio
    rois = ctx.const(rois_index)
    if rois is None:  # rois inside the feature map
        return max(1, math.ceil(extent / bins))
    size = np.abs(rois[:, column + 2] - rois[:, column]) * scale
    return max(1, int(np.ceil(np.max(size, initial=1.0) / bins)))


def _roi_align(ctx, half_pixel: bool):
    n, height, width, channels = ctx.phys_shape(0)
    if None in (n, height, width, channels):
        raise NotImplementedError("RoiAlign needs a static feature-map shape")
    out_h, out_w = ctx.attr("output_height", 1), ctx.attr("output_width", 1)
    scale, ratio = ctx.attr("spatial_scale", 1.0), ctx.attr("sampling_ratio", 0)
    x, rois = ctx.x(0), tf.cast(ctx.x(1), tf.float32)
    batch = tf.cast(ctx.x(2), tf.int32)
    corner = rois * scale - (0.5 if half_pixel else 0.0)
    start_x, start_y, end_x, end_y = (corner[:, i] for i in range(4))
    length_x, length_y = end_x - start_x, end_y - start_y
    if not half_pixel:
        length_x, length_y = tf.maximum(length_x, 1.0), tf.maximum(length_y, 1.0)
    if ratio > 0:
        grid_y = grid_x = tf.fill(tf.shape(start_y), float(ratio))
    else:
        grid_y = tf.math.ceil(_divided(length_y, out_h))
        grid_x = tf.math.ceil(_divided(length_x, out_w))
    taps_y = _bilinear_taps(start_y, length_y, grid_y, out_h,
                            _max_grid(ctx, 1, 1, out_h, height, scale, ratio), height)
    taps_x = _bilinear_taps(start_x, length_x, grid_x, out_w,
                            _max_grid(ctx, 1, 0, out_w, width, scale, ratio), width)
    count = grid_y * grid_x
    if ctx.attr("mode", "avg") == "max":
        out = _roi_max(x, batch, taps_y, taps_x, height, width, channels)
    else:
        out = _roi_average(x, batch, taps_y, taps_x, n, height, width, channels)
        out = out / tf.maximum(count, 1.0)[:, None, None, None]
    return tf.where((count > 0)[:, None, None, None], out, tf.zeros_like(out))


def _roi_average(x, batch, taps_y, taps_x, n, height, width, channels):
    """Average of the bilinear samples: two matmuls with per-roi interpolation weights."""
    rows = []
    for taps, extent, base in ((taps_y, height, batch * height), (taps_x, width, None)):
        (low, high), (w_low, w_high), in_grid = taps
        if base is not None:
            low, high, extent = low + base[:, None, None], high + base[:, None, None], n * extent
        keep = tf.cast(in_grid, tf.float32)
        weights = tf.one_hot(low, extent) * (w_low * keep)[..., None]
        weights += tf.one_hot(high, extent) * (w_high * keep)[..., None]
        rows.append(tf.reduce_sum(weights, axis=2))
    weight_y, weight_x = rows  # (R, out_h, N*H) and (R, out_w, W)
    out_h = weight_y.shape[1]
    # Batched (of one) so that constant weights stay the left operand of a BATCH_MATMUL
    # instead of becoming a FULLY_CONNECTED between two transposes.
    # One extra zero row, sliced off after the product: XNNPACK cannot reshape a product
    # of no rows (no rois, e.g. a feature level that receives no box).
    flat = tf.reshape(x, [1, n * height, width * channels])
    rows = tf.concat([tf.reshape(weight_y, [1, -1, n * height]),
                      tf.zeros([1, 1, n * height])], axis=1)
    along_y = tf.matmul(rows, flat)[:, :-1]
    along_y = tf.reshape(along_y, [-1, out_h, width, channels])
    return tf.matmul(weight_x[:, None], along_y)


def _roi_max(x, batch, taps_y, taps_x, height, width, channels):
    """onnxruntime's max mode: per sample, the largest weighted corner; then the largest
    over the samples in the roi's grid."""
    (lows_y, w_y, grid_y), (lows_x, w_x, grid_x) = taps_y, taps_x
    flat = tf.reshape(x, [-1, channels])
    rows = batch[:, None, None, None, None] * height
    best = None
    for y, wy in zip(lows_y, w_y):
        for xx, wx in zip(lows_x, w_x):
            index = (rows + y[:, :, :, None, None]) * width + xx[:, None, None, :, :]
            weight = wy[:, :, :, None, None] * wx[:, None, None, :, :]
            value = tf.gather(flat, index) * weight[..., None]
            best = value if best is None else tf.maximum(best, value)
    in_grid = grid_y[:, :, :, None, None, None] & grid_x[:, None, None, :, :, None]
    best = tf.where(in_grid, best, float("-inf"))
    return tf.reduce_max(best, axis=[2, 4])


@handler("RoiAlign", since=10, layout=channel_last(0),
         limits="static feature-map shape; adaptive sampling with run-time rois assumes rois "
                "inside the feature map")
def roi_align_v10(ctx):
    return _roi_align(ctx, half_pixel=False)


@handler("RoiAlign", since=16, layout=channel_last(0),
         limits="static feature-map shape; adaptive sampling with run-time rois assumes rois "
                "inside the feature map")
def roi_align(ctx):
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    return _roi_align(ctx, half_pixel=mode == "half_pixel")


# --- MaxRoiPool ------------------------------------------------------------------------------
def _round_half_away(v):
    return tf.sign(v) * tf.floor(tf.abs(v) + 0.5)


def _pool_windows(start, end, bins: int, extent: int):
    """(R, bins, extent) bool: positions inside each bin's window, as onnxruntime clips them."""
    length = tf.maximum(end - start + 1.0, 1.0)
    step = _divided(length, bins)[:, None]
    index = np.arange(bins, dtype=np.float32)[None, :]
    low = tf.clip_by_value(tf.floor(step * index) + start[:, None], 0.0, float(extent))
    high = tf.clip_by_value(tf.math.ceil(step * (index + 1)) + start[:, None], 0.0, float(extent))
    position = np.arange(extent, dtype=np.float32)[None, None, :]
    return (low[..., None] <= position) & (high[..., None] > position)


@handler("MaxRoiPool", layout=channel_last(0), limits="static feature-map height and width")
def max_roi_pool(ctx):
    """Max over each bin's window (0 for an empty one): columns, then rows, one bin at a
    time to bound memory."""
    _, height, width, _ = ctx.phys_shape(0)
    if height is None or width is None:
        raise NotImplementedError("MaxRoiPool needs static feature-map height and width")
    out_h, out_w = ctx.attr("pooled_shape")
    scale = ctx.attr("spatial_scale", 1.0)
    rois = tf.cast(ctx.x(1), tf.float32)
    corners = [_round_half_away(rois[:, i] * scale) for i in range(1, 5)]
    rows = _pool_windows(corners[1], corners[3], out_h, height)  # (R, out_h, H)
    cols = _pool_windows(corners[0], corners[2], out_w, width)  # (R, out_w, W)
    x = tf.gather(ctx.x(0), tf.cast(rois[:, 0], tf.int32))  # (R, H, W, C)
    low = tf.constant(float("-inf"), x.dtype)
    per_col = [tf.reduce_max(tf.where(cols[:, j, None, :, None], x, low), axis=2)
               for j in range(out_w)]
    by_col = tf.stack(per_col, axis=2)  # (R, H, out_w, C)
    per_row = [tf.reduce_max(tf.where(rows[:, i, :, None, None], by_col, low), axis=1)
               for i in range(out_h)]
    out = tf.stack(per_row, axis=1)  # (R, out_h, out_w, C)
    filled = tf.reduce_any(rows, axis=2)[:, :, None] & tf.reduce_any(cols, axis=2)[:, None, :]
    return tf.where(filled[..., None], out, tf.zeros_like(out))
