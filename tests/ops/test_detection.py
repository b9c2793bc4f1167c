"""NonMaxSuppression, RoiAlign, MaxRoiPool (ops/detection.py) against onnxruntime, through
TF and the float32 TFLite."""

import numpy as np
import pytest

from harness import Rng, check_model, check_nodes, make_model, node

rng = Rng(0)


def scalar(value, dtype=np.float32):
    return np.array([value], dtype)


# --- NonMaxSuppression ---------------------------------------------------------------------
def corner_boxes(batches, count):
    """Overlapping boxes around a few centres, as [y1, x1, y2, x2] with corners in any order."""
    centres = rng.random((batches, 2, 2)) * 10
    centre = centres[:, rng.integers(0, 2, count)] + rng.normal(0, 0.4, (batches, count, 2))
    size = rng.uniform(1.5, 4.0, (batches, count, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], -1)
    flip = rng.random((batches, count)) < 0.3
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


def nms_inputs(batches, classes, count):
    scores = rng.permutation(batches * classes * count).reshape(batches, classes, count)
    return corner_boxes(batches, count), (scores / scores.size).astype(np.float32)


def test_nms_thresholds_and_limits():
    boxes, scores = nms_inputs(2, 3, 13)
    inits = {"limit": np.array([4], np.int64), "big": np.array([100], np.int64),
             "iou": scalar(0.3), "score": scalar(0.5), "loose": scalar(0.6)}
    nodes = [
        node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], "a"),
        node("NonMaxSuppression", ["boxes", "scores", "big", "loose"], "b"),
        node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", ""], "c"),
        node("NonMaxSuppression", ["boxes", "scores"], "d"),  # no limit: selects nothing
        node("Concat", ["d", "a"], "da", axis=0),  # an empty output cannot be read back
    ]
    check_nodes(nodes, {"boxes": boxes, "scores": scores}, inits, opset=11,
                outputs=["a", "b", "c", "da"])


@pytest.mark.parametrize("runtime", [False, True], ids=["constant", "runtime"])
def test_nms_iou_equal_to_threshold_is_kept(runtime):
    """ONNX suppresses only IoU > threshold; TFLite's NMS suppresses IoU >= threshold, so
    boxes whose IoU with a kept box is exactly the threshold (1/7, 1/4, 0 for touching
    boxes) must survive, in TF and in TFLite alike."""
    boxes = np.array([[[0, 0, 1, 1], [0.5, 0.5, 1.5, 1.5], [0, 0.5, 1, 2], [1, 0, 2, 1]]],
                     np.float32)  # IoU with box 0: 1/7, 1/4, 0
    scores = np.array([[[0.9, 0.8, 0.7, 0.6], [0.6, 0.9, 0.8, 0.7]]], np.float32)
    thresholds = {"seventh": np.float32(1 / 7), "quarter": 0.25, "zero": 0.0,
                  "negative_zero": -0.0}
    values = {name: scalar(t) for name, t in thresholds.items()}
    limit = {"limit": np.array([4], np.int64)}
    nodes = [node("NonMaxSuppression", ["boxes", "scores", "limit", name], f"y_{name}")
             for name in thresholds]
    feeds = {"boxes": boxes, "scores": scores, **(values if runtime else {})}
    check_nodes(nodes, feeds, {**limit, **({} if runtime else values)}, opset=11)


def test_nms_center_point_box_runtime_thresholds_opset10():
    boxes, scores = nms_inputs(3, 2, 9)
    centred = np.concatenate([(boxes[..., 1::-1] + boxes[..., 3:1:-1]) / 2,
                              np.abs(boxes[..., 3:1:-1] - boxes[..., 1::-1])], -1)
    inputs = {"boxes": centred, "scores": scores, "limit": np.array([3], np.int64),
              "iou": scalar(0.2), "score": scalar(0.1)}  # all at run time
    nodes = [node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], "y",
                  center_point_box=1)]
    model = make_model(nodes, inputs, ["y"], opset=11)  # opset 10 infers no output shape
    model.opset_import[0].version = 10
    check_model(model, inputs)


