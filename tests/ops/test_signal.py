"""DFT, STFT, the windows and MelWeightMatrix against onnxruntime, through TF and the float32
TFLite (which must hold builtins only).

Each test puts one node per attribute combination into one model (one conversion), with
outputs named after the case, so a failure names its combination.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from harness import (
    Rng,
    assert_builtin,
    assert_keras_reloads,
    check_model,
    check_nodes,
    convert,
    count_tflite_ops,
    make_model,
)

rng = Rng(0)
F32 = np.float32


def i64(value):
    return np.array(value, np.int64)


# --- DFT ---------------------------------------------------------------------------------------
DFT_CASES = [  # name, input, attrs, dft_length
    ("fwd_ax1", "xr", {"axis": 1}, None),
    ("fwd_ax2", "xc", {"axis": 2}, None),
    ("inv_ax1", "xc", {"axis": 1, "inverse": 1}, None),
    ("inv_real_ax2", "xr", {"axis": 2, "inverse": 1}, None),
    ("onesided_ax2", "xr", {"axis": 2, "onesided": 1}, None),
    ("onesided_ax1_pad", "xr", {"axis": 1, "onesided": 1}, 8),
    ("fwd_ax2_truncate", "xc", {"axis": 2}, 4),
    ("inv_ax1_pad", "xc", {"axis": 1, "inverse": 1}, 7),
    ("fwd_neg", "xr", {"axis": -2}, None),
    ("irfft_ax2", "xc", {"axis": 2, "inverse": 1, "onesided": 1}, None),
    ("irfft_ax1_odd", "xc", {"axis": 1, "inverse": 1, "onesided": 1}, 9),
]


def test_dft_17():
    """Axis attribute on the first and last signal axes, real and complex input, forward,
    inverse, onesided, padded and truncated lengths, inverse real FFT; batch 2."""
    inputs = {"xr": rng.randn(2, 5, 6, 1), "xc": rng.randn(2, 5, 6, 2)}
    nodes, inits = [], {}
    for name, src, attrs, length in DFT_CASES:
        names = [src]
        if length is not None:
            inits[f"len_{name}"] = i64(length)
            names.append(f"len_{name}")
        nodes.append(helper.make_node("DFT", names, [name], **attrs))
    _, counts = check_nodes(nodes, inputs, inits, opset=17)
    assert_builtin(counts)


def test_dft_20():
    """The axis as input 2 (default -2, negative, positive), with and without dft_length."""
    inputs = {"xr": rng.randn(2, 3, 7, 1), "xc": rng.randn(2, 4, 5, 2)}
    cases = [
        ("default", "xc", {}, None, None),
        ("axis1", "xr", {}, None, 1),
        ("axis_neg3_len", "xc", {"inverse": 1}, 6, -3),
        ("onesided_len", "xr", {"onesided": 1}, 10, -2),
        ("irfft", "xc", {"onesided": 1, "inverse": 1}, None, 2),
    ]
    nodes, inits = [], {}
    for name, src, attrs, length, axis in cases:
        names = [src, "", ""]
        if length is not None:
            inits[f"len_{name}"], names[1] = i64(length), f"len_{name}"
        if axis is not None:
            inits[f"axis_{name}"], names[2] = i64(axis), f"axis_{name}"
        while not names[-1]:
            names.pop()
        nodes.append(helper.make_node("DFT", names, [name], **attrs))
    _, counts = check_nodes(nodes, inputs, inits, opset=20)
    assert_builtin(counts)
    assert "FULLY_CONNECTED" in counts or "BATCH_MATMUL" in counts


# --- STFT --------------------------------------------------------------------------------------
def test_stft():
    """Constant (computed) window, run-time window, no window with frame_length, a complex
    signal two-sided, odd lengths and steps; batch 2."""
    inputs = {"sig": rng.randn(2, 37, 1), "sigc": rng.randn(2, 30, 2), "win": rng.randn(8)}
    inits = {"step3": i64(3), "step5": i64(5), "len9": i64(9), "len8": i64(8), "len7": i64(7)}
    nodes = [
        helper.make_node("HannWindow", ["len9"], ["hann"]),
        helper.make_node("STFT", ["sig", "step3", "hann"], ["const_window"]),
        helper.make_node("STFT", ["sig", "step5", "win"], ["runtime_window"], onesided=0),
        helper.make_node("STFT", ["sig", "step3", "", "len7"], ["no_window"]),
        helper.make_node("STFT", ["sigc", "step5", "", "len8"], ["complex"], onesided=0),
        helper.make_node("STFT", ["sigc", "step3", "win", "len8"], ["complex_window"],
                         onesided=0),
    ]
    outputs = ["const_window", "runtime_window", "no_window", "complex", "complex_window"]
    _, counts = check_nodes(nodes, inputs, inits, opset=17, outputs=outputs)
    assert_builtin(counts)


# --- windows -----------------------------------------------------------------------------------
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(periodic):
    """Constant sizes (folded at conversion time, added to an input so the model has one;
    output_datatype double, then cast back) and a run-time size."""
    inputs = {"x": rng.randn(2, 11), "size": i64(6)}
    nodes, outputs = [], []
    for op in ["HannWindow", "HammingWindow", "BlackmanWindow"]:
        nodes += [
            helper.make_node(op, ["eleven"], [f"{op}_const"], periodic=periodic),
            helper.make_node("Add", ["x", f"{op}_const"], [f"{op}_plus_x"]),
            helper.make_node(op, ["size"], [f"{op}_runtime"], periodic=periodic),
            helper.make_node(op, ["eleven"], [f"{op}_double"], periodic=periodic,
                             output_datatype=TensorProto.DOUBLE),
            helper.make_node("Cast", [f"{op}_double"], [f"{op}_cast"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", f"{op}_cast"], [f"{op}_times_x"]),
        ]
        outputs += [f"{op}_plus_x", f"{op}_runtime", f"{op}_times_x"]
    _, counts = check_nodes(nodes, inputs, {"eleven": i64(11)}, opset=17, outputs=outputs)
    assert_builtin(counts)


# --- MelWeightMatrix ---------------------------------------------------------------------------
def test_mel_weight_matrix():
    """Several filter banks (narrow bins where filters collapse to one bin), applied to a
    spectrogram with MatMul; double output as well."""
    cases = [(8, 64, 16000, 100.0, 6000.0), (20, 256, 22050, 0.0, 11025.0),
             (12, 31, 8000, 300.0, 3500.0), (5, 16, 16000, 20.0, 8000.0)]
    inputs, nodes, inits, outputs = {}, [], {}, []
    for k, (bins, length, rate, low, high) in enumerate(cases):
        names = [f"m{k}_{p}" for p in "nlrab"]
        for name, value in zip(names, [i64(bins), i64(length), i64(rate), np.array(low, F32),
                                       np.array(high, F32)]):
            inits[name] = value
        inputs[f"spec{k}"] = rng.randn(2, 3, length // 2 + 1)
        dtype = {"output_datatype": TensorProto.DOUBLE} if k == 3 else {}
        nodes.append(helper.make_node("MelWeightMatrix", names, [f"mel{k}"], **dtype))
        if k == 3:
            nodes.append(helper.make_node("Cast", [f"mel{k}"], [f"mel{k}f"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("MatMul", [f"spec{k}", f"mel{k}f" if k == 3 else f"mel{k}"],
                                      [f"out{k}"]))
        outputs.append(f"out{k}")
    _, counts = check_nodes(nodes, inputs, inits, opset=17, outputs=outputs)
    assert_builtin(counts)


# --- run-time parameters -----------------------------------------------------------------------
def test_dft_runtime_axis():
    """The axis fed at run time: the DFT on every axis that fits, selected at run time (two
    axes of equal size, a negative axis), and onesided, where the declared output shape
    leaves one axis."""
    inputs = {"xr": rng.randn(2, 6, 6, 1), "xc": rng.randn(3, 4, 4, 2), "a1": i64(1), "a2": i64(2),
              "aneg": i64(-2), "aneg3": i64(-3)}
    cases = [("r_a1", "xr", "a1", {}), ("r_a2", "xr", "a2", {}), ("c_neg", "xc", "aneg", {}),
             ("c_inv", "xc", "aneg3", {"inverse": 1}), ("r_onesided", "xr", "a2", {"onesided": 1})]
    nodes = [helper.make_node("DFT", [src, "", axis], [name], **attrs)
             for name, src, axis, attrs in cases]
    model = make_model(nodes, inputs, [name for name, *_ in cases], opset=20)
    declared = model.graph.output[-1].type.tensor_type.shape
    for dim, size in zip(declared.dim, [2, 6, 4, 2]):
        dim.dim_value = size
    converted = check_model(model, inputs)
    assert_builtin(count_tflite_ops(converted.tflite))


def test_stft_runtime_parameters():
    """frame_step, frame_length and window fed at run time (real and complex signals), and a
    signal of symbolic length."""
    feeds = {"sig": rng.randn(2, 37, 1), "sigc": rng.randn(2, 30, 2), "win": rng.randn(8),
             "step3": i64(3), "step5": i64(5), "len7": i64(7), "len8": i64(8)}
    nodes = [
        helper.make_node("STFT", ["sig", "step3", "", "len7"], ["runtime_len"]),
        helper.make_node("STFT", ["sig", "step5", "win"], ["runtime_window"], onesided=0),
        helper.make_node("STFT", ["sigc", "step3", "", "len8"], ["complex"], onesided=0),
        helper.make_node("STFT", ["sigc", "step5", "win", "len8"], ["complex_window"],
                         onesided=0),
        helper.make_node("STFT", ["sig", "step3", "", "len8"], ["even_len"]),
    ]
    outputs = ["runtime_len", "runtime_window", "complex", "complex_window", "even_len"]
    model = make_model(nodes, feeds, outputs, opset=17, input_shapes={"sig": [2, "T", 1]})
    converted = check_model(model, feeds)
    assert_builtin(count_tflite_ops(converted.tflite))


def test_mel_weight_matrix_runtime_inputs():
    """All five inputs fed at run time (float32 filter edges), the bank applied with MatMul."""
    cases = [(8, 64, 16000, 100.0, 6000.0), (20, 256, 22050, 0.0, 11025.0),
             (12, 31, 8000, 300.0, 3500.0)]
    feeds, nodes, outputs = {}, [], []
    for k, (bins, length, rate, low, high) in enumerate(cases):
        names = [f"m{k}_{p}" for p in "nlrab"]
        feeds.update(zip(names, [i64(bins), i64(length), i64(rate), np.array(low, F32),
                                 np.array(high, F32)]))
        feeds[f"spec{k}"] = rng.randn(2, 3, length // 2 + 1)
        nodes += [helper.make_node("MelWeightMatrix", names, [f"mel{k}"]),
                  helper.make_node("MatMul", [f"spec{k}", f"mel{k}"], [f"out{k}"])]
        outputs += [f"mel{k}", f"out{k}"]
    _, counts = check_nodes(nodes, feeds, opset=17, outputs=outputs)
    assert_builtin(counts)


def test_dynamic_batch():
    """DFT (both matmul forms) and STFT with a symbolic batch size."""
    feeds = {"xc": rng.randn(2, 5, 6, 2), "sig": rng.randn(2, 29, 1)}
    nodes = [
        helper.make_node("DFT", ["xc"], ["dft_axis1"], axis=1),
        helper.make_node("DFT", ["xc"], ["dft_axis2"], axis=2, inverse=1),
        helper.make_node("STFT", ["sig", "step", "", "len"], ["spec"]),
    ]
    shapes = {"xc": ["N", 5, 6, 2], "sig": ["N", 29, 1]}
    model = make_model(nodes, feeds, ["dft_axis1", "dft_axis2", "spec"],
                       {"step": i64(4), "len": i64(10)}, opset=17, input_shapes=shapes)
    converted = check_model(model, feeds)
    assert_builtin(count_tflite_ops(converted.tflite))


def test_keras_files_reload(tmp_path):
    """DFT (both matmul forms), STFT, a run-time window and MelWeightMatrix survive a .h5
    and a .keras reload."""
    feeds = {"xc": rng.randn(2, 5, 6, 2), "sig": rng.randn(2, 40, 1), "size": i64(7)}
    inits = {"step": i64(4), "len": i64(16), "n": i64(6), "dl": i64(16), "rate": i64(8000),
             "lo": np.array(50, F32), "hi": np.array(3000, F32), "axis3": i64([3])}
    nodes = [
        helper.make_node("DFT", ["xc"], ["dft_axis1"], axis=1),
        helper.make_node("DFT", ["xc"], ["dft_axis2"], axis=2, inverse=1),
        helper.make_node("HannWindow", ["len"], ["hann"]),
        helper.make_node("STFT", ["sig", "step", "hann"], ["spec"]),
        helper.make_node("HammingWindow", ["size"], ["hamming"]),
        helper.make_node("MelWeightMatrix", ["n", "dl", "rate", "lo", "hi"], ["mel"]),
        helper.make_node("ReduceSum", ["spec", "axis3"], ["power"], keepdims=0),
        helper.make_node("MatMul", ["power", "mel"], ["mel_spec"]),
    ]
    outputs = ["dft_axis1", "dft_axis2", "hamming", "mel_spec"]
    converted = convert(make_model(nodes, feeds, outputs, inits, opset=17))
    assert_keras_reloads(converted, feeds, tmp_path)
