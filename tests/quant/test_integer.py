"""The own quantizer (onnx2tf_alt/quant/integer.py) on small models written by the direct
writer and calibrated in the interpreter, as `-dms -oiqt` makes them: each file against the
float32 one on inputs the calibration never saw, and against TF's MLIR quantizer (the
oracle) on the same calibrated file; then the grid rules one by one."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from calibration.ranges import measured_ranges, with_ranges
from onnx2tf_alt.pipeline import float32_planned, plan_loaded
from onnx2tf_alt.quant.integer import quantize
from onnx2tf_alt.quant.measure import cosine
from onnx2tf_alt.tflite.direct import write_direct
from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model
from onnx2tf_alt.tflite.run import as_input, dequantized, run_signature
from tests.harness import make_model, node

INT8, INT16, INT32, INT64, UINT8, FLOAT32 = 9, 7, 2, 4, 3, 0


def weights(*shape: int, scale: float = 0.3) -> np.ndarray:
    """Weights drawn from the shape alone: each model is the same in every test run."""
    rng = np.random.default_rng(abs(hash(shape)) % 2**32)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def cnn_model():
    """Conv + ReLU, max pool, depthwise conv clipped to [0, 6], a 1x1 conv, a residual add,
    a hard sigmoid, a sigmoid and a concatenation, nearest resize, a transposed conv, global
    average pool and a classifier with softmax: batch 2, odd sizes."""
    nodes = [
        node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], "r1"),
        node("MaxPool", ["r1"], "p1", kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["p1", "wd", "bd"], "d1", pads=[1, 1, 1, 1], group=8),
        node("Clip", ["d1", "lo", "hi"], "d2"),
        node("Conv", ["d2", "w2", "b2"], "c2"),
        node("Add", ["c2", "p1"], "a1"),
        node("HardSigmoid", ["a1"], "h1"),
        node("Mul", ["a1", "h1"], "hs"),
        node("Sigmoid", ["c2"], "s1"),
        node("Concat", ["hs", "s1"], "cat", axis=1),
        node("Resize", ["cat", "", "scales"], "up", mode="nearest"),
        node("ConvTranspose", ["up", "wt", "bt"], "ct", strides=[2, 3]),  # unequal strides:
        # one TRANSPOSE_CONV (equal ones are convolutions of its phases: deconv_phases.py)
        node("GlobalAveragePool", ["ct"], "gap"),
        node("Flatten", ["gap"], "flat"),
        node("Gemm", ["flat", "wf", "bf"], "logits", transB=1),
        node("Softmax", ["logits"], "y"),
    ]
    init = {"w1": weights(8, 3, 3, 3), "b1": weights(8), "wd": weights(8, 1, 3, 3),
            "bd": weights(8), "lo": np.float32(0), "hi": np.float32(6),
            "w2": weights(8, 8, 1, 1), "b2": weights(8),
            "scales": np.array([1, 1, 2, 2], np.float32), "wt": weights(16, 6, 2, 2),
            "bt": weights(6), "wf": weights(10, 6), "bf": weights(10)}
    x = np.zeros((2, 3, 13, 11), np.float32)
    return make_model(nodes, {"x": x}, ["y"], init), "x", (2, 3, 13, 11)


def attention_model():
    """Linear layers on 3-D activations, a layer norm written out, an attention product of
    two activations with softmax, tanh and a transpose / reshape back."""
    nodes = [
        node("MatMul", ["x", "wq"], "q0"), node("Add", ["q0", "bq"], "q"),
        node("MatMul", ["x", "wk"], "k"),
        node("Transpose", ["k"], "kt", perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], "s0"), node("Mul", ["s0", "scale"], "s"),
        node("Softmax", ["s"], "p", axis=-1),
        node("MatMul", ["p", "x"], "o"),
        node("ReduceMean", ["o"], "mu", axes=[-1]),
        node("Sub", ["o", "mu"], "dev"), node("Mul", ["dev", "dev"], "sq"),
        node("ReduceMean", ["sq"], "var", axes=[-1]),
        node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "sd"),
        node("Div", ["dev", "sd"], "n"), node("Tanh", ["n"], "t"),
        node("Reshape", ["t", "shape"], "y"),
    ]
    init = {"wq": weights(12, 12), "bq": weights(12), "wk": weights(12, 12),
            "scale": np.float32(0.3), "eps": np.float32(1e-5),
            "shape": np.array([2, -1], np.int64)}
    x = np.zeros((2, 5, 12), np.float32)
    return make_model(nodes, {"x": x}, ["y"], init, opset=13), "x", (2, 5, 12)


def wide_concat_model():
    """A sigmoid (fixed [0, 1) grid) concatenated with a value 40 times wider: the
    sigmoid's codes are moved onto the concatenation's grid, nothing clipped."""
    nodes = [node("Sigmoid", ["x"], "s"), node("Mul", ["x", "k"], "w"),
             node("Concat", ["s", "w"], "y", axis=1)]
    x = np.zeros((2, 4, 6, 6), np.float32)
    return make_model(nodes, {"x": x}, ["y"], {"k": np.float32(40)}), "x", (2, 4, 6, 6)


def hard_swish_model():
    """MobileNetV3's activation between two convolutions."""
    nodes = [node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1, 1, 1]),
             node("HardSwish", ["c1"], "h"), node("Conv", ["h", "w2", "b2"], "y")]
    init = {"w1": weights(8, 3, 3, 3), "b1": weights(8), "w2": weights(4, 8, 1, 1),
            "b2": weights(4)}
    x = np.zeros((2, 3, 9, 7), np.float32)
    return make_model(nodes, {"x": x}, ["y"], init, opset=14), "x", (2, 3, 9, 7)


