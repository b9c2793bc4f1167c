"""Resize's sampling math (ops/_resize_math.py) without TensorFlow, against a direct reading of
the ONNX spec: per output element, its coordinate, then the rule or filter of its mode over
edge-padded input. Coordinates are float32 (as onnxruntime computes them, which decides
nearest at ties); weights are float64. One test runs the same math on TF and compares.
"""

import math
import subprocess
import sys
import zlib

import numpy as np
import pytest
from onnx2tf_alt.ops._resize_math import (
    NUMPY,
    Axis,
    Sampling,
    SamplingAttrs,
    kernel_for_any_size,
    onnx_sampling,
    taps,
    tensorflow_ops,
    tf_sampling,
)

F32 = np.float32
COORDS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"]
# (input length, output length, scale): by sizes (scale = out / in) and by scales
# (out = floor(in * scale)); odd lengths, up and down, output length 1.
AXES = [
    (5, 9, None),
    (7, 3, None),
    (5, 1, None),
    (5, None, 1.7),
    (11, None, 0.3),
    (9, None, 0.45),
    (6, None, 2.0),
    (8, None, 0.5),
    (4, None, 3.0),
]
ROIS = [(0.2, 0.9), (-0.1, 1.2)]


def attrs(
    mode, coord="half_pixel", nearest="round_prefer_floor", a=-0.75, exclude=False, antialias=False
):
    return SamplingAttrs(mode, coord, nearest, a, exclude, antialias)


def lengths(n, out, scale):
    """(out, float32 scale) as onnxruntime derives them from sizes or from scales."""
    if scale is None:
        return out, F32(out) / F32(n)
    return int(F32(scale) * F32(n)), F32(scale)


# --- the reference --------------------------------------------------------------------------


def ref_coord(coord, i, n, out, scale, roi):
    """The spec's coordinate transformation, one output index at a time (float32)."""
    i, n_f, out_f, s = F32(i), F32(n), F32(out), F32(scale)
    if coord == "half_pixel":
        return (i + F32(0.5)) / s - F32(0.5)
    if coord == "half_pixel_symmetric":
        adjustment = out_f / (s * n_f)
        offset = n_f / F32(2) * (F32(1) - adjustment)
        return F32(float(offset) + (float(i) + 0.5) / float(s) - 0.5)
    if coord == "pytorch_half_pixel":
        return (i + F32(0.5)) / s - F32(0.5) if out > 1 else F32(0)
    if coord == "align_corners":
        return F32(0) if out == 1 else i * (n_f - F32(1)) / (out_f - F32(1))
    if coord == "asymmetric":
        return i / s
    if coord == "tf_half_pixel_for_nn":
        return (i + F32(0.5)) / s
    start, end = F32(roi[0]), F32(roi[1])
    if out == 1:
        return F32(0.5) * (start + end) * (n_f - F32(1))
    return start * (n_f - 1) + i * (end - start) * (n_f - 1) / (out_f - 1)


def ref_nearest(x, rule, scale):
    frac = x - math.floor(x)
    if rule == "simple":
        return math.ceil(x) if scale < 1 else int(x)
    if rule == "floor" or (rule == "round_prefer_floor" and frac == 0.5):
        return math.floor(x)
    if rule == "ceil" or (rule == "round_prefer_ceil" and frac == 0.5):
        return math.ceil(x)
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def keys(d, a):
    d = abs(d)
    if d < 1:
        return (a + 2) * d**3 - (a + 3) * d**2 + 1
    if d < 2:
        return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
    return 0.0