def test_nms_equal_scores_are_taken_in_index_order():
    """onnxruntime takes equal scores by increasing box index (saturated sigmoids and
    random-weight detectors tie often); TFLite's NMS orders ties its own way unless given
    distinct ranks. Scores from 4 levels, overlapping boxes, two classes, a threshold."""
    boxes = corner_boxes(2, 41)
    scores = (rng.integers(0, 4, (2, 2, 41)) / 3).astype(np.float32)
    inits = {"limit": np.array([9], np.int64), "iou": scalar(0.4), "score": scalar(0.3)}
    nodes = [node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], "a"),
             node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], "b")]
    check_nodes(nodes, {"boxes": boxes, "scores": scores}, inits, opset=11)


@pytest.mark.parametrize("count", [0, 5])
def test_nms_with_no_boxes_at_run_time(count):
    """No box left (torchvision's batched_nms on an empty detection set): nothing is
    selected. TFLite's UNPACK refused the empty boxes, even in an IF branch not taken."""
    boxes, scores = nms_inputs(1, 1, count)
    nodes = [node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], "selected"),
             node("Concat", ["first", "selected"], "y", axis=0)]  # never empty: readable
    inits = {"limit": np.array([3], np.int64), "iou": scalar(0.3),
             "first": np.array([[7, 7, 7]], np.int64)}
    feeds = {"boxes": boxes, "scores": scores}
    model = make_model(nodes, feeds, ["y"], inits,
                       input_shapes={"boxes": [1, "n", 4], "scores": [1, 1, "n"]})
    check_model(model, feeds)


def test_nms_unbounded_limit_with_runtime_box_count():
    """torchvision's exports: boxes and scores of a run-time length, and max_output_boxes
    INT64_MAX. TFLite sizes and zero-fills its NMS outputs to max_output_size, so the
    limit handed to it must be the box count, not INT32_MAX (8 GB, seconds per call)."""
    boxes, scores = nms_inputs(1, 1, 23)
    nodes = [
        node("Unsqueeze", ["flat_boxes", "zero"], "boxes"),
        node("Unsqueeze", ["flat_scores", "zero_one"], "scores"),
        node("NonMaxSuppression", ["boxes", "scores", "unbounded", "iou"], "selected"),
    ]
    feeds = {"flat_boxes": boxes[0], "flat_scores": scores[0, 0]}
    inits = {"zero": np.array([0], np.int64), "zero_one": np.array([0, 1], np.int64),
             "unbounded": np.array([2**63 - 1], np.int64), "iou": scalar(0.3)}
    model = make_model(nodes, feeds, ["selected"], inits, opset=13,
                       input_shapes={"flat_boxes": ["n", 4], "flat_scores": ["n"]})
    converted = check_model(model, feeds)

    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=converted.tflite,
                              experimental_preserve_all_tensors=True)
    for detail in interpreter.get_input_details():
        name = next(n for n in feeds if n in detail["name"])
        interpreter.resize_tensor_input(detail["index"], feeds[name].shape)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        name = next(n for n in feeds if n in detail["name"])
        interpreter.set_tensor(detail["index"], feeds[name])
    interpreter.invoke()
    nms = [op for op in interpreter._get_ops_details()
           if op["op_name"] == "NON_MAX_SUPPRESSION_V4"]
    assert len(nms) == 1
    limit = interpreter.get_tensor(nms[0]["inputs"][2])
    assert int(limit) <= len(boxes[0]) + 1, limit  # + the never-selected padding box