MODELS = {"cnn": cnn_model, "attention": attention_model, "wide_concat": wide_concat_model}


class Calibrated:
    """A model's direct float32 file, calibrated on 8 inputs, and 4 others to judge on."""

    def __init__(self, make):
        self.key = make.__name__
        model, self.name, shape = make()
        planned = float32_planned(plan_loaded(model))
        self.result = write_direct(planned.graph, planned.plan, planned.options)
        rng = np.random.default_rng(1)
        self.calibration = [self.physical(rng.standard_normal(shape)) for _ in range(8)]
        # held out: another draw, scaled (inputs the calibration never saw)
        self.held_out = [self.physical(0.8 * rng.standard_normal(shape)) for _ in range(4)]
        self.content = with_ranges(self.result.content,
                                   measured_ranges(self.result.content, self.calibration)[
                                       "minmax"])[0]

    def physical(self, x: np.ndarray) -> dict[str, np.ndarray]:
        return self.result.to_physical({self.name: x.astype(np.float32)})

    def run(self, content: bytes) -> np.ndarray:
        interpreter = Interpreter(model_content=content)
        details = interpreter.get_signature_runner("serving_default").get_input_details()
        outs = []
        for feeds in self.held_out:
            out = run_signature(interpreter, {k: as_input(v, details[k])
                                              for k, v in feeds.items()})
            (key, value), = out.items()
            outs.append(dequantized(value, interpreter.get_signature_runner(
                "serving_default").get_output_details()[key]))
        return np.stack(outs).astype(np.float64)


@pytest.fixture(scope="module", params=sorted(MODELS))
def calibrated(request):
    return Calibrated(MODELS[request.param])


def census(content: bytes) -> dict[str, int]:
    model = unpack_model(content)
    graph = model.subgraphs[0]
    found: dict[str, int] = {}
    for op in graph.operators:
        types = ",".join(str(graph.tensors[i].type) for i in op.outputs)
        key = f"{op_name(model, op)}:{types}"
        found[key] = found.get(key, 0) + 1
    return found


def test_int8_file_follows_the_float_file_and_tfs_quantizer(calibrated):
    """Every op of these models has an int8 kernel: the file holds no float op, follows
    the float32 file on unseen inputs, and matches TF's MLIR quantizer's file of the same
    calibration op for op (one more where a divisor is kept off its zero point) and within
    a few steps of the output grid."""
    from onnx2tf_alt.quant.sensitivity import tf_quantize_calibrated

    own = quantize(calibrated.content)
    oracle = tf_quantize_calibrated(calibrated.content, False, None, [])
    reference, mine, theirs = map(calibrated.run, (calibrated.content, own, oracle))
    assert cosine(reference, mine) >= 0.99, cosine(reference, mine)
    assert cosine(mine, theirs) >= 0.995, cosine(mine, theirs)
    ours = census(own)
    floats = {k: n for k, n in ours.items() if k.endswith(f":{FLOAT32}")
              and not k.startswith("DEQUANTIZE")}
    assert not floats, floats
    mine_ops, their_ops = ({k for k in c if not k.startswith(("QUANTIZE", "DEQUANTIZE"))}
                           for c in (ours, census(oracle)))
    # and a MAXIMUM keeping a computed divisor off its zero point (a layer norm's root);
    # without the MINIMUM a grid already clamps to (a ReLU6 as MINIMUM(x, 6))
    guards, elided = mine_ops - their_ops, their_ops - mine_ops
    assert guards <= {f"MAXIMUM:{INT8}"} and elided <= {f"MINIMUM:{INT8}"}, (mine_ops, their_ops)
    assert bool(guards) == (f"DIV:{INT8}" in mine_ops)


