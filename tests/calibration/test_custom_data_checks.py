"""Calibration and check data (-cind NAME FILE.npy [MEAN STD]) that cannot be used is
refused before any conversion work, with exit 2 and one message naming the input, the file,
what is wrong and the fix: empty or non-numeric arrays, NaN / inf values, a zero or
non-finite STD, values that overflow once normalized, and shapes or dtypes the model's
inputs cannot take (calibration/samples.py, onnx2tf_alt/check/inputs.py)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from calibration.samples import check_against_inputs, parse_custom_data
from onnx2tf_alt.check.inputs import load_custom_inputs, read_custom_array
from onnx2tf_alt.errors import InputError

from cli_runner import leftovers, run_cli, tree
from models import tiny_cnn


def _inputs_model() -> onnx.ModelProto:
    """Only the graph inputs matter here: an image with a symbolic batch, int tokens, a
    scalar, and a weight listed as an input (an initializer, not a model input)."""
    graph = helper.make_graph(
        [], "inputs",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 8, 8]),
         helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, 5]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [], [helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])],
    )
    return helper.make_model(graph)


@pytest.fixture
def save(tmp_path):
    """Writes an array to a new .npy file; returns its path."""
    def save(array) -> str:
        path = str(tmp_path / f"data{len(os.listdir(tmp_path))}.npy")
        np.save(path, array)
        return path
    return save


def _custom(path: str, name: str = "image", *normalization: str):
    return parse_custom_data([[name, path, *normalization]])


def _refused(call, *phrases: str) -> str:
    """The message of the InputError `call()` raises; numpy warns nothing meanwhile."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError) as info:
            call()
    message = str(info.value)
    for phrase in phrases:
        assert phrase in message, message
    return message


def _accepted(call) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call()


# -- the array alone: read_custom_array, through both readers of -cind ---------------------

@pytest.mark.parametrize("shape", [(0, 3, 8, 8), (4, 0)])
def test_an_empty_array_is_refused(save, shape):
    path = save(np.zeros(shape, np.float32))
    for read in (lambda: _custom(path), lambda: load_custom_inputs([["image", path]])):
        _refused(read, f"-cind file '{path}' for input 'image'", "is empty",
                 f"shape {list(shape)}", "at least one sample")


def test_nan_and_inf_are_counted_and_the_first_is_located(save):
    array = np.zeros((4, 3), np.float32)
    array[2, 1], array[3, 0], array[3, 2] = np.inf, np.nan, -np.inf
    path = save(array)
    _refused(lambda: _custom(path), "input 'image'", path,
             "3 non-finite value(s) of 12 (1 NaN, 2 inf)",
             "the first at sample 2 (index [2, 1])", "must be finite")


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_an_array_of_nothing_but_nan_or_inf_is_refused(save, fill):
    path = save(np.full((2, 3, 8, 8), fill, np.float32))
    _refused(lambda: load_custom_inputs([["image", path]]), "384 non-finite value(s) of 384",
             "the first at sample 0")


def test_a_single_value_that_is_not_finite_is_located(save):
    path = save(np.array(np.nan, np.float32))
    _refused(lambda: read_custom_array("scale", path), "its only value")


@pytest.mark.parametrize("array, kind", [
    (np.array(["a", "b"]), "text"),
    (np.array([b"a"]), "bytes"),
    (np.array([1 + 2j]), "complex"),
    (np.array(["2024-01-01"], "datetime64[D]"), "datetime"),
])
def test_arrays_that_are_not_numbers_are_refused(save, array, kind):
    path = save(array)
    _refused(lambda: read_custom_array("image", path), f"holds {kind} values",
             f"dtype {array.dtype}", "save the array as float32")


@pytest.mark.parametrize("array", [np.arange(6).reshape(2, 3), np.ones((2, 3), bool)])
def test_integer_and_bool_arrays_are_read(save, array):
    path = save(array)
    _accepted(lambda: read_custom_array("tokens", path))


# -- MEAN / STD ------------------------------------------------------------------------------