def ref_filter(at, x, n, scale):
    """{input index: weight} of the linear or cubic filter at x, stretched by 1 / scale when
    antialiasing a downscale; exclude_outside drops (and renormalizes) taps off the axis."""
    if at.mode == "linear" and not at.antialias:
        x = min(max(x, 0.0), n - 1.0)  # onnxruntime clamps the coordinate for linear
    stretch = min(1.0, scale) if at.antialias else 1.0
    support = (1.0 if at.mode == "linear" else 2.0) / stretch
    kernel = (
        (lambda d: max(0.0, 1 - abs(d))) if at.mode == "linear" else (lambda d: keys(d, at.cubic_a))
    )
    taps = {}
    for j in range(math.floor(x - support) - 1, math.ceil(x + support) + 2):
        w = kernel((j - x) * stretch)
        if w == 0 or (at.exclude_outside and not 0 <= j < n):
            continue
        k = min(max(j, 0), n - 1)  # edge padding
        taps[k] = taps.get(k, 0.0) + w
    if at.antialias or at.exclude_outside:
        total = sum(taps.values())
        taps = {k: w / total for k, w in taps.items()}
    return taps


def ref_resize(at, data, out, scale, roi=(0.0, 1.0), extrapolation=-7.0):
    """data (n,) resized to (out,), element by element."""
    n = len(data)
    y = np.zeros(out)
    for i in range(out):
        x = float(ref_coord(at.coord, i, n, out, scale, roi))
        if at.coord == "tf_crop_and_resize" and not 0 <= x <= n - 1:
            y[i] = extrapolation
        elif at.mode == "nearest":
            y[i] = data[min(max(ref_nearest(x, at.nearest, scale), 0), n - 1)]
        else:
            y[i] = sum(w * data[k] for k, w in ref_filter(at, x, n, scale).items())
    return y


def apply(sampling: Sampling, data, extrapolation=-7.0):
    y = (data[sampling.index] * sampling.weight).sum(1)
    return np.where(sampling.outside, extrapolation, y)


def check(at, n, out, scale, roi=(0.0, 1.0)):
    out, scale = lengths(n, out, scale)
    # Data seeded by the case itself, not by a shared generator that pytest-xdist's test
    # order would advance differently from run to run.
    seed = zlib.crc32(repr((at, n, out, scale, roi)).encode())
    data = np.random.default_rng(seed).standard_normal(n)
    got = apply(onnx_sampling(at, n, out, scale, *roi), data)
    # The sampling's weights are float32, as onnxruntime's are; the reference's float64.
    # Each weight is then off by a few float32 ulps of its size, so a sum of up to a dozen
    # taps of unit-normal data by up to ~4e-6 (about 32 ulps at 1.0).
    np.testing.assert_allclose(
        got,
        ref_resize(at, data, out, scale, roi),
        rtol=1e-5,
        atol=32 * np.finfo(np.float32).eps,
        err_msg=f"{at} {n} -> {out}, scale {scale}, roi {roi}",
    )


def cases(coord):
    return [
        (n, out, s, roi)
        for n, out, s in AXES
        for roi in (ROIS if coord == "tf_crop_and_resize" else [(0.0, 1.0)])
    ]


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("coord", COORDS)
def test_nearest(coord):
    for rule in NEAREST:
        for n, out, s, roi in cases(coord):
            check(attrs("nearest", coord, rule), n, out, s, roi)


@pytest.mark.parametrize("coord", COORDS)
def test_linear_and_cubic(coord):
    for at in (
        attrs("linear", coord),
        attrs("cubic", coord),
        attrs("cubic", coord, a=-0.5, exclude=True),
    ):
        for n, out, s, roi in cases(coord):
            check(at, n, out, s, roi)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude", [False, True])
def test_antialias(mode, exclude):
    """Down-scaling widens the filter (more taps than the plain mode); up-scaling keeps it."""
    for coord in ("half_pixel", "asymmetric", "align_corners"):
        at = attrs(mode, coord, exclude=exclude, antialias=True)
        for n, out, s, roi in cases(coord):
            check(at, n, out, s, roi)
    wide = onnx_sampling(attrs(mode, antialias=True), 11, 3, F32(0.3))
    assert wide.index.shape[1] > (2 if mode == "linear" else 4)


