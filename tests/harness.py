"""Shared helpers for the tests: build small ONNX models, convert them in memory, and
compare onnxruntime with the TF model and the float32 TFLite model.

Converted values come back in their physical layout; the harness maps them to ONNX order
through the perms the converter reports (never by guessing axes).

Which check to use (each converts once and compares every output through TF and, unless
`tflite=False`, the float32 TFLite):

- `check_node(op_type, inputs, attrs)`: one node of one op against onnxruntime. The
  default for an op test; `initializers` become constant inputs, `opset`, `domain` and
  `num_outputs` as the node needs.
- `check_nodes(nodes, inputs)`: several nodes in one model, e.g. one per attribute
  combination, or a short chain. Failures name the output; returns (conversion, census of
  TFLite builtin ops) to assert e.g. no TRANSPOSE. `reference=reference_run` compares with
  onnx.reference instead of onnxruntime.
- `check_both_layouts(variants, x)`: an op whose axes must be remapped, checked on an input
  in ONNX order and on one the plan keeps channel-last.
- `check_model(model, feeds)`: a model built elsewhere (`make_model`, tests/models.py, a
  torch export, `onnx.load` of a file); converter options pass through as keyword args.
- `check_with_reference(model, feeds)`: like check_model, against
  onnx.reference.ReferenceEvaluator, for ops onnxruntime has no kernel for.

Building blocks, for what the checks do not cover:

- `node` (onnx.helper.make_node; one output may be given by its name), `make_model` (a
  checked model whose output types come from inference), `ints` (an int64 vector),
  `label` (an output name that says the attributes of its case).
- `ort_run` / `reference_run` (expected values), `convert`, `tf_run` / `tflite_run`
  (converted outputs, in ONNX order; `to_physical` / `to_logical` map between layouts).
- `assert_close` (the tolerance rule), `count_tflite_ops` and `assert_builtin` (what the
  .tflite holds), `assert_keras_reloads` (the saved .h5 and .keras files).
- Test data: `rng = Rng(seed)` once per module, a numpy Generator (the numbers of
  `np.random.default_rng(seed)`) with `rng.randn(*shape)` for float32 inputs. Keep a test's
  seed as it is: its inputs, and so the values compared, depend on it.

Elsewhere: tests/models.py and tests/light_models.py hold shared small models;
tests/cli_runner.py runs the real CLI on files in a subprocess.

A typical op test:

    rng = Rng(0)

    @pytest.mark.parametrize("alpha", [0.1, 0.5])
    def test_leaky_relu(alpha):
        check_node("LeakyRelu", {"x": rng.randn(2, 3, 5, 7)}, {"alpha": alpha})
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

DEFAULT_OPSET = 18


class Rng(np.random.Generator):
    """`np.random.default_rng(seed)` (the same numbers) with shortcuts for test data."""

    def __init__(self, seed: int = 0):
        super().__init__(np.random.PCG64(seed))

    def randn(self, *shape: int, scale: float = 1.0, dtype=np.float32) -> np.ndarray:
        """Standard normal values times `scale`, cast to `dtype` (an array, also for shape ())."""
        values = self.standard_normal(shape)
        values *= scale  # in place: a 0-d array times a float would become a numpy scalar
        return values.astype(dtype)

    def conv_weights(self, out_ch: int, in_ch: int, k: int = 3) -> np.ndarray:
        """Weights of a k x k Conv, standard normal times 0.3."""
        return self.standard_normal((out_ch, in_ch, k, k)).astype(np.float32) * 0.3


def node(op_type: str, inputs: list[str], outputs: str | list[str], **attrs) -> onnx.NodeProto:
    """onnx.helper.make_node, with a single output given by its name."""
    outputs = [outputs] if isinstance(outputs, str) else outputs
    return helper.make_node(op_type, inputs, outputs, **attrs)


def ints(*values: int) -> np.ndarray:
    """An int64 vector, as shape, axes and index inputs want."""
    return np.array(values, np.int64)


def label(op_type: str, attrs: dict) -> str:
    """An output name that says the attributes, e.g. "Conv(group=2, strides=[2, 2])"."""
    return op_type + "(" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + ")"


def tensor_info(name: str, array_or_dtype, shape=None) -> onnx.ValueInfoProto:
    """A value_info of an array's dtype and shape, or of a dtype and `shape`."""
    if isinstance(array_or_dtype, np.ndarray):
        dtype, shape = array_or_dtype.dtype, array_or_dtype.shape if shape is None else shape
    else:
        dtype = np.dtype(array_or_dtype)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)