def test_yolo_style_detector_head():
    """Conv -> Reshape/Transpose to (N, boxes, 4 + C) -> Slice boxes and scores -> Transpose
    scores to (N, C, boxes) -> NonMaxSuppression: the selected indices match."""
    classes = 3
    nodes = [
        node("Conv", ["x", "w"], "features", pads=[1, 1, 1, 1]),
        node("Sigmoid", ["features"], "act"),
        node("Reshape", ["act", "flat_shape"], "flat"),
        node("Transpose", ["flat"], "rows", perm=[0, 2, 1]),
        node("Slice", ["rows", "box_start", "box_end", "last"], "xywh"),
        node("Slice", ["rows", "box_end", "score_end", "last"], "class_scores"),
        node("Mul", ["xywh", "image_size"], "boxes"),
        node("Transpose", ["class_scores"], "scores", perm=[0, 2, 1]),
        node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], "selected",
             center_point_box=1),
    ]
    inits = {
        "w": rng.standard_normal((4 + classes, 3, 3, 3)).astype(np.float32) * 0.2,
        "flat_shape": np.array([2, 4 + classes, -1], np.int64),
        "box_start": np.array([0], np.int64),
        "box_end": np.array([4], np.int64),
        "score_end": np.array([4 + classes], np.int64),
        "last": np.array([-1], np.int64),
        "image_size": np.array([32, 24, 24, 18], np.float32),
        "limit": np.array([20], np.int64),
        "iou": scalar(0.3),
        "score": scalar(0.25),
    }
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits,
                            outputs=["selected"])
    assert census.get("NON_MAX_SUPPRESSION_V4", 0) == 2 * classes, census


# --- RoiAlign ------------------------------------------------------------------------------
def rois_inside(count, height, width, scale):
    """[x1, y1, x2, y2] rois inside a height x width map, in input coordinates (1 / scale)."""
    x = np.sort(rng.uniform(0, width - 1, (count, 2)), axis=1)
    y = np.sort(rng.uniform(0, height - 1, (count, 2)), axis=1)
    return (np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], -1) / scale).astype(np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(mode):
    x = rng.randn(2, 3, 9, 11)
    rois = rois_inside(5, 9, 11, 0.5)
    rois[0] = [-3.0, -2.0, 25.0, 30.0]  # reaching past the map
    batch = np.array([0, 1, 1, 0, 1], np.int64)
    inputs = {"x": x, "rois": rois, "batch": batch}
    inits = {"fixed": rois_inside(3, 9, 11, 1.0), "fixed_batch": np.array([1, 0, 1], np.int64)}
    nodes = [
        node("RoiAlign", ["x", "rois", "batch"], "a", mode=mode, output_height=3,
             output_width=4, sampling_ratio=2, spatial_scale=0.5),
        node("RoiAlign", ["x", "rois", "batch"], "b", mode=mode, output_height=2,
             output_width=3, sampling_ratio=1, spatial_scale=0.5,
             coordinate_transformation_mode="output_half_pixel"),
        node("RoiAlign", ["x", "fixed", "fixed_batch"], "c", mode=mode, output_height=3,
             output_width=2),
    ]
    check_nodes(nodes, inputs, inits)


def test_roi_align_adaptive_sampling_runtime_rois_opset10():
    x = rng.randn(2, 4, 10, 7)
    rois = rois_inside(6, 10, 7, 1.0)
    batch = np.array([1, 0, 0, 1, 1, 0], np.int64)
    nodes = [node("RoiAlign", ["x", "rois", "batch"], "y", output_height=2, output_width=3,
                  sampling_ratio=0)]
    check_nodes(nodes, {"x": x, "rois": rois, "batch": batch}, opset=10)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_with_no_rois_at_run_time(mode):
    """A feature level that receives no box (torchvision's MultiScaleRoIAlign): zero rois
    give an empty result; XNNPACK refused the empty BATCH_MATMUL ("failed to reshape")."""
    nodes = [node("RoiAlign", ["x", "rois", "batch"], "y", mode=mode, output_height=3,
                  output_width=2, sampling_ratio=2, spatial_scale=0.5)]
    for count in (0, 2):
        inputs = {"x": rng.randn(2, 4, 9, 11), "rois": rois_inside(count, 9, 11, 0.5),
                  "batch": np.arange(count, dtype=np.int64) % 2}
        check_nodes(nodes, inputs, input_shapes={"rois": ["r", 4], "batch": ["r"]})


def test_roi_align_between_convs_has_no_transpose():
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        node("RoiAlign", ["a", "rois", "batch"], "m", output_height=4, output_width=3,
             sampling_ratio=2, spatial_scale=0.25),
        node("Conv", ["m", "w2"], "y", pads=[1, 1, 1, 1]),
    ]
    inits = {"w1": rng.randn(4, 3, 3, 3), "w2": rng.randn(2, 4, 3, 3),
             "rois": rois_inside(3, 8, 6, 0.25), "batch": np.array([0, 1, 1], np.int64)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits, outputs=["y"])
    assert census.get("TRANSPOSE", 0) == 0, census


