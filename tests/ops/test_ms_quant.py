"""onnxruntime's quantized com.microsoft ops against onnxruntime, through TF and the float32
TFLite, on models onnxruntime's own tools write inside the test: `quantize_static` in
QOperator format (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
QLinearAveragePool, QLinearGlobalAveragePool, QLinearSoftmax, QGemm), in QDQ format with
com.microsoft QuantizeLinear / DequantizeLinear (16-bit), and `quantize_dynamic`
(DynamicQuantizeLSTM, QAttention; DynamicQuantizeMatMul and MatMulIntegerToFloat after
onnxruntime's graph optimizer fuses its output, as a saved optimized model holds them).

Per op, each node of a quantized model is checked alone, fed with the values onnxruntime
computes for its inputs in the whole model (all nodes side by side in one conversion).
Tolerances:
- integer outputs: one quantization step. The kernels round float intermediates (ratios of
  scales, tables built from float functions, onnxruntime's own sigmoid), so an exact tie
  can round the other way; anything beyond one step is a wrong formula.
- float outputs of the dynamic matrix products and QAttention: the integer sums are exact
  (QAttention: its float product of dequantized operands differs from them by float
  rounding), so only float rounding remains (1e-5 relative).
- the quantized LSTM: 1e-5, against onnxruntime on one thread. The hidden state is
  quantized at every step over the whole batch; onnxruntime on several threads quantizes
  each thread's share of the batch on its own, so its result depends on the thread count
  (by 9e-4 here, between 1 and 2 threads).
- end to end through many quantized ops, a flip upstream moves values downstream by a
  step of their own: the CNN's float output (softmax probabilities in steps of 1/256) is
  checked to two output steps.
"""

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from harness import Rng, convert, count_tflite_ops, ort_run, tf_run, tflite_run

rng = Rng(0)
MS = "com.microsoft"
QOPERATOR_OPS = {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
                 "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
                 "QLinearSoftmax", "QGemm"}


class Arrays(CalibrationDataReader):
    """Calibration data: a few random arrays for one input."""

    def __init__(self, name: str, shape, count: int = 4):
        self._feeds = iter([{name: rng.randn(*shape)} for _ in range(count)])

    def get_next(self):
        return next(self._feeds, None)


# onnxruntime's x64 kernels for uint8 x int8 products on CPUs without AVX-512 VNNI add pairs
# of products in 16 bits (vpmaddubsw), which saturate with full-range 8-bit weights: its
# results then depend on the CPU (2.9 away from the exact integer product, and from ours, on
# an AVX2-only AMD EPYC). 7-bit weights, which onnxruntime's quantizers offer for exactly
# this (reduce_range), keep its integer products exact on every x64 CPU.
REDUCE_RANGE = True

def save(model: onnx.ModelProto, folder, name: str) -> str:
    path = str(folder / name)
    onnx.save(model, path)
    return path