def make_model(
    nodes,
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = DEFAULT_OPSET,
    input_shapes: dict[str, list] | None = None,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """A checked model whose output types and shapes come from inference (or onnxruntime)."""
    input_shapes = input_shapes or {}
    graph = helper.make_graph(
        list(nodes),
        "test",
        [tensor_info(n, a, input_shapes.get(n)) for n, a in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in inferred.graph.value_info}
    known.update({v.name: v for v in inferred.graph.output})
    missing = [o for o in outputs if not _has_full_type(known.get(o))]
    if missing:
        del model.graph.output[:]
        model.graph.output.extend(_element_type_only(o, known.get(o)) for o in outputs)
        results = ort_run(model, inputs, check=False)
        typed = []
        for o, r in zip(outputs, results):
            info = known.get(o)
            typed.append(info if _has_full_type(info) and o not in missing else tensor_info(o, r))
        del model.graph.output[:]
        model.graph.output.extend(typed)
    else:
        del model.graph.output[:]
        model.graph.output.extend(known[o] for o in outputs)
    onnx.checker.check_model(model)
    return model


def _element_type_only(name: str, info):
    """An output's inferred element type without its shape (float32 where not inferred),
    for onnxruntime to give it its shape."""
    if info is not None and info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
        return helper.make_tensor_value_info(name, info.type.tensor_type.elem_type, None)
    return tensor_info(name, np.float32)


def _has_full_type(info) -> bool:
    return (
        info is not None
        and info.type.HasField("tensor_type")
        and info.type.tensor_type.elem_type != 0
        and info.type.tensor_type.HasField("shape")
    )


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], check: bool = True):
    """The outputs of onnxruntime (CPU, graph optimizations off), in graph output order."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: feeds[n] for n in names})


def convert(model: onnx.ModelProto, **kwargs):
    """The in-memory conversion (onnx2tf_alt.pipeline.build); kwargs are converter options."""
    from onnx2tf_alt.pipeline import build

    return build(onnx_graph=model, **kwargs)


def to_physical(converted, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX-order feeds in the layout the converted model takes them."""
    return converted.result.to_physical(feeds)