def test_roi_align_grid_of_an_exact_multiple():
    """Adaptive sampling of rois whose size is a whole multiple of the output (14 / 7, 6 / 3,
    12 / 3): the sample count is ceil(size / bins), which must be exactly the quotient, as in
    onnxruntime (one more would sample another row or column)."""
    x = np.random.default_rng(11).normal(size=(1, 2, 16, 16)).astype(np.float32)
    rois = np.array([[0, 0, 14, 6], [1, 2, 15, 14], [0.5, 1, 6.5, 13]], np.float32)
    nodes = [node("RoiAlign", ["x", "rois", "batch"], "y", output_height=3, output_width=7,
                  sampling_ratio=0)]
    check_nodes(nodes, {"x": x, "rois": rois, "batch": np.zeros(3, np.int64)})


# --- MaxRoiPool ----------------------------------------------------------------------------
def test_max_roi_pool_bin_edges_on_whole_numbers():
    """Rois 1..17 columns wide in 3 and 13 bins: where (i + 1) * (width / bins) is a whole
    number in onnxruntime's float arithmetic, the bin ends there (7 / 3 * 3 is 7); with the
    reciprocal's rounding it reached one column further."""
    x = np.random.default_rng(12).normal(size=(1, 2, 12, 20)).astype(np.float32)
    rois = np.array([[0, 1, 1, width, 6] for width in range(1, 18)], np.float32)
    nodes = [node("MaxRoiPool", ["x", "rois"], "a", pooled_shape=[3, 3]),
             node("MaxRoiPool", ["x", "rois"], "b", pooled_shape=[2, 13])]
    check_nodes(nodes, {"x": x, "rois": rois})


def test_max_roi_pool():
    x = rng.randn(2, 3, 9, 11)
    rois = np.concatenate([np.array([[0], [1], [1], [0]], np.float32),
                           rois_inside(4, 9, 11, 0.5)], axis=1)
    rois[3, 1:] = [-6.3, 14.2, 30.6, 40.1]  # past the map: some bins are empty
    nodes = [
        node("MaxRoiPool", ["x", "rois"], "a", pooled_shape=[2, 3], spatial_scale=0.5),
        node("MaxRoiPool", ["x", "rois"], "b", pooled_shape=[4, 1], spatial_scale=0.5),
    ]
    check_nodes(nodes, {"x": x, "rois": rois})


def test_max_roi_pool_between_convs_has_no_transpose():
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        node("MaxRoiPool", ["a", "rois"], "m", pooled_shape=[3, 2]),
        node("Conv", ["m", "w2"], "y", pads=[1, 1, 1, 1]),
    ]
    rois = np.array([[0, 0.2, 1.4, 4.6, 6.3], [1, 2.0, 0.0, 5.0, 3.7]], np.float32)
    inits = {"w1": rng.randn(4, 3, 3, 3), "w2": rng.randn(2, 4, 3, 3), "rois": rois}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits, outputs=["y"])
    assert census.get("TRANSPOSE", 0) == 0, census
