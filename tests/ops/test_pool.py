"""Pooling ops against onnxruntime, through TF and the float32 TFLite.

Each test puts one node per attribute combination into one model (one conversion), with
outputs named after the attributes, so a failure names its combination.
"""

import numpy as np
import pytest
import tf_keras
from onnx import helper

from onnx2tf_alt.export.keras_files import save_h5, save_keras_v3

from harness import (
    Rng,
    assert_close,
    check_model,
    check_nodes,
    convert,
    label,
    make_model,
    to_physical,
)

rng = Rng(0)

X1 = (2, 3, 11)
X2 = (2, 3, 7, 9)
X3 = (2, 3, 5, 6, 7)


def check_cases(op, x, cases, opset=18, indices=False, input_shapes=None):
    """One `op` node per attribute dict, on one input x (an array, or a shape for random
    data); with `indices` each node also outputs MaxPool's Indices. Returns the TFLite
    census, which must hold no TRANSPOSE, no Flex op and no MIRROR_PAD (XNNPACK does not run
    it)."""
    x = x if isinstance(x, np.ndarray) else rng.randn(*x)
    nodes = []
    for attrs in cases:
        outputs = [label(op, attrs)] + ([label(op, attrs) + ".indices"] if indices else [])
        nodes.append(helper.make_node(op, ["x"], outputs, **attrs))
    if input_shapes:  # check_nodes has no symbolic input shapes
        outputs = [o for n in nodes for o in n.output]
        check_model(make_model(nodes, {"x": x}, outputs, opset=opset,
                               input_shapes=input_shapes), {"x": x})
        return None
    _, counts = check_nodes(nodes, {"x": x}, opset=opset)
    assert "TRANSPOSE" not in counts and "MIRROR_PAD" not in counts, counts
    assert not any(name.startswith("Flex") for name in counts), counts
    return counts


# --- MaxPool ------------------------------------------------------------------------------


def test_max_pool2d():
    cases = [
        {"kernel_shape": [3, 3]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [0, 1, 2, 1]},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
        {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 2], "pads": [2, 1, 1, 0]},
        {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [1, 2], "ceil_mode": 1},
    ]
    counts = check_cases("MaxPool", X2, cases)
    assert counts.get("MAX_POOL_2D") == 7, counts