def test_nearest_ties():
    """Halving with half_pixel puts every coordinate on a tie (2i + 0.5): the rule decides."""
    n, out, scale = 8, 4, F32(0.5)
    expected = {
        "round_prefer_floor": [0, 2, 4, 6],
        "round_prefer_ceil": [1, 3, 5, 7],
        "floor": [0, 2, 4, 6],
        "ceil": [1, 3, 5, 7],
    }
    for rule, index in expected.items():
        sampling = onnx_sampling(attrs("nearest", nearest=rule), n, out, scale)
        assert sampling.index[:, 0].tolist() == index, rule


def test_extrapolation_marks_outside():
    sampling = onnx_sampling(attrs("linear", "tf_crop_and_resize"), 5, 6, F32(1.2), -0.1, 1.2)
    x = -0.1 * 4 + np.arange(6) * 1.3 * 4 / 5
    assert sampling.outside.tolist() == ((x < 0) | (x > 4)).tolist()
    assert np.all(sampling.weight[sampling.outside] == 0)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_kernel_claims_hold_for_every_size(mode):
    """Where kernel_for_any_size picks a TF kernel, it samples like ONNX for many sizes."""
    claimed = 0
    for coord in COORDS:
        for rule in NEAREST[:4]:
            at = attrs(mode, coord, rule)
            for scale in (2.0, 3.0, 4.0, 1.7):
                kernel = kernel_for_any_size(at, [scale])
                if kernel is None:
                    continue
                claimed += 1
                for n in range(1, 14):
                    out = int(F32(scale) * F32(n))
                    onnx = onnx_sampling(at, n, out, F32(scale))
                    assert onnx.matches(tf_sampling(kernel, n, out)), (at, scale, n)
    assert claimed >= 5


def test_numpy_and_tf_agree():
    """The same taps on TF (run-time path) as on numpy (conversion time): indices exactly,
    weights exactly except where numpy sums in float64 (`wide`: normalized weights and
    half_pixel_symmetric's coordinates), there within float32 rounding."""
    import tensorflow as tf

    tfo = tensorflow_ops()
    configs = [attrs("nearest", c, r) for c in COORDS for r in NEAREST]
    configs += [attrs(m, c) for m in ("linear", "cubic") for c in COORDS]
    configs += [attrs("cubic", c, a=-0.5, exclude=True) for c in COORDS]
    configs += [
        attrs(m, c, exclude=e, antialias=True)
        for m in ("linear", "cubic")
        for c in ("half_pixel", "align_corners")
        for e in (False, True)
    ]
    compared = 0
    for at in configs:
        for n, out, s, roi in cases(at.coord):
            out, scale = lengths(n, out, s)
            length, roi = scale * F32(n), (F32(roi[0]), F32(roi[1]))
            with np.errstate(divide="ignore", invalid="ignore"):  # as in onnx_sampling
                expected = taps(NUMPY, at, Axis(n, out, scale, length, F32(out), roi))
            axis = Axis(
                tf.constant(n),
                tf.constant(out),
                tf.constant(scale),
                tf.constant(length),
                tf.constant(F32(out)),
                tuple(tf.constant(r) for r in roi),
            )
            got = taps(tfo, at, axis)
            what = f"{at} {n} -> {out}"
            np.testing.assert_array_equal(got[0].numpy(), expected[0], err_msg=what)
            for a, b in zip(got[1:], expected[1:]):
                assert (a is None) == (b is None), what
                if b is None:
                    continue
                if at.antialias or at.exclude_outside or at.coord == "half_pixel_symmetric":
                    np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=2e-6, err_msg=what)
                else:
                    np.testing.assert_array_equal(a.numpy(), b, err_msg=what)
            compared += 1
    assert compared > 400


def test_math_module_does_not_import_tensorflow():
    code = "import sys, onnx2tf_alt.ops._resize_math; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