@pytest.mark.parametrize("std, shown", [("0", "0.0"), ("[1,0,1]", "[1.0, 0.0, 1.0]"),
                                        ("1e39", "inf")])
def test_a_zero_or_infinite_std_is_refused(save, std, shown):
    path = save(np.ones((2, 3, 8, 8), np.float32))
    _refused(lambda: _custom(path, "image", "0", std), f"-cind file '{path}' for input 'image'",
             f"STD {shown} must be non-zero and finite", "did you mean 1?")


def test_a_mean_that_is_not_finite_is_refused(save):
    path = save(np.ones((2, 3, 8, 8), np.float32))
    _refused(lambda: _custom(path, "image", "[0,1e39,0]", "1"), "input 'image'",
             "MEAN [0.0, inf, 0.0] is not finite")


def test_usable_mean_and_std_are_kept(save):
    path = save(np.ones((2, 3, 8, 8), np.float32))
    parsed = _custom(path, "image", "[0.485,0.456,0.406]", "0.25")["image"]
    assert parsed.std.tolist() == [0.25] and parsed.mean.size == 3


# -- against the model's inputs: check_against_inputs --------------------------------------

def _check(path, name="image", *normalization, batch_size=None, ois=None):
    custom = _custom(path, name, *normalization)
    return lambda: check_against_inputs(custom, _inputs_model(), batch_size, ois)


@pytest.mark.parametrize("shape", [(5, 3, 8, 8), (5, 1, 3, 8, 8), (5, 2, 3, 8, 8)])
def test_samples_along_axis_0_of_the_input_shape_are_accepted(save, shape):
    _accepted(_check(save(np.ones(shape, np.float32))))


def test_the_wrong_rank_is_refused(save):
    path = save(np.ones((5, 8, 8), np.float32))
    _refused(_check(path), f"-cind file '{path}' for input 'image' has shape [5, 8, 8]",
             "the input has shape ['?', 3, 8, 8]", "give N samples along axis 0")


@pytest.mark.parametrize("shape", [(5, 3, 4, 4), (5, 8, 8, 3)])
def test_samples_of_the_wrong_shape_are_refused(save, shape):
    path = save(np.ones(shape, np.float32))
    _refused(_check(path), "input 'image'", f"samples of shape {list(shape[1:])}",
             "expects [3, 8, 8] after the batch axis", "ONNX layout")


def test_ois_sets_the_shape_the_samples_must_have(save):
    path = save(np.ones((5, 3, 4, 4), np.float32))
    _accepted(_check(path, ois=["image:1,3,4,4"]))
    _refused(_check(save(np.ones((5, 3, 8, 8), np.float32)), ois=["image:1,3,4,4"]),
             "expects [3, 4, 4]")
    # an -ois entry that does not fit the input is left for prepare_model to refuse
    _refused(_check(path, ois=["image:1,3,4"]), "expects [3, 8, 8]")


def test_batch_size_fixes_the_batch_axis_only(save):
    _accepted(_check(save(np.ones((3, 3, 8, 8), np.float32)), batch_size=2))


def test_dtypes_that_cast_are_accepted_the_others_refused(save):
    _accepted(_check(save(np.ones((2, 3, 8, 8), np.int64))))
    _accepted(_check(save(np.ones((2, 3, 8, 8), np.float64))))
    _accepted(_check(save(np.ones((4, 5), np.int32)), "tokens"))
    _refused(_check(save(np.ones((2, 3, 8, 8), bool)), "image"),
             "has dtype bool; the model expects float32: save it as float32")
    _refused(_check(save(np.ones((4, 5), np.float32)), "tokens"),
             "input 'tokens' has dtype float32; the model expects int64")


def test_mean_and_std_must_fit_the_input(save):
    path = save(np.ones((2, 3, 8, 8), np.float32))
    _accepted(_check(path, "image", "[0.485,0.456,0.406]", "[0.229,0.224,0.225]"))
    _refused(_check(path, "image", "[0.5,0.5]", "1"), "input 'image'",
             "MEAN / STD have 2 values", "give one value, or one per channel")
    _refused(_check(save(np.ones((4, 5), np.int64)), "tokens", "0", "1"),
             "MEAN and STD apply to float inputs", "drop them")