def test_max_pool_pads_fold_into_same():
    """Pads that TF's SAME reproduces once unreached end pads are dropped (odd sizes, ceil_mode
    leftovers): one MAX_POOL_2D and nothing else."""
    cases = [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 1, 1]},
        {"kernel_shape": [5, 3], "pads": [2, 1, 2, 1]},
    ]
    counts = check_cases("MaxPool", (3, 4, 9, 7), cases)
    assert counts == {"MAX_POOL_2D": len(cases)}, counts
    counts = check_cases("MaxPool", (2, 3, 11), [
        {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
        {"kernel_shape": [3], "strides": [2], "ceil_mode": 1},
    ])
    assert "PAD" not in counts and "CONCATENATION" not in counts, counts


def test_max_pool_explicit_pads_without_mirror_pad():
    """Pads TF's SAME does not reproduce (even sizes, as in ResNet's stem; begin-heavy pads):
    copies of the edge through STRIDED_SLICE + CONCATENATION, not MIRROR_PAD (XNNPACK does not run
    it) nor a PADV2 with the lowest value (it breaks INT8 calibration)."""
    cases = [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 0, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2]},
        {"kernel_shape": [4, 3], "strides": [3, 2], "pads": [3, 1, 0, 2]},
    ]
    counts = check_cases("MaxPool", (3, 5, 8, 10), cases)
    assert counts.get("MAX_POOL_2D") == len(cases), counts
    assert "PADV2" not in counts and "PAD" not in counts, counts
    counts = check_cases("MaxPool", (2, 3, 6, 8, 10), [
        {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]},
    ])
    assert counts.get("MAX_POOL_2D") == 2 and "PADV2" not in counts, counts


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_max_pool_8bit(dtype):
    """8-bit MaxPool (opset 12+) runs in float32: TFLite's MAX_POOL_2D takes 8-bit values
    only quantized. The dtype's extremes reach the padded borders."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, X2, dtype=dtype, endpoint=True)
    x[:, :, 0, :3] = info.min
    x[:, :, -1, -3:] = info.max
    cases = [
        {"kernel_shape": [3, 3]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [0, 1, 2, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [1, 2], "ceil_mode": 1},
    ]
    counts = check_cases("MaxPool", x, cases, opset=12)
    assert counts.get("MAX_POOL_2D") == 4, counts
    check_cases("MaxPool", x, [{"kernel_shape": [2, 3], "pads": [1, 1, 0, 1]}], opset=12,
                indices=True)


@pytest.mark.parametrize("opset", [7, 10, 12, 23])
def test_max_pool_opsets(opset):
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 2, 0, 1]},
             {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}]
    check_cases("MaxPool", X2, cases, opset=opset)


@pytest.mark.parametrize(
    "shape,cases",
    [
        (X1, [{"kernel_shape": [3], "strides": [2], "pads": [1, 0], "ceil_mode": 1},
              {"kernel_shape": [2], "strides": [2], "auto_pad": "SAME_UPPER"}]),
        (X3, [{"kernel_shape": [2, 3, 2], "strides": [2, 2, 2], "pads": [1, 0, 1, 0, 1, 1]},
              {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "auto_pad": "SAME_UPPER"},
              {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1}]),
    ],
)
def test_max_pool_1d_3d(shape, cases):
    counts = check_cases("MaxPool", shape, cases)
    pools_per_case = 2 if len(shape) == 5 else 1  # 3-D runs as two 2-D pools
    assert counts.get("MAX_POOL_2D") == len(cases) * pools_per_case, counts


@pytest.mark.parametrize(
    "shape,cases",
    [
        (X2, [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]},
              {"kernel_shape": [2, 3], "strides": [2, 2], "storage_order": 1},
              {"kernel_shape": [2, 2], "strides": [2, 1], "dilations": [2, 2],
               "ceil_mode": 1}]),
        (X1, [{"kernel_shape": [3], "strides": [2], "auto_pad": "SAME_LOWER"}]),
        (X3, [{"kernel_shape": [2, 2, 3], "strides": [2, 2, 2], "storage_order": 1},
              {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}]),
    ],
)
def test_max_pool_indices(shape, cases):
    check_cases("MaxPool", shape, cases, indices=True)


def test_max_pool_indices_ties():
    """Many equal values (as after a ReLU): the first maximum in the window wins."""
    x = np.maximum(rng.integers(-2, 3, X2), 0).astype(np.float32)
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
             {"kernel_shape": [2, 3], "strides": [1, 2], "storage_order": 1}]
    check_cases("MaxPool", x, cases, indices=True)


def test_max_pool_dynamic_batch():
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 1]},
             {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}]
    check_cases("MaxPool", X2, cases, indices=True, input_shapes={"x": ["N", *X2[1:]]})


# --- AveragePool --------------------------------------------------------------------------


def test_average_pool2d():
    padded = [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
        {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    ]
    cases = [{**a, "count_include_pad": c} for a in padded for c in (0, 1)] + [
        {"kernel_shape": [3, 3], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    ]
    counts = check_cases("AveragePool", X2, cases)
    assert set(counts) <= {"PAD", "AVERAGE_POOL_2D", "MUL"}, counts


def test_average_pool_dilations():
    base = {"kernel_shape": [2, 3], "strides": [2, 1], "dilations": [2, 2],
            "pads": [1, 2, 0, 1], "ceil_mode": 1}
    check_cases("AveragePool", X2, [{**base, "count_include_pad": c} for c in (0, 1)],
                opset=19)


@pytest.mark.parametrize("opset", [7, 11, 19, 23])
def test_average_pool_opsets(opset):
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2]},
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}]
    check_cases("AveragePool", X2, cases, opset=opset)


@pytest.mark.parametrize(
    "shape,cases",
    [
        (X1, [{"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 1,
               "ceil_mode": 1},
              {"kernel_shape": [2], "strides": [2], "auto_pad": "SAME_UPPER"}]),
        (X3, [{"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [1, 0, 1, 0, 1, 1]},
              {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "auto_pad": "SAME_UPPER"},
              {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1,
               "count_include_pad": 1, "pads": [1, 1, 1, 0, 0, 0]}]),
    ],
)
def test_average_pool_1d_3d(shape, cases):
    check_cases("AveragePool", shape, cases)


def test_average_pool_dynamic_batch():
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 1]},
             {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}]
    check_cases("AveragePool", X2, cases, input_shapes={"x": ["N", *X2[1:]]})


# --- LpPool -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,cases,opset",
    [
        (X2, [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]},
              {"kernel_shape": [2, 3], "p": 1}], 7),
        (X2, [{"kernel_shape": [3, 2], "p": 3, "strides": [2, 2], "dilations": [2, 1],
               "ceil_mode": 1, "pads": [1, 1, 0, 0]},
              {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}], 18),
        (X1, [{"kernel_shape": [3], "strides": [2], "auto_pad": "SAME_UPPER"}], 11),
        (X3, [{"kernel_shape": [2, 2, 3], "strides": [2, 1, 2],
               "pads": [1, 0, 1, 0, 1, 1]}], 11),
    ],
)
def test_lp_pool(shape, cases, opset):
    check_cases("LpPool", shape, cases, opset=opset)


# --- global pools -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [X1, X2, X3])
def test_global_pools(shape):
    x = rng.randn(*shape)
    nodes = [helper.make_node(op, ["x"], [op], **attrs) for op, attrs in [
        ("GlobalAveragePool", {}), ("GlobalMaxPool", {}), ("GlobalLpPool", {}),
        ("GlobalLpPool", {"p": 3}),
    ]]
    nodes[-1].output[0] = "GlobalLpPool(p=3)"
    check_nodes(nodes, {"x": x})


def test_global_pool_dynamic_batch():
    check_cases("GlobalAveragePool", X2, [{}], input_shapes={"x": ["N", *X2[1:]]})


@pytest.mark.parametrize(
    "op,cases",
    [
        ("MaxPool", [{"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
                     {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1]}]),
        ("AveragePool", [{"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
                         {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1],
                          "count_include_pad": 1}]),
        ("GlobalMaxPool", [{}]),
    ],
)
def test_pools_unknown_spatial_dims(op, cases):
    check_cases(op, X2, cases, input_shapes={"x": ["N", 3, "H", "W"]})


# --- inside a channel-last chain ----------------------------------------------------------


def test_pools_between_convs():
    """Conv -> each pool -> Conv: the whole model stays channel-last, no TRANSPOSE."""
    pools = [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("LpPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ("GlobalAveragePool", {}),
    ]
    x = rng.randn(2, 3, 9, 11)
    init = {"w1": rng.randn(6, 3, 3, 3), "b1": rng.randn(6)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1])]
    for i, (op, attrs) in enumerate(pools):
        init[f"w{i + 2}"] = rng.randn(4, 6, 1, 1)
        nodes.append(helper.make_node(op, ["c1"], [f"p{i}"], **attrs))
        nodes.append(helper.make_node("Conv", [f"p{i}", f"w{i + 2}"], [label(op, attrs)]))
    outputs = [label(op, attrs) for op, attrs in pools]
    _, counts = check_nodes(nodes, {"x": x}, init, outputs=outputs)
    assert "TRANSPOSE" not in counts, counts
    assert counts.get("CONV_2D") == 1 + len(pools), counts


@pytest.mark.parametrize("save, suffix", [(save_h5, ".h5"), (save_keras_v3, ".keras")])
def test_keras_files_reload(tmp_path, save, suffix):
    """Conv, ConvTranspose and pool graphs (tap slices, Indices, divisors) survive a reload."""
    x = rng.randn(2, 4, 9, 11)
    init = {"w1": rng.randn(6, 4, 3, 3), "b1": rng.randn(6), "wd": rng.randn(6, 1, 3, 3),
            "wt": rng.randn(6, 3, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 0, 2, 1], dilations=[1, 2]),
        helper.make_node("Conv", ["c1", "wd"], ["c2"], group=6, strides=[2, 2],
                         dilations=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c2"], ["m", "mi"], kernel_shape=[2, 2], pads=[0, 1, 0, 1],
                         storage_order=1),
        helper.make_node("AveragePool", ["c1"], ["a"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[0, 1, 1, 0], ceil_mode=1),
        helper.make_node("ConvTranspose", ["a", "wt"], ["t"], strides=[2, 2],
                         pads=[1, 0, 0, 1], output_padding=[1, 1]),
        helper.make_node("LpPool", ["t"], ["l"], kernel_shape=[2, 2], dilations=[2, 1]),
        helper.make_node("GlobalLpPool", ["l"], ["g"], p=3),
    ]
    converted = convert(make_model(nodes, {"x": x}, ["m", "mi", "g"], init))
    path = str(tmp_path / f"model{suffix}")
    save(converted.result, path)
    reloaded = tf_keras.models.load_model(path)
    feed = list(to_physical(converted, {"x": x}).values())
    expected = converted.result.model(feed)
    actual = reloaded(feed)
    for name in expected:
        assert_close(actual[name].numpy(), expected[name].numpy(), what=name)
