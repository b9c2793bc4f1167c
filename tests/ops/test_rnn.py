"""RNN, LSTM and GRU against onnxruntime, through TF and the float32 TFLite.

Each conversion of an unrolled recurrence is costly, so most tests put several nodes that
share the input x into one model. onnxruntime does not run layout=1 (batch first): those
nodes are checked against the same node with layout 0 between Transpose nodes.
"""

import numpy as np
import onnx
import pytest
from onnx import helper

from harness import (
    assert_close,
    assert_keras_reloads,
    check_model,
    convert,
    count_tflite_ops,
    make_model,
    ort_run,
    tf_run,
    tflite_run,
)

GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}
SEQ, BATCH, INPUT, HIDDEN = 3, 3, 4, 5
UNEQUAL = [3, 1, 2]
rng = np.random.default_rng(0)


def _randn(*shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _node(op, tag, direction="forward", layout=0, bias=True, initial=None, lens=None,
          peepholes=False, outputs=("y", "y_h", "y_c"), runtime="", batch=BATCH, **attrs):
    """One node reading "x", with random weights: (node, run-time feeds, constants).

    initial: None, "input" or "const" (initial_h, and initial_c for LSTM); lens: None or
    (lengths, "input" | "const"); outputs: "" omits one; runtime: the letters of the
    weights fed at run time, among "w", "r", "b" and "p" (the others are constants). Value
    names end with `tag`.
    """
    dirs = 2 if direction == "bidirectional" else 1
    width = GATES[op] * HIDDEN
    state_shape = (dirs, batch, HIDDEN) if layout == 0 else (batch, dirs, HIDDEN)
    feeds, consts = {}, {f"w{tag}": _randn(dirs, width, INPUT),
                         f"r{tag}": _randn(dirs, width, HIDDEN)}
    names = ["x", f"w{tag}", f"r{tag}", ""]
    if bias:
        consts[f"b{tag}"] = _randn(dirs, 2 * width)
        names[3] = f"b{tag}"
    extra = [""] * (4 if op == "LSTM" else 2)  # sequence_lens, initial_h[, initial_c, P]
    if lens is not None:
        values, where = lens
        (feeds if where == "input" else consts)[f"lens{tag}"] = np.array(values, np.int32)
        extra[0] = f"lens{tag}"
    if initial is not None:
        for k, name in enumerate(["h0", "c0"] if op == "LSTM" else ["h0"]):
            (feeds if initial == "input" else consts)[name + tag] = _randn(*state_shape)
            extra[1 + k] = name + tag
    if peepholes:
        consts[f"p{tag}"] = _randn(dirs, 3 * HIDDEN)
        extra[3] = f"p{tag}"
    names += extra
    for letter in runtime:
        feeds[letter + tag] = consts.pop(letter + tag)
    while names[-1] == "":
        names.pop()
    outputs = [o + tag if o else "" for o in outputs[:3 if op == "LSTM" else 2]]
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, outputs, direction=direction, hidden_size=HIDDEN,
                            **attrs)
    return node, feeds, consts


def _model(specs, layout=0, opset=18, swapped_input=False, batch=BATCH):
    """A model of the nodes `specs` (kwargs of _node, tag and batch added) on one value x;
    with `swapped_input`, x is a Transpose of the model input, as in PyTorch's batch-first
    exports."""
    x = _randn(*((SEQ, batch, INPUT) if layout == 0 else (batch, SEQ, INPUT)), scale=1.0)
    nodes, feeds, consts = [], {"x": x}, {}
    if swapped_input:
        feeds = {"x_in": np.ascontiguousarray(np.swapaxes(x, 0, 1))}
        nodes.append(helper.make_node("Transpose", ["x_in"], ["x"], perm=[1, 0, 2]))
    for k, spec in enumerate(specs):
        node, f, c = _node(tag=f"_{k}", layout=layout, batch=batch, **spec)
        nodes.append(node)
        feeds.update(f)
        consts.update(c)
    outputs = [o for n in nodes for o in n.output if o]
    return make_model(nodes, feeds, outputs, consts, opset), feeds


def _check(specs, opset=18, swapped_input=False, batch=BATCH):
    model, feeds = _model(specs, opset=opset, swapped_input=swapped_input, batch=batch)
    return check_model(model, feeds)