def optimized(path: str, folder) -> onnx.ModelProto:
    """The model as onnxruntime's graph optimizer saves it (fusing quantized matmuls)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(folder / "optimized.onnx")
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def ort_one_thread(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference=ort_run):
    """Per output, (max|err| through TF, through TFLite) against `reference` (onnxruntime),
    and the TFLite op census. Shapes and dtypes must match."""
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    expected = reference(model, feeds)
    converted = convert(model)
    content = tflite_bytes(converted.tflite_result())
    errors = {}
    outputs = zip([o.name for o in model.graph.output], expected, tf_run(converted, feeds),
                  tflite_run(converted, feeds, content))
    for name, want, got_tf, got_lite in outputs:
        for got in (got_tf, got_lite):
            assert got.shape == want.shape and got.dtype == want.dtype, (
                name, got.shape, got.dtype, want.shape, want.dtype)
        errors[name] = tuple(float(np.abs(g.astype(np.float64) - want).max())
                             for g in (got_tf, got_lite))
    return errors, count_tflite_ops(content)


def isolated(model: onnx.ModelProto, feeds, keep) -> tuple[onnx.ModelProto, dict, dict]:
    """The nodes `keep(node)` selects, each alone, side by side in one model: every run-time
    input becomes a model input fed with the value onnxruntime computes for it in `model`.
    Returns (model, its feeds, output name -> the node's op type)."""
    constants = {i.name: i for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if keep(n)]
    needed = sorted({i for n in nodes for i in n.input if i and i not in constants})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_value_info(n, onnx.TypeProto()) for n in needed
                              if n not in known and n not in feeds)
    names = [o.name for o in probe.graph.output]
    values = {**feeds, **dict(zip(names, ort_run(probe, feeds)))}
    inputs, new_feeds, outputs, op_of, inits = [], {}, [], {}, {}
    renamed = []
    for k, n in enumerate(nodes):
        ins = []
        for i in n.input:
            if not i or i in constants:
                ins.append(i)
                inits.setdefault(i, constants.get(i))
                continue
            name = f"node{k}/{i}"
            value = values[i]
            new_feeds[name] = value
            inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
            ins.append(name)
        node = onnx.NodeProto()
        node.CopyFrom(n)
        del node.input[:]
        node.input.extend(ins)
        renamed.append(node)
        for o in n.output:
            outputs.append(helper.make_value_info(o, onnx.TypeProto()))
            op_of[o] = n.op_type
    inits.pop("", None)
    graph = helper.make_graph(renamed, "isolated", inputs, outputs,
                              [v for v in inits.values() if v is not None])
    single = helper.make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    typed = [helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(r.dtype),
                                           r.shape)
             for o, r in zip(single.graph.output, ort_run(single, new_feeds))]
    del single.graph.output[:]
    single.graph.output.extend(typed)
    return single, new_feeds, op_of


def worst_per_op(errors: dict, op_of: dict) -> dict:
    worst = {}
    for name, (e_tf, e_lite) in errors.items():
        op = op_of[name]
        old = worst.get(op, (0.0, 0.0))
        worst[op] = (max(old[0], e_tf), max(old[1], e_lite))
    return worst


# --- QOperator static quantization ---------------------------------------------------------
def float_cnn() -> onnx.ModelProto:
    """Conv, Relu, Add (also with a broadcast constant), Mul, Sigmoid, LeakyRelu, Concat,
    AveragePool, GlobalAveragePool, Flatten, Gemm, Softmax; batch 2, odd spatial sizes."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "c2"], ["sum"]),
        helper.make_node("Add", ["sum", "offset"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "c2"], ["product"]),
        helper.make_node("Sigmoid", ["product"], ["sigmoid"]),
        helper.make_node("LeakyRelu", ["c2"], ["leaky"], alpha=0.1),
        helper.make_node("Concat", ["sigmoid", "leaky", "c1"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["pooled"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["pooled"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    weights = {"w1": rng.randn(4, 3, 3, 3, scale=0.4), "b1": rng.randn(4, scale=0.1),
               "w2": rng.randn(4, 4, 3, 3, scale=0.3), "b2": rng.randn(4, scale=0.1),
               "offset": rng.randn(4, 1, 1), "wg": rng.randn(6, 12), "bg": rng.randn(6, scale=0.1)}
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 7, 9])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module", params=[QuantType.QUInt8, QuantType.QInt8],
                ids=["uint8", "int8"])
def qoperator_cnn(request, tmp_path_factory):
    """The CNN after quantize_static(QOperator) with activations of the parameter's type."""
    folder = tmp_path_factory.mktemp("qoperator")
    path = save(float_cnn(), folder, "cnn.onnx")
    quantize_static(path, str(folder / "q.onnx"), Arrays("x", (2, 3, 7, 9)),
                    quant_format=QuantFormat.QOperator, activation_type=request.param,
                    weight_type=QuantType.QInt8, reduce_range=REDUCE_RANGE)
    return onnx.load(str(folder / "q.onnx"))