def to_logical(converted, outputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model outputs in ONNX order and layout, as a list in graph output order."""
    values = converted.result.to_onnx(outputs)
    return [values[name] for name in converted.graph.outputs]


def tf_run(converted, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The TF model's outputs for ONNX-order feeds, in ONNX order and layout."""
    outputs = converted.result.model(
        [to_physical(converted, feeds)[converted.result.input_names[n]]
         for n in converted.graph.inputs],
        training=False,
    )
    return to_logical(converted, {k: v.numpy() for k, v in outputs.items()})


# Ops whose outputs differ between runs by design (Dropout: in training mode).
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Bernoulli", "Multinomial", "Dropout"}


def tflite_run(converted, feeds: dict[str, np.ndarray],
               tflite_model: bytes | None = None) -> list[np.ndarray]:
    """The float32 TFLite model's outputs (of `tflite_model` if given), in ONNX order and
    layout; run twice to check that no state carries over between invocations."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.lowering import tflite_bytes
    from onnx2tf_alt.tflite.run import run_signature

    content = tflite_model or tflite_bytes(converted.tflite_result())
    interpreter = Interpreter(model_content=content)
    physical = to_physical(converted, feeds)
    outputs = run_signature(interpreter, physical)
    if any(n.op_type in RANDOM_OPS for n in converted.graph.nodes):
        return to_logical(converted, outputs)
    # a file must not carry state from one invocation to the next (TFLite variables)
    again = run_signature(interpreter, physical)
    for key, value in outputs.items():
        assert np.array_equal(value, again[key], equal_nan=value.dtype.kind in "fc"), (
            f"TFLite output {key} changed between two invocations on the same input")
    return to_logical(converted, outputs)


def assert_close(actual, expected, tol: float = 1e-4, what: str = ""):
    """max|err| <= tol * max(1, max|ref|) for floats; exact for integers and bools."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "fc":
        finite = np.isfinite(expected)
        assert np.array_equal(np.isfinite(actual), finite), f"{what}: non-finite mismatch"
        if finite.any():
            ref = np.abs(expected[finite]).max()
            err = np.abs(actual[finite].astype(np.float64) - expected[finite]).max()
            assert err <= tol * max(1.0, ref), f"{what}: max|err| {err:.3g} (ref max {ref:.3g})"
        nan = np.isnan(expected)
        assert np.array_equal(np.isnan(actual), nan), f"{what}: NaN mismatch"
        assert np.array_equal(actual[~finite & ~nan], expected[~finite & ~nan]), f"{what}: inf"
    else:
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def check_model(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    tol: float = 1e-4,
    tflite: bool = True,
    tflite_tol: float | None = None,
    **convert_kwargs,
):
    """Convert and compare with onnxruntime through the TF model and the float32 TFLite.

    Returns the conversion; with `tflite`, its float32 flatbuffer is in `.tflite`.
    """
    expected = ort_run(model, feeds)
    converted = convert(model, **convert_kwargs)
    for i, (a, e) in enumerate(zip(tf_run(converted, feeds), expected)):
        assert_close(a, e, tol, f"TF output {i}")
    if tflite:
        from onnx2tf_alt.tflite.lowering import tflite_bytes

        converted.tflite = tflite_bytes(converted.tflite_result())
        outputs = tflite_run(converted, feeds, converted.tflite)
        for i, (a, e) in enumerate(zip(outputs, expected)):
            assert_close(a, e, tflite_tol or tol, f"TFLite output {i}")
    return converted


def check_node(
    op_type: str,
    inputs: dict[str, np.ndarray],
    attrs: dict | None = None,
    initializers: dict[str, np.ndarray] | None = None,
    num_outputs: int = 1,
    opset: int = DEFAULT_OPSET,
    domain: str = "",
    input_shapes: dict[str, list] | None = None,
    **check_kwargs,
):
    """One node with runtime `inputs` and constant `initializers`, in the node's input order
    given by dict order (inputs first, then initializers unless `input_order` is given)."""
    order = check_kwargs.pop("input_order", None) or [*inputs, *(initializers or {})]
    outputs = [f"out{i}" for i in range(num_outputs)]
    single = helper.make_node(op_type, order, outputs, domain=domain or None, **(attrs or {}))
    extra = {domain: 1} if domain else None
    model = make_model([single], inputs, outputs, initializers, opset, input_shapes, extra)
    return check_model(model, inputs, **check_kwargs)


def count_tflite_ops(content: bytes) -> dict[str, int]:
    """Census of builtin operator names in a .tflite flatbuffer."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    counts: dict[str, int] = {}
    for op in interpreter._get_ops_details():
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return counts


def assert_builtin(census: dict[str, int], transpose_free: bool = False) -> None:
    """No Flex (Select TF) op in a census of TFLite ops; with `transpose_free`, no TRANSPOSE."""
    assert not any(name.startswith("Flex") for name in census), census
    if transpose_free:
        assert "TRANSPOSE" not in census, census


def check_nodes(
    nodes,
    inputs: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = DEFAULT_OPSET,
    outputs: list[str] | None = None,
    tol: float = 1e-4,
    tflite: bool = True,
    reference=ort_run,
    input_shapes: dict[str, list] | None = None,
    **convert_kwargs,
):
    """Several nodes in one model, checked in one conversion (TF and float32 TFLite)
    against `reference(model, feeds)` (onnxruntime, or `reference_run`).

    Every node output is a graph output unless `outputs` names them; a failure names the
    output; `input_shapes` declares inputs with symbolic dims. Returns (converted, census of
    TFLite builtin ops or None).
    """
    nodes = list(nodes)
    outputs = outputs or [o for n in nodes for o in n.output if o]
    model = make_model(nodes, inputs, outputs, initializers, opset, input_shapes)
    expected = reference(model, inputs)
    converted = convert(model, **convert_kwargs)
    for name, a, e in zip(outputs, tf_run(converted, inputs), expected):
        assert_close(a, e, tol, f"TF {name}")
    census = None
    if tflite:
        from onnx2tf_alt.tflite.lowering import tflite_bytes

        content = tflite_bytes(converted.tflite_result())
        for name, a, e in zip(outputs, tflite_run(converted, inputs, content), expected):
            assert_close(a, e, tol, f"TFLite {name}")
        census = count_tflite_ops(content)
    return converted, census


def check_both_layouts(
    variants,
    x: np.ndarray,
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = DEFAULT_OPSET,
    input_shape: list | None = None,
    **check_kwargs,
):
    """Check the nodes `variants(src)` on two sources in one conversion: the model input
    `x` kept in ONNX order, and `xc`, an identity 1x1 Conv of x that the plan keeps
    channel-last, so that the op's axis remapping is exercised as well.

    `variants(src)` returns nodes reading `src`; their outputs must embed `src` in their
    names to be unique. `input_shape` may make dims of x symbolic (e.g. ["N", 3, 5, 7]).
    x must be float, of rank 3 to 5.
    """
    channels = x.shape[1]
    eye = np.eye(channels, dtype=x.dtype).reshape((channels, channels) + (1,) * (x.ndim - 2))
    initializers = {**(initializers or {}), "w_identity_conv": eye}
    nodes = [
        helper.make_node("Conv", ["x", "w_identity_conv"], ["xc"]),
        *variants("x"),
        *variants("xc"),
    ]
    outputs = [o for n in nodes[1:] for o in n.output if o]
    shapes = {"x": input_shape} if input_shape else None
    model = make_model(nodes, {"x": x}, outputs, initializers, opset, shapes)
    converted = check_model(
        model, {"x": x}, keep_ncw_or_nchw_or_ncdhw_input_names=["x"], **check_kwargs
    )
    assert converted.plan.perms["xc"] != converted.plan.perms["x"], "xc is not channel-last"
    return converted


def assert_keras_reloads(converted, feeds: dict[str, np.ndarray], folder) -> None:
    """The Keras model saved as .h5 and as .keras reloads and computes the same outputs."""
    import os

    import tf_keras

    from onnx2tf_alt.export.keras_files import save_h5, save_keras_v3

    physical = to_physical(converted, feeds)
    inputs = [physical[converted.result.input_names[n]] for n in converted.graph.inputs]
    expected = {k: v.numpy() for k, v in converted.result.model(inputs).items()}
    for suffix, save in (("h5", save_h5), ("keras", save_keras_v3)):
        path = os.path.join(str(folder), f"reload.{suffix}")
        save(converted.result, path)
        outputs = tf_keras.models.load_model(path)(inputs)
        for name, value in expected.items():
            np.testing.assert_array_equal(outputs[name].numpy(), value, err_msg=f"{suffix} {name}")


def reference_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    """The outputs of onnx.reference.ReferenceEvaluator: the spec in numpy, the same on
    every CPU (onnxruntime's integer kernels are not: see tests/ops/test_quant.py)."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def check_with_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                         tol: float = 1e-4):
    """check_model, but against onnx.reference.ReferenceEvaluator, for ops onnxruntime has
    no kernel for; returns the conversion, its float32 flatbuffer in `.tflite`."""
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    expected = reference_run(model, feeds)
    converted = convert(model)
    for i, (a, e) in enumerate(zip(tf_run(converted, feeds), expected)):
        assert_close(a, e, tol, f"TF output {i}")
    converted.tflite = tflite_bytes(converted.tflite_result())
    for i, (a, e) in enumerate(zip(tflite_run(converted, feeds, converted.tflite), expected)):
        assert_close(a, e, tol, f"TFLite output {i}")
    return converted


def both_routes(model, feeds: dict[str, np.ndarray], tol: float = 1e-5):
    """The direct file checked against onnxruntime and against the TF route's file of the
    same plan (outputs within 1e-6 relative, no more ops or transposes: TF's converter writes
a dilated depthwise conv as SPACE_TO_BATCH_ND, the conv, BATCH_TO_SPACE_ND and an ADD of
the bias, the direct writer one DEPTHWISE_CONV_2D), its tensor names unique in each
subgraph; returns the direct result."""
    from dataclasses import replace

    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded, translate
    from onnx2tf_alt.tflite.direct import DirectResult, write_direct
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    expected = ort_run(model, feeds)
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, DirectResult), str(result)
    converted = translate(planned)
    direct = replace(converted, result=result, _tflite_result=result)
    got = tflite_run(direct, feeds, result.content)
    for i, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, tol, f"direct output {i}")
    content = tflite_bytes(converted.tflite_result())
    for i, (a, e) in enumerate(zip(got, tflite_run(converted, feeds, content))):
        assert_close(a, e, 1e-6, f"direct against TF route, output {i}")
    ours, theirs = count_tflite_ops(result.content), count_tflite_ops(content)
    assert sum(ours.values()) <= sum(theirs.values()), (ours, theirs)
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    for graph in unpack_model(result.content).subgraphs:  # tools edit files by name
        names = [t.name for t in graph.tensors]
        assert len(set(names)) == len(names), f"tensor names repeat in {graph.name}"
    assert ours.get("TRANSPOSE", 0) <= theirs.get("TRANSPOSE", 0)
    return result