def _batch_first_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each layout=1 node run as layout 0 between Transpose nodes."""
    ref = onnx.ModelProto()
    ref.CopyFrom(model)
    nodes, swapped = [], set()
    for node in model.graph.node:
        if node.op_type not in GATES:
            nodes.append(node)
            continue
        inputs, outputs = list(node.input), list(node.output)
        for i in (0, 5, 6):  # x, initial_h, initial_c: swap the first two axes
            if i < len(inputs) and inputs[i]:
                if inputs[i] not in swapped:
                    nodes.append(helper.make_node("Transpose", [inputs[i]], [inputs[i] + "_t"],
                                                  perm=[1, 0, 2]))
                    swapped.add(inputs[i])
                inputs[i] += "_t"
        post = []
        for j, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
            if j < len(outputs) and outputs[j]:
                post.append(helper.make_node("Transpose", [outputs[j] + "_t"], [outputs[j]],
                                             perm=perm))
                outputs[j] += "_t"
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        del attrs["layout"]
        nodes += [helper.make_node(node.op_type, inputs, outputs, **attrs), *post]
    del ref.graph.node[:]
    ref.graph.node.extend(nodes)
    return ref


def _check_batch_first(specs, swapped_input=False, batch=BATCH):
    model, feeds = _model(specs, layout=1, swapped_input=swapped_input, batch=batch)
    expected = ort_run(_batch_first_reference(model), feeds)
    converted = convert(model)
    for i, (a, e) in enumerate(zip(tf_run(converted, feeds), expected)):
        assert_close(a, e, what=f"TF output {i}")
    for i, (a, e) in enumerate(zip(tflite_run(converted, feeds), expected)):
        assert_close(a, e, what=f"TFLite output {i}")


def _spec(op, **kwargs) -> dict:
    """Keyword arguments of _node for one node of a test model."""
    return {"op": op, **kwargs}


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_directions_with_and_without_bias_and_initial_states(op):
    _check([_spec(op, direction="forward", initial="input"),
            _spec(op, direction="bidirectional", bias=False)])


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_batch_first_layout(op):
    """layout=1; for LSTM x also arrives physically time-major (a Transpose in front), which
    the node takes as it is."""
    _check_batch_first([_spec(op, direction="reverse", initial="input",
                              lens=(UNEQUAL, "const")),
                        _spec(op, direction="bidirectional", initial="const", bias=False)],
                       swapped_input=op == "LSTM")


def test_swapped_input_is_used_as_it_arrives():
    """x arrives batch-major (a Transpose in front, as in PyTorch's batch-first exports): it
    is used with no transpose, and Y comes out batch-major too."""
    _check([_spec("GRU", direction="bidirectional", initial="input"),
            _spec("RNN", direction="forward", lens=(UNEQUAL, "const"))], swapped_input=True)


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_unequal_sequence_lengths(op):
    """Constant lengths, and run-time ones (masks computed in the graph)."""
    _check([_spec(op, direction="reverse", lens=(UNEQUAL, "const"), initial="const"),
            _spec(op, direction="bidirectional", lens=([2, 3, 1], "input"), initial="input")])


def test_lstm_peepholes_input_forget_and_clip():
    _check([_spec("LSTM", direction="forward", peepholes=True, initial="input", clip=0.4),
            _spec("LSTM", direction="reverse", peepholes=True, input_forget=1,
                  lens=(UNEQUAL, "const"))])


def test_gru_linear_before_reset_and_clip():
    _check([_spec("GRU", direction="bidirectional", initial="input", linear_before_reset=1),
            _spec("GRU", direction="reverse", lens=(UNEQUAL, "const"), linear_before_reset=1,
                  clip=0.3),
            _spec("GRU", direction="forward", initial="input", clip=0.3)])


def test_activations_and_clip():
    """Every activation, alphas and betas consumed in order; names are case-insensitive
    (onnxruntime's RNN accepts only the spec's spelling, its LSTM any case)."""
    rnn_pairs = [(["Relu", "Sigmoid"], [], []),
                 (["Affine", "LeakyRelu"], [0.7, 0.2], [0.1]),
                 (["ThresholdedRelu", "ScaledTanh"], [0.3, 1.5], [0.8]),
                 (["HardSigmoid", "Elu"], [0.3, 0.5], [0.4]),
                 (["Softsign", "Softplus"], [], [])]
    specs = []
    for names, alpha, beta in rnn_pairs:
        attrs = {"activations": names}
        if alpha:
            attrs["activation_alpha"] = alpha
        if beta:
            attrs["activation_beta"] = beta
        specs.append(_spec("RNN", direction="bidirectional", initial="input", **attrs))
    specs.append(_spec("RNN", direction="forward", initial="input", clip=0.4))
    specs.append(_spec("LSTM", direction="forward", initial="input",
                       activations=["hardsigmoid", "softsign", "elu"],
                       activation_alpha=[0.25], activation_beta=[0.4]))
    specs.append(_spec("GRU", direction="reverse", initial="input", linear_before_reset=1,
                       activations=["LeakyRelu", "ScaledTanh"], activation_alpha=[0.3, 0.9],
                       activation_beta=[1.2]))
    _check(specs)


def test_omitted_outputs():
    _check([_spec("LSTM", direction="bidirectional", lens=(UNEQUAL, "const"),
                  outputs=("", "y_h", "")),
            _spec("GRU", direction="forward", initial="input", outputs=("", "y_h")),
            _spec("LSTM", direction="forward", initial="const", outputs=("y", "", "y_c"))])


ONE_SEQUENCE_EXTRAS = {"RNN": {}, "LSTM": {"peepholes": True},
                       "GRU": {"linear_before_reset": 1}}


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_one_sequence(op):
    """Batch 1: each step's input projection is a vector, added to the recurrence product
    as the run-time bias of its FULLY_CONNECTED (onnx2tf_alt/tflite/shared_weights.py), with
    initial states, lengths, clip and run-time weights. The LSTMs are unrolled (peepholes,
    input_forget)."""
    extra = ONE_SEQUENCE_EXTRAS[op]
    converted = _check(
        [_spec(op, direction="bidirectional", initial="input", **extra),
         _spec(op, direction="reverse", lens=([2], "const"), initial="const", clip=0.5,
               **extra),
         _spec(op, direction="forward", runtime="rb", lens=([SEQ], "input"),
               **({"input_forget": 1} if op == "LSTM" else {}))],
        batch=1)
    ops = count_tflite_ops(converted.tflite)
    steps = 2 * SEQ + SEQ + (SEQ - 1)  # with a state: all steps, but the first from zero
    assert ops["FULLY_CONNECTED"] >= steps, ops
    if op == "GRU":
        _check([_spec("GRU", direction="forward", initial="input", clip=0.3)], batch=1)


def test_one_sequence_batch_first_layout():
    _check_batch_first([_spec(op, direction="bidirectional", initial="input", **extra)
                        for op, extra in ONE_SEQUENCE_EXTRAS.items()],
                       swapped_input=True, batch=1)


def test_lstm_as_fused_kernel():
    """An LSTM with default activations whose final cell state nothing reads runs as one
    UNIDIRECTIONAL_SEQUENCE_LSTM per direction (no ops per time step); one whose Y_c is
    read stays unrolled. Initial states constant, run-time or absent; lengths all full."""
    full = [SEQ] * BATCH
    fused = [
        _spec("LSTM", direction="bidirectional", initial="input", outputs=("y", "y_h", "")),
        _spec("LSTM", direction="reverse", bias=False, outputs=("y", "", "")),
        _spec("LSTM", direction="forward", lens=(full, "const"),
              activations=["sigmoid", "TANH", "Tanh"], outputs=("", "y_h", "")),
    ]
    for swapped in (False, True):  # time-major, and batch-major as PyTorch exports it
        converted = _check(fused, swapped_input=swapped)
        ops = count_tflite_ops(converted.tflite)
        assert ops.get("UNIDIRECTIONAL_SEQUENCE_LSTM") == 4, ops
        assert "FULLY_CONNECTED" not in ops and "LOGISTIC" not in ops, ops
    unrolled = [_spec("LSTM", direction="forward", outputs=("y", "", "y_c")),  # Y_c read
                _spec("LSTM", direction="forward", initial="const", outputs=("y", "", ""))]
    ops = count_tflite_ops(_check(unrolled).tflite)
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in ops, ops
    assert ops["LOGISTIC"] >= 2 * 3 * SEQ - 1, ops  # gates i, f, o at every step


def test_lstm_of_one_sequence_unrolled_up_to_its_step_limit(monkeypatch):
    """One sequence (batch 1) runs faster unrolled than in the fused kernel, up to
    rnn.UNROLL_STEPS steps x directions; a longer one keeps the fused kernel."""
    from onnx2tf_alt.ops import rnn

    spec = _spec("LSTM", direction="bidirectional", initial="input", outputs=("y", "y_h", ""))
    ops = count_tflite_ops(_check([spec], batch=1).tflite)
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in ops and ops["FULLY_CONNECTED"] >= SEQ, ops
    monkeypatch.setattr(rnn, "UNROLL_STEPS", 2 * SEQ - 1)
    ops = count_tflite_ops(_check([spec], batch=1).tflite)
    assert ops.get("UNIDIRECTIONAL_SEQUENCE_LSTM") == 2 and "LOGISTIC" not in ops, ops


def test_lstm_fused_kernel_batch_first_layout():
    _check_batch_first([_spec("LSTM", direction="bidirectional", initial="input",
                              outputs=("y", "y_h", ""))], swapped_input=True)


@pytest.mark.parametrize("opset", [7, 22])
def test_opsets_and_builtin_ops(opset):
    converted = _check([_spec(op, direction="forward", initial="input")
                        for op in ("RNN", "LSTM", "GRU")], opset=opset)
    ops = count_tflite_ops(converted.tflite)
    # No SPLIT_V: XNNPACK does not take it (GRU gate groups are SLICEs).
    # CONCATENATION, STRIDED_SLICE: the recurrence products' run-time bias, once per node
    builtins = {"FULLY_CONNECTED", "ADD", "MUL", "SUB", "LOGISTIC", "TANH", "SPLIT", "SLICE",
                "UNPACK", "PACK", "RESHAPE", "CONCATENATION", "STRIDED_SLICE"}
    assert set(ops) <= builtins, ops
    assert ops["FULLY_CONNECTED"] == 3 * (1 + SEQ) + SEQ, ops  # GRU: two per step


@pytest.mark.parametrize("op", ["RNN", "LSTM", "GRU"])
def test_run_time_weights(op):
    """W, R, B (and P) fed at run time, all or some of them, with run-time and constant
    initial states and lengths, as in the ONNX node tests."""
    special = {"RNN": {"activations": ["HardSigmoid"], "activation_alpha": [0.3],
                       "activation_beta": [0.4], "clip": 0.6},
               "LSTM": {"peepholes": True, "input_forget": 1, "clip": 0.5},
               "GRU": {"linear_before_reset": 1, "clip": 0.4}}[op]
    _check([_spec(op, direction="bidirectional", initial="input", lens=([2, 3, 1], "input"),
                  peepholes=op == "LSTM", runtime="wrbp" if op == "LSTM" else "wrb"),
            _spec(op, direction="reverse", initial="const", lens=(UNEQUAL, "const"),
                  runtime="rb"),
            _spec(op, direction="forward", bias=False, runtime="w", outputs=("", "y_h", "y_c")),
            _spec(op, direction="forward", initial="input", runtime="rbp" if op == "LSTM" else "rb",
                  **special)])


def test_run_time_weights_batch_first():
    _check_batch_first([_spec(op, direction="bidirectional", initial="input", runtime="wrb",
                              lens=(UNEQUAL, "input")) for op in ("RNN", "LSTM", "GRU")]
                       + [_spec("GRU", direction="reverse", linear_before_reset=1,
                                runtime="b")])


def test_run_time_weights_builtin_ops_and_reload(tmp_path):
    """Run-time weights are used as FULLY_CONNECTED takes them: no TRANSPOSE, builtins
    only; the Keras files reload."""
    model, feeds = _model([_spec("RNN", direction="forward", initial="input", runtime="wrb"),
                           _spec("LSTM", direction="reverse", runtime="wrbp", peepholes=True),
                           _spec("GRU", direction="forward", initial="input", runtime="wrb",
                                 linear_before_reset=1)])
    converted = check_model(model, feeds)
    ops = count_tflite_ops(converted.tflite)
    builtins = {"FULLY_CONNECTED", "BATCH_MATMUL", "ADD", "MUL", "SUB", "LOGISTIC", "TANH",
                "SPLIT", "SPLIT_V", "UNPACK", "PACK", "RESHAPE", "STRIDED_SLICE", "SLICE",
                "CONCATENATION"}
    assert set(ops) <= builtins, ops
    assert_keras_reloads(converted, feeds, tmp_path)


def test_keras_files_reload(tmp_path):
    model, feeds = _model([
        _spec("LSTM", direction="bidirectional", lens=(UNEQUAL, "const"), peepholes=True),
        _spec("GRU", direction="reverse", lens=(UNEQUAL, "input"), initial="input", clip=0.5),
        _spec("RNN", activations=["ThresholdedRelu"], activation_alpha=[0.1])])
    assert_keras_reloads(convert(model), feeds, tmp_path)


def test_dynamic_sequence_length_is_reported():
    model, _ = _model([_spec("GRU")])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    with pytest.raises(Exception, match="static sequence length"):
        convert(model)


def test_torch_lstm_and_gru(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    modules = {
        "lstm": torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True),
        "gru": torch.nn.GRU(8, 16, batch_first=True),
    }
    for name, module in modules.items():
        path = tmp_path / f"{name}.onnx"
        torch.onnx.export(module.eval(), (torch.from_numpy(x),), str(path), dynamo=False,
                          opset_version=17, input_names=["x"])
        converted = check_model(onnx.load(str(path)), {"x": x})
        ops = count_tflite_ops(converted.tflite)
        print(name, sorted(ops.items()))
        assert "TRANSPOSE" not in ops, ops


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_torch_rnn_with_a_dynamic_batch(kind, tmp_path):
    """A torch GRU / LSTM exported with a dynamic batch builds its zero initial states in
    the graph (their shape is known only at run time, so every step starts from a state);
    converted once, it runs batches of 1 and 3, with builtin ops only (a fused LSTM of
    unknown batch would need Flex: it is unrolled). Its recurrence products get a run-time
    bias and run on the builtin kernel (onnx2tf_alt/tflite/shared_weights.py)."""
    torch = pytest.importorskip("torch")
    from onnx2tf_alt.export.delegates import analyze

    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(8, 16, num_layers=2, bidirectional=True,
                                     batch_first=True).eval()
    path = tmp_path / "rnn.onnx"
    x = rng.standard_normal((3, SEQ, 8)).astype(np.float32)
    torch.onnx.export(module, (torch.from_numpy(x[:1]),), str(path), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    model = onnx.load(str(path))
    converted = check_model(model, {"x": x})
    for i, (got, want) in enumerate(zip(tflite_run(converted, {"x": x[1:2]}),
                                        ort_run(model, {"x": x[1:2]}))):
        assert_close(got, want, what=f"TFLite output {i}, batch 1")
    ops = count_tflite_ops(converted.tflite)
    assert not any(name.startswith("Flex") for name in ops), ops
    report = analyze(converted.tflite, converted.tflite_result(), converted.graph)
    off = [o.op for o in report.reference_ops]
    assert off.count("FULLY_CONNECTED") == 2 * 2 * SEQ, report.summary()  # layers, directions


@pytest.mark.parametrize("held", [False, True], ids=["constants", "held_weights"])
def test_each_recurrent_node_is_one_keras_layer(monkeypatch, tmp_path, held):
    """An unrolled recurrence runs in one NodeLayer (translate/node_layer.py) instead of a
    Keras layer per TF op: the float32 TFLite file has the same ops and outputs as the
    op-by-op route's. The constants the handler makes are graph constants, or (`held`,
    as for large weights) weights of the layer's own that the .tflite binds after TF's
    converter; the Keras files store neither and reload."""
    from onnx2tf_alt.tflite.lowering import late_layers, tflite_bytes
    from onnx2tf_alt.translate import node_layer

    if held:
        monkeypatch.setattr(node_layer, "HELD_BYTES", 0)
        # weights rather than config constants, in both routes
        monkeypatch.setattr(node_layer, "INLINE_CONSTANT_LIMIT", 8)
        monkeypatch.setattr("onnx2tf_alt.translate.builder.INLINE_CONSTANT_LIMIT", 8)
        monkeypatch.setattr("onnx2tf_alt.tflite.lowering.LATE_ELEMENTS", 1)  # bound late
    specs = [_spec("LSTM", direction="bidirectional", lens=(UNEQUAL, "const"), peepholes=True),
             _spec("GRU", direction="reverse", initial="input", linear_before_reset=1),
             _spec("RNN", direction="forward", runtime="r")]
    model, feeds = _model(specs)
    layered = check_model(model, feeds)
    keras_model = layered.result.model
    kinds = [type(layer).__name__ for layer in keras_model.layers]
    assert kinds.count("NodeLayer") == 3, kinds
    assert len(kinds) < 20, kinds  # inputs, the three layers, a few transposes and weights
    derived = node_layer.derived_weights(keras_model)
    assert bool(derived) == held
    assert late_layers(keras_model) == derived
    assert node_layer.serving_weights(keras_model) == [d.value for d in derived]
    assert_keras_reloads(layered, feeds, tmp_path)
    if held:  # every step reads the bound weights: one DEQUANTIZE each in the float16 file
        _assert_one_dequantize_per_weight(layered, feeds)
    monkeypatch.setattr(node_layer, "ENABLED", False)
    op_by_op = convert(model)
    assert "NodeLayer" not in [type(layer).__name__ for layer in op_by_op.result.model.layers]
    reference = tflite_bytes(op_by_op.tflite_result())
    assert count_tflite_ops(layered.tflite) == count_tflite_ops(reference)
    for a, b in zip(tflite_run(layered, feeds), tflite_run(op_by_op, feeds, reference)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout,swapped", [(0, False), (0, True), (1, False)],
                         ids=["time_major", "batch_first_input", "layout_1"])
def test_a_node_layer_takes_its_outputs_from_the_graph_without_a_trace(monkeypatch, layout,
                                                                      swapped):
    """Keras learns a NodeLayer's outputs from the graph's shapes and dtypes (in the plan's
    perms) instead of running the handler once more to trace them (node_layer.py,
    SIGNATURE_FROM_GRAPH): building runs no handler, and every layer's outputs, the TFLite
    ops and outputs are those of the traced route."""
    from onnx2tf_alt.tflite.lowering import tflite_bytes
    from onnx2tf_alt.translate import node_layer

    specs = [_spec("LSTM", direction="bidirectional", initial="input", peepholes=True),
             _spec("GRU", direction="reverse", lens=(UNEQUAL, "const")),
             _spec("RNN", direction="forward", initial="const")]
    model, feeds = _model(specs, layout=layout, swapped_input=swapped)
    runs, run = [], node_layer.NodeLayer._run

    def counted(self, inputs):
        runs.append(self.name)
        return run(self, inputs)

    monkeypatch.setattr(node_layer.NodeLayer, "_run", counted)
    routes = {}
    for from_graph in (True, False):
        monkeypatch.setattr(node_layer, "SIGNATURE_FROM_GRAPH", from_graph)
        runs.clear()
        routes[from_graph] = convert(model)
        layers = [layer for layer in routes[from_graph].result.model.layers
                  if isinstance(layer, node_layer.NodeLayer)]
        assert len(layers) == 3
        assert len(runs) == (0 if from_graph else 3), runs

    def signatures(converted):
        return [[(tuple(t.shape), t.dtype) for t in _as_list(layer.output)]
                for layer in converted.result.model.layers
                if isinstance(layer, node_layer.NodeLayer)]

    assert signatures(routes[True]) == signatures(routes[False])
    files = {k: tflite_bytes(c.tflite_result()) for k, c in routes.items()}
    assert count_tflite_ops(files[True]) == count_tflite_ops(files[False])
    for a, b in zip(tflite_run(routes[True], feeds, files[True]),
                    tflite_run(routes[False], feeds, files[False])):
        np.testing.assert_array_equal(a, b)


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _assert_one_dequantize_per_weight(converted, feeds):
    """The float16 file derived from `converted`'s float32 one dequantizes each float16
    buffer once, however many tensors of the float32 file shared it, and computes what the
    float32 file computes up to float16 rounding."""
    from onnx2tf_alt.export.float16 import float16_from_float32
    from onnx2tf_alt.tflite.flatbuffer import op_name, schema, unpack_model

    half = float16_from_float32(converted.tflite)
    model = unpack_model(half)
    ops = [op_name(model, op) for op in model.subgraphs[0].operators]
    tensors = model.subgraphs[0].tensors
    buffers = {t.buffer for t in tensors if t.type == schema.TensorType.FLOAT16}
    assert ops.count("DEQUANTIZE") == len(buffers) > 0, (ops.count("DEQUANTIZE"), len(buffers))
    for a, b in zip(tflite_run(converted, feeds, half), tflite_run(converted, feeds)):
        assert_close(a, b, 2e-2, "float16 against float32")