def test_qoperator_ops_each(qoperator_cnn):
    model, feeds, op_of = isolated(qoperator_cnn, {"x": rng.randn(2, 3, 7, 9)},
                                   lambda n: n.domain == MS)
    assert set(op_of.values()) == QOPERATOR_OPS
    errors, census = compare(model, feeds)
    for op, (e_tf, e_lite) in worst_per_op(errors, op_of).items():
        assert e_tf <= 1 and e_lite <= 1, (op, e_tf, e_lite)
    assert "TRANSPOSE" not in census, census


def test_qoperator_cnn_end_to_end(qoperator_cnn):
    """The whole quantized CNN (QuantizeLinear, QLinearConv and the ops above) stays
    channel-last: no TRANSPOSE."""
    errors, census = compare(qoperator_cnn, {"x": rng.randn(2, 3, 7, 9)})
    e_tf, e_lite = errors["y"]
    assert e_tf <= 2 / 256 and e_lite <= 2 / 256, errors
    assert "TRANSPOSE" not in census, census


# --- com.microsoft QuantizeLinear / DequantizeLinear (16-bit) -------------------------------
@pytest.mark.parametrize("activations", [QuantType.QUInt16, QuantType.QInt16])
def test_ms_quantize_dequantize_16bit(activations, tmp_path):
    """quantize_static(QDQ, UseQDQContribOps) with 16-bit activations and weights: each Q / DQ
    node alone is exact through TF; through TFLite QuantizeLinear is within one step (the
    TFLite converter turns the division by a constant scale into a product with its
    reciprocal, which can round an exact tie up). The whole model matches to 1e-4."""
    model = float_cnn()
    model.graph.node[-1].CopyFrom(helper.make_node("Identity", ["logits"], ["y"]))
    path = save(model, tmp_path, "cnn.onnx")
    quantize_static(path, str(tmp_path / "q.onnx"), Arrays("x", (2, 3, 7, 9)),
                    quant_format=QuantFormat.QDQ, activation_type=activations,
                    weight_type=QuantType.QInt16, extra_options={"UseQDQContribOps": True})
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    feeds = {"x": rng.randn(2, 3, 7, 9)}
    single, single_feeds, op_of = isolated(quantized, feeds, lambda n: n.domain == MS)
    assert set(op_of.values()) == {"QuantizeLinear", "DequantizeLinear"}
    errors, _ = compare(single, single_feeds)
    for op, (e_tf, e_lite) in worst_per_op(errors, op_of).items():
        assert e_tf == 0 and e_lite <= (1 if op == "QuantizeLinear" else 0), (op, errors)
    errors, _ = compare(quantized, feeds)
    assert max(errors["y"]) <= 1e-4 * max(1.0, float(np.abs(ort_run(quantized, feeds)[0]).max()))