def test_int16_activation_file(calibrated):
    """16-bit activations (symmetric), int8 weights, int64 biases: within 1e-4 of the
    float file's direction on unseen inputs."""
    own = quantize(calibrated.content, activations="int16")
    reference, mine = calibrated.run(calibrated.content), calibrated.run(own)
    assert cosine(reference, mine) >= 0.9999, cosine(reference, mine)
    model = unpack_model(own)
    graph = model.subgraphs[0]
    for op in graph.operators:
        name = op_name(model, op)
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            data, kernel = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
            assert (data.type, kernel.type) == (INT16, INT8), name
            assert len(op.inputs) < 3 or op.inputs[2] < 0 or graph.tensors[
                op.inputs[2]].type == INT64
        for i in op.outputs:
            q = graph.tensors[i].quantization
            if graph.tensors[i].type == INT16:
                assert list(q.zeroPoint) == [0], name


@pytest.fixture(scope="module")
def cnn():
    return Calibrated(cnn_model)


def _ops(content: bytes) -> list[tuple]:
    """(builtin, [(type, scales, zero points) of inputs], [... of outputs]) per op."""
    model = unpack_model(content)
    graph = model.subgraphs[0]

    def params(i):
        if i < 0:
            return None
        t = graph.tensors[i]
        q = t.quantization
        if q is None or q.scale is None:
            return t.type, None, None
        return t.type, np.asarray(q.scale), np.asarray(q.zeroPoint)

    return [(op_name(model, op), [params(i) for i in op.inputs],
             [params(i) for i in op.outputs]) for op in graph.operators]


def test_kernels_biases_and_fixed_grids(cnn):
    """Kernels are symmetric int8 per output channel within [-127, 127], biases int32 on
    input scale x kernel scale, a sigmoid's output on 1/256 from -128, a softmax's too;
    a max pool, resize and reshape keep their input's grid."""
    ops = _ops(quantize(cnn.content))
    model = unpack_model(quantize(cnn.content))
    graph = model.subgraphs[0]
    seen = set()
    for (name, inputs, outputs), op in zip(ops, graph.operators):
        seen.add(name)
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"):
            data = 2 if name == "TRANSPOSE_CONV" else 0
            k, b = (1, 3) if name == "TRANSPOSE_CONV" else (1, 2)
            kernel = graph.tensors[op.inputs[k]]
            codes = np.frombuffer(bytes(model.buffers[kernel.buffer].data), np.int8)
            assert codes.min() >= -127 and inputs[k][0] == INT8, name
            assert not inputs[k][2].any(), name  # zero points 0
            channels = kernel.shape[3 if name == "DEPTHWISE_CONV_2D" else 0]
            assert len(inputs[k][1]) == channels, name
            assert inputs[b][0] == INT32, name
            np.testing.assert_allclose(inputs[b][1], inputs[data][1][0] * inputs[k][1],
                                       rtol=1e-6)
        if name in ("LOGISTIC", "SOFTMAX"):
            assert (float(outputs[0][1][0]), int(outputs[0][2][0])) == (1 / 256, -128), name
        if name in ("MAX_POOL_2D", "RESIZE_NEAREST_NEIGHBOR", "RESHAPE", "CONCATENATION"):
            assert outputs[0][1][0] == inputs[0][1][0], name
            assert outputs[0][2][0] == inputs[0][2][0], name
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "LOGISTIC",
            "SOFTMAX", "MAX_POOL_2D", "CONCATENATION"} <= seen, seen