@pytest.mark.parametrize("array, normalization, phrase", [
    (np.full((2, 3, 8, 8), 1e30, np.float32), ("0", "1e-30"), "(x - MEAN) / STD in float32"),
    (np.full((2, 3, 8, 8), 1e300), (), "the values in float32"),
])
def test_values_that_overflow_the_input_dtype_are_refused(save, array, normalization, phrase):
    path = save(array)
    _refused(_check(path, "image", *normalization), f"-cind file '{path}' for input 'image'",
             phrase, "384 non-finite value(s) of 384 (0 NaN, 384 inf)", "overflow")


def test_a_scalar_input_takes_one_value_or_a_row_of_them(save):
    _accepted(_check(save(np.array(0.5, np.float32)), "scale"))
    _accepted(_check(save(np.array([0.5, 2.0], np.float32)), "scale"))


def test_names_that_are_not_model_inputs_are_left_to_the_later_checks(save):
    _accepted(_check(save(np.ones((2, 2), np.float32)), "w"))
    _accepted(_check(save(np.ones((2, 2), np.float32)), "inner_tensor"))


# -- the command line: refused before converting, nothing written or left behind ----------

GOOD = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
CASES = {
    "all inf": (np.full_like(GOOD, np.inf), (), "3072 non-finite value(s)"),
    "all NaN": (np.full_like(GOOD, np.nan), (), "3072 non-finite value(s)"),
    "empty": (GOOD[:0], (), "is empty"),
    "STD 0 typo": (GOOD, ("0", "0"), "STD 0.0 must be non-zero"),
    "wrong shape": (GOOD[:, :, :8], (), "samples of shape [3, 8, 16]"),
    "wrong rank": (GOOD[:, 0], (), "has shape [4, 16, 16]"),
    "text": (np.array(["a", "b"]), (), "holds text values"),
}


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "cnn.onnx"
    path.write_bytes(tiny_cnn()[0].SerializeToString())
    return str(path)


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_refuses_bad_calibration_data_before_converting(tmp_path, cnn_file, case):
    array, normalization, phrase = CASES[case]
    data = tmp_path / "data.npy"
    np.save(data, array)
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    (out / "notes.txt").write_text("mine")
    before = tree(out)
    code, output = run_cli("-i", cnn_file, "-o", out, "-oiqt", "-cind", "input", data,
                           *normalization, cwd=tmp_path, tmpdir=tmp, timeout=120)
    assert code == 2, output
    first = output.strip().splitlines()[0]
    assert first.startswith("error: -cind file ") and "for input 'input'" in first, output
    assert phrase in first, output
    assert "Traceback" not in output and "RuntimeWarning" not in output, output
    assert tree(out) == before
    assert leftovers(tmp_path, out, tmp) == [] and os.listdir(tmp) == []


@pytest.mark.parametrize(("shape", "axis"), [
    ((1, None, None, 3), 3),  # tf2onnx's Keras image of run-time size
    ((None, 3, None, None), 1),
    ((1, 224, 224, 1), 3),
    ((1, 16, 100, 8), None),  # 8 channels: not an image
    ((1, 3, 224), None),
])
def test_an_image_of_run_time_size_calibrates_on_the_photographs(shape, axis):
    """image_channel_axis: an NHWC image of run-time height took -cind before ("is not an
    image"); now the shipped photographs, at DEFAULT_IMAGE_SIZE."""
    from calibration.samples import DEFAULT_IMAGE_SIZE, _image_units, image_channel_axis

    assert image_channel_axis(shape, np.float32) == axis
    if axis is not None:
        calibration, held = _image_units(shape, axis, None, None)
        size = [DEFAULT_IMAGE_SIZE if d is None else d for d in shape]
        assert calibration.shape[1:] == tuple(size[1:]) and len(held), calibration.shape