# --- dynamic quantization --------------------------------------------------------------------
def float_matmuls() -> onnx.ModelProto:
    """x @ w1 + b (one consumer of x's quantization: DynamicQuantizeMatMul after fusion) and
    z @ w2, z @ w3 (a shared quantization: two MatMulIntegerToFloat)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["y1"]),
        helper.make_node("MatMul", ["z", "w2"], ["y2"]),
        helper.make_node("MatMul", ["z", "w3"], ["y3"]),
    ]
    weights = {"w1": rng.randn(16, 7), "b1": rng.randn(7), "w2": rng.randn(9, 5),
               "w3": rng.randn(9, 3)}
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "matmuls",
        [helper.make_tensor_value_info("x", f, [2, 5, 16]),
         helper.make_tensor_value_info("z", f, [3, 9])],
        [helper.make_tensor_value_info(o, f, None) for o in ("y1", "y2", "y3")],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_column"])
def test_dynamic_matmuls(per_channel, tmp_path):
    path = save(float_matmuls(), tmp_path, "mm.onnx")
    quantize_dynamic(path, str(tmp_path / "q.onnx"), per_channel=per_channel,
                     reduce_range=REDUCE_RANGE)
    model = optimized(str(tmp_path / "q.onnx"), tmp_path)
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    assert ops == {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}, ops
    feeds = {"x": rng.randn(2, 5, 16, scale=2.0), "z": rng.randn(3, 9)}
    expected = ort_run(model, feeds)
    errors, _ = compare(model, feeds)
    for (name, (e_tf, e_lite)), want in zip(errors.items(), expected):
        limit = 1e-5 * max(1.0, float(np.abs(want).max()))
        assert e_tf <= limit and e_lite <= limit, (name, e_tf, e_lite)


class BiLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True)

    def forward(self, x):
        return self.lstm(x)[0]


@pytest.fixture(scope="module")
def quantized_lstm(tmp_path_factory):
    """A 2-layer bidirectional torch LSTM (hidden 5) after quantize_dynamic."""
    folder = tmp_path_factory.mktemp("lstm")
    torch.manual_seed(0)
    torch.onnx.export(BiLSTM().eval(), torch.randn(4, 3, 6), str(folder / "lstm.onnx"),
                      opset_version=17, dynamo=False, input_names=["x"], output_names=["y"])
    quantize_dynamic(str(folder / "lstm.onnx"), str(folder / "q.onnx"), reduce_range=REDUCE_RANGE)
    return onnx.load(str(folder / "q.onnx"))


def test_dynamic_quantize_lstm(quantized_lstm):
    ops = [n.op_type for n in quantized_lstm.graph.node if n.domain == MS]
    assert ops == ["DynamicQuantizeLSTM"] * 2
    feeds = {"x": rng.randn(4, 3, 6)}
    errors, _ = compare(quantized_lstm, feeds, reference=ort_one_thread)
    e_tf, e_lite = errors["y"]
    assert e_tf <= 1e-5 and e_lite <= 1e-5, errors


def float_attention() -> onnx.ModelProto:
    """Two com.microsoft Attention nodes (onnxruntime's fused BERT / GPT-2 attention): one
    with a key mask of sequence lengths, one causal (unidirectional)."""
    f = onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("Attention", ["x", "w1", "b1", "lengths"], ["y1"], domain=MS,
                         num_heads=2),
        helper.make_node("Attention", ["x", "w2", "b2"], ["y2"], domain=MS, num_heads=4,
                         unidirectional=1),
    ]
    weights = {"w1": rng.randn(8, 24, scale=0.5), "b1": rng.randn(24, scale=0.1),
               "w2": rng.randn(8, 24, scale=0.5), "b2": rng.randn(24, scale=0.1)}
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", f, [2, 5, 8]),
         helper.make_tensor_value_info("lengths", onnx.TensorProto.INT32, [2])],
        [helper.make_tensor_value_info(o, f, [2, 5, 8]) for o in ("y1", "y2")],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def test_qattention(tmp_path):
    """quantize_dynamic turns Attention into DynamicQuantizeLinear + QAttention; the integer
    projection is exact, so only float rounding remains (1e-5 relative)."""
    path = save(float_attention(), tmp_path, "attention.onnx")
    quantize_dynamic(path, str(tmp_path / "q.onnx"), reduce_range=REDUCE_RANGE)
    model = onnx.load(str(tmp_path / "q.onnx"))
    assert [n.op_type for n in model.graph.node if n.domain == MS] == ["QAttention"] * 2
    feeds = {"x": rng.randn(2, 5, 8), "lengths": np.array([5, 3], np.int32)}
    expected = ort_run(model, feeds)
    errors, _ = compare(model, feeds)
    for (name, (e_tf, e_lite)), want in zip(errors.items(), expected):
        limit = 1e-5 * max(1.0, float(np.abs(want).max()))
        assert e_tf <= limit and e_lite <= limit, (name, e_tf, e_lite)