def test_a_clipping_minimum_takes_its_outputs_range_and_is_left_out(cnn):
    """A ReLU6 written as MINIMUM(x, 6) after a ReLU-fused conv: the conv's output needs
    codes only up to 6, so it is on the MINIMUM's grid, not on its own wider range; that
    grid ends at 6, where the conv saturates its codes, so the MINIMUM is the identity and
    is left out (XNNPACK has no int8 MINIMUM: each one split the delegated graph)."""
    assert "MINIMUM" in [name for name, _, _ in _ops(cnn.content)]  # the float file's
    ops = _ops(quantize(cnn.content))
    assert "MINIMUM" not in [name for name, _, _ in ops]
    ends = [outputs[0][1][0] * (127 - outputs[0][2][0]) for name, _, outputs in ops
            if name in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    assert any(5.95 <= end <= 6.05 for end in ends), ends
    reference, mine = cnn.run(cnn.content), cnn.run(quantize(cnn.content))
    assert cosine(reference, mine) >= 0.99


def test_fixed_grid_moved_not_clipped_into_a_wider_concatenation():
    """The sigmoid keeps its fixed grid, and a QUANTIZE from int8 to int8 moves it onto the
    concatenation's (40x wider): the file follows the float one."""
    calibrated = Calibrated(wide_concat_model)
    content = quantize(calibrated.content)
    ops = _ops(content)
    requantized = [op for op in ops if op[0] == "QUANTIZE" and op[1][0][0] == INT8]
    assert len(requantized) == 1, [op[0] for op in ops]
    assert cosine(calibrated.run(calibrated.content), calibrated.run(content)) >= 0.999


def test_float_tensors_stay_float(cnn):
    """An op named in `float_tensors` keeps float: it reads a DEQUANTIZE, and the integer
    op after it a QUANTIZE of its output; the file still follows the float one."""
    float_model = unpack_model(cnn.content)
    graph = float_model.subgraphs[0]
    (sigmoid,) = [op for op in graph.operators if op_name(float_model, op) == "LOGISTIC"]
    name = graph.tensors[sigmoid.outputs[0]].name.decode()
    content = quantize(cnn.content, float_tensors=[name])
    model = unpack_model(content)
    graph = model.subgraphs[0]
    writer = {o: op_name(model, op) for op in graph.operators for o in op.outputs}
    readers = {i: op_name(model, op) for op in graph.operators for i in op.inputs}
    (op,) = [op for op in graph.operators if op_name(model, op) == "LOGISTIC"]
    assert graph.tensors[op.inputs[0]].type == FLOAT32 == graph.tensors[op.outputs[0]].type
    assert writer[op.inputs[0]] == "DEQUANTIZE" and readers[op.outputs[0]] == "QUANTIZE"
    assert cosine(cnn.run(cnn.content), cnn.run(content)) >= 0.99


@pytest.mark.parametrize("io", [("int8", "int8"), ("uint8", "float32"), ("uint8", "uint8")])
def test_integer_io(cnn, io):
    """Integer-only files: the signature's input and output on the integer grid (uint8
    codes 128 above int8's), no float tensor left, the same values."""
    content = quantize(cnn.content, io_dtypes=io)
    interpreter = Interpreter(model_content=content)
    runner = interpreter.get_signature_runner("serving_default")
    (entry,), (out,) = runner.get_input_details().values(), runner.get_output_details().values()
    assert (np.dtype(entry["dtype"]).name, np.dtype(out["dtype"]).name) == io
    types = {t.type for t in unpack_model(content).subgraphs[0].tensors}
    assert (FLOAT32 in types) == ("float32" in io), types
    assert cosine(cnn.run(quantize(cnn.content)), cnn.run(content)) >= 0.9999


def test_per_tensor_kernels(cnn):
    """`per_tensor`: one scale per kernel and per bias."""
    for name, inputs, _ in _ops(quantize(cnn.content, per_tensor=True)):
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            assert len(inputs[1][1]) == 1 and len(inputs[2][1]) == 1, name


def test_ranges_on_the_direct_file_need_no_tensorflow():
    """Calibration and quantization of a direct file in a fresh process: no TF module."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from tests.quant.test_integer import Calibrated, cnn_model\n"
        "from onnx2tf_alt.quant.integer import quantize\n"
        "quantize(Calibrated(cnn_model).content)\n"
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def log_spectrum_model():
    """A conv, its power (x * x summed over channels), a root, an epsilon and a LOG: the
    values before the LOG span many decades."""
    nodes = [
        node("Conv", ["x", "w", "b"], "c"),
        node("Mul", ["c", "c"], "p"),
        node("ReduceSum", ["p", "axes"], "s", keepdims=1),
        node("Sqrt", ["s"], "m"),
        node("Add", ["m", "eps"], "e"),
        node("Log", ["e"], "y"),
    ]
    init = {"w": weights(6, 2, 1, 1), "b": np.zeros(6, np.float32),
            "axes": np.array([1], np.int64), "eps": np.float32(1e-10)}
    x = np.zeros((1, 2, 9, 9), np.float32)
    return make_model(nodes, {"x": x}, ["y"], init), "x", (1, 2, 9, 9)


def test_the_arithmetic_before_a_log_stays_float():
    """The power spectrum feeding a LOG stays float in both files (its quiet values would
    all be one code on a fixed-point grid); the conv before it is quantized."""
    calibrated = Calibrated(log_spectrum_model)
    for activations, code in (("int8", INT8), ("int16", INT16)):
        content = quantize(calibrated.content, activations=activations)
        types = {name: outputs[0][0] for name, _, outputs in _ops(content)
                 if name not in ("QUANTIZE", "DEQUANTIZE")}
        assert types["CONV_2D"] == code, (activations, types)
        assert {types[k] for k in ("MUL", "SUM", "SQRT", "ADD", "LOG")} == {FLOAT32}, types


def classifier_model(classes: int, spread: float):
    """A linear classifier over `classes` with a softmax, its logits about `spread` wide."""
    nodes = [node("MatMul", ["x", "w"], "z"), node("Softmax", ["z"], "y", axis=-1)]
    w = weights(16, classes, scale=spread / 8)

    def make():
        x = np.zeros((2, 3, 16), np.float32)
        return make_model(nodes, {"x": x}, ["y"], {"w": w}, opset=13), "x", (2, 3, 16)

    make.__name__ = f"classifier_{classes}_{spread}"
    return make


@pytest.mark.parametrize("classes, spread, wide", [(1000, 40.0, True), (1000, 12.0, True),
                                                   (7, 40.0, False), (1000, 1.0, False)])
def test_a_wide_softmax_stays_float_in_int16_files_and_sums_to_one(classes, spread, wide):
    """TFLite's int16 SOFTMAX counts every class more than 10 below the largest logit as
    e^-10: over 1,000 classes that is up to 0.045 more in the sum, every probability scaled
    down by it. Such a softmax stays float in the INT16 files (a note says so) and its
    probabilities sum to 1 as the float file's do; a narrow one (few classes, or logits
    within 10 of each other) keeps its int16 kernel, as the INT8 files keep theirs."""
    calibrated = Calibrated(classifier_model(classes, spread))
    reference = calibrated.run(calibrated.result.content)
    notes: list[str] = []
    content = quantize(calibrated.content, activations="int16", notes=notes)
    (softmax,) = [outputs[0][0] for name, _, outputs in _ops(content) if name == "SOFTMAX"]
    assert softmax == (FLOAT32 if wide else INT16)
    assert len(notes) == int(wide) and (not wide or f"over {classes} classes" in notes[0])
    actual = calibrated.run(content)
    np.testing.assert_allclose(actual.sum(-1), 1.0, atol=1e-3)  # int16 kernel, wide: 0.014
    sqnr = 10 * np.log10(np.sum(reference**2) / np.sum((actual - reference) ** 2))
    assert sqnr > 35.0, sqnr  # int16 kernel, wide: 25.0 dB at spread 40
    int8 = quantize(calibrated.content)
    assert [o[0][0] for n, _, o in _ops(int8) if n == "SOFTMAX"] == [INT8]


def division_model():
    """x divided by a computed divisor, relu(y) · k (positive on the calibration inputs)."""
    nodes = [node("Relu", ["y"], "r"), node("Mul", ["r", "k"], "d"),
             node("Div", ["x", "d"], "q")]
    x = np.zeros((2, 3, 5, 4), np.float32)
    return make_model(nodes, {"x": x, "y": x}, ["q"], {"k": np.float32(-0.7)}), None, None


def test_a_computed_divisor_is_kept_off_its_zero_point():
    """TFLite's integer DIV stops the invocation on a divisor at its zero point. Where the
    DIV is quantized (micro files, integer kernels only), a divisor calibrated on one side
    of 0 is read through a MINIMUM (here: negative) with one step from 0: a divisor that 8-bit
    error takes to 0 gives the largest quotient, not an error; others are unchanged."""
    model = division_model()[0]
    planned = float32_planned(plan_loaded(model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    rng = np.random.default_rng(3)

    def feeds(y_low, y_high):
        return result.to_physical({"x": rng.uniform(-2, 2, (2, 3, 5, 4)).astype(np.float32),
                                   "y": rng.uniform(y_low, y_high, (2, 3, 5, 4)).astype(
                                       np.float32)})

    calibration = [feeds(1.0, 3.0) for _ in range(8)]
    content = with_ranges(result.content, measured_ranges(result.content, calibration)[
        "minmax"])[0]
    quantized = quantize(content)
    ops = _ops(quantized)
    names = [name for name, _, _ in ops]
    assert "MINIMUM" in names and names.index("MINIMUM") < names.index("DIV"), names
    (minimum,) = [(inputs, outputs) for name, inputs, outputs in ops if name == "MINIMUM"]
    assert minimum[1][0][2] == minimum[0][0][2] == minimum[0][1][2]  # one grid, unchanged
    assert {t[0] for t in (*minimum[0], *minimum[1])} == {INT8}

    def run(content, inputs):
        interpreter = Interpreter(model_content=content)
        runner = interpreter.get_signature_runner("serving_default")
        details = runner.get_input_details()
        (key, value), = run_signature(interpreter, {k: as_input(v, details[k])
                                                    for k, v in inputs.items()}).items()
        return dequantized(value, runner.get_output_details()[key])

    usual = feeds(1.2, 2.8)
    assert cosine(run(result.content, usual).ravel(), run(quantized, usual).ravel()) > 0.99
    zero = feeds(0.0, 0.004)  # relu(y) · k under one step: code at the zero point
    out = run(quantized, zero)
    assert np.all(np.isfinite(out)) and np.abs(out).max() > 0


@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_ranges_recorded_on_the_way_make_the_calibrated_copys_file(calibrated, activations):
    """The range-method trial quantizes the float file with each method's ranges recorded as
    it is unpacked (no calibrated copy of the float file per method): the same bytes as
    quantizing a copy with those ranges written in, whatever ranges the file held before."""
    measured = measured_ranges(calibrated.result.content, calibrated.calibration[:4],
                               ("percentile",))["percentile"]
    measured = {k: (0.7 * low, 0.7 * high) for k, (low, high) in measured.items()}
    copy, changed = with_ranges(calibrated.content, measured)
    assert changed  # other ranges than the file's own: the test can tell them apart
    assert quantize(calibrated.content, activations=activations, ranges=measured) == quantize(
        copy, activations=activations)
    if activations == "int8":  # the oracle takes a calibration the same way
        from onnx2tf_alt.quant.sensitivity import tf_quantize_calibrated

        assert tf_quantize_calibrated(calibrated.content, False, None, [], ranges=measured) == \
            tf_quantize_calibrated(copy, False, None, [])


@pytest.mark.parametrize("axis,per_tensor", [(0, False), (1, False), (0, True), (2, False)])
def test_weights_quantized_a_block_of_rows_at_a_time_get_the_same_codes(
        monkeypatch, axis, per_tensor):
    """Past BLOCK_ELEMENTS a weight's peaks and codes are computed a block of leading rows
    at a time (its float temporaries stay at a block's): the same scales and codes, for
    channels on the blocked axis or another, per tensor, and for a single row too large."""
    from onnx2tf_alt.quant import grids, integer

    rng = np.random.default_rng(3)
    weights = (rng.standard_normal((37, 5, 3)) * rng.uniform(0.1, 4, (37, 1, 1))).astype(
        np.float32)
    whole_peaks = integer._peaks(weights, axis, per_tensor)
    scales = (whole_peaks / 127).astype(np.float32)
    whole = integer._kernel_codes(weights, scales, axis)
    grid = grids.Grid(0.013, 3, grids.TT.INT8)
    whole_grid = grid.codes(weights)
    for block in (40, 7):  # two rows a block; less than one row (one row at a time)
        monkeypatch.setattr(grids, "BLOCK_ELEMENTS", block)
        np.testing.assert_array_equal(integer._peaks(weights, axis, per_tensor), whole_peaks)
        np.testing.assert_array_equal(integer._kernel_codes(weights, scales, axis), whole)
        np.testing.assert_array_equal(grid.codes(weights), whole_grid)


def test_a_channel_of_next_to_nothing_gets_a_normal_scale_xnnpack_takes():
    """A conv whose output channel holds weights of next to nothing (a batch norm's zero scale folded
    in): its scale is TF's near-zero one, not peak / 127 (a subnormal float that XNNPACK
    refuses, the whole conv then on the reference kernel); the bias scale is normal too,
    and every op of the file is delegated."""
    from onnx2tf_alt.export.delegates import analyze

    w, b = weights(5, 3, 3, 3), weights(5)
    w[2], b[2] = np.float32(1e-37), 0.0  # / 127: a subnormal scale (no bias to widen it)
    nodes = [node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "y")]

    def make():
        x = np.zeros((2, 3, 9, 7), np.float32)
        return make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}), "x", (2, 3, 9, 7)

    make.__name__ = "near_zero_channel"
    calibrated = Calibrated(make)
    content = quantize(calibrated.content)
    (conv,) = [inputs for name, inputs, _ in _ops(content) if name == "CONV_2D"]
    for _, scales, _ in conv[1:]:
        assert np.all(scales >= np.finfo(np.float32).tiny), scales
    report = analyze(content).to_json()
    assert report["ops_delegated"] == report["ops_total"], report["summary"]
    assert cosine(calibrated.run(calibrated.result.content), calibrated.run(content)) > 0.99


def test_a_batch_matmuls_second_operand_is_centred_so_xnnpack_takes_it():
    """XNNPACK takes an int8 BATCH_MATMUL only with its second operand's zero point at 0:
    that operand's grid (with the group it shares, the transpose before it) is symmetric;
    the first keeps its own asymmetric one. Every BATCH_MATMUL of the file is delegated."""
    from onnx2tf_alt.export.delegates import analyze

    calibrated = Calibrated(attention_model)
    content = quantize(calibrated.content)
    matmuls = [inputs for name, inputs, _ in _ops(content) if name == "BATCH_MATMUL"]
    assert matmuls
    for first, second in matmuls:
        assert (second[0], int(second[2][0])) == (INT8, 0), second
    assert any(int(first[2][0]) != 0 for first, _ in matmuls)  # not every grid centred
    report = analyze(content).to_json()
    assert all(o["delegated"] for o in report["ops"] if o["op"] == "BATCH_MATMUL"), \
        report["summary"]


@pytest.mark.parametrize("make, builtin", [(attention_model, "SOFTMAX"),
                                            (hard_swish_model, "HARD_SWISH")])
def test_ops_xnnpack_runs_only_in_float_stay_float_in_the_float_io_int8_file(make, builtin):
    """SOFTMAX, GELU, RSQRT and HARD_SWISH have no int8 XNNPACK kernel: in the INT8 file
    with float inputs and outputs they stay float (delegated, between a DEQUANTIZE and a
    QUANTIZE); the full-integer file and integer-kernels-only (micro) files keep them int8."""
    from onnx2tf_alt.export.delegates import analyze
    from onnx2tf_alt.quant.sensitivity import kept_float

    calibrated = Calibrated(make)
    kept, notes = kept_float(calibrated.content, False, None)
    model = unpack_model(calibrated.content)
    graph = model.subgraphs[0]
    (name,) = [graph.tensors[op.outputs[0]].name.decode() for op in graph.operators
               if op_name(model, op) == builtin]
    assert name in kept and any("SOFTMAX / GELU / RSQRT / HARD_SWISH" in n for n in notes), notes
    content = quantize(calibrated.content, float_tensors=kept)
    (found,) = [(outputs[0][0], k) for k, (op, _, outputs) in enumerate(_ops(content))
                if op == builtin]
    assert found[0] == FLOAT32
    report = analyze(content).to_json()
    assert report["ops"][found[1]]["delegated"], report["summary"]
    for integer_only, io in ((False, ("int8", "int8")), (True, None)):
        assert name not in kept_float(calibrated.content, integer_only, io)[0]
