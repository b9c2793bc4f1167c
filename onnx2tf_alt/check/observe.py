"""Read values out of each runtime: onnxruntime (the reference), the Keras model and a
debugging float32 TFLite whose signature returns the values under test.

Converted values come back in ONNX order, through the perm the converter gave each one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.weights import ort_options, to_array
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.tflite.run import run_signature

log = logging.getLogger("onnx2tf_alt")


@dataclass
class Target:
    """One ONNX value under test and where the converted model holds it."""

    onnx_name: str
    node_name: str
    op_type: str
    perm: tuple
    tensor: object = None  # KerasTensor in `perm`, or None when `const` holds the value
    const: np.ndarray | None = None  # known at conversion time (ONNX order)


def targets(converted, full: bool) -> list[Target]:
    """Every node output in topological order (`full`) or just the model outputs.

    Model outputs are read from the model's own output tensors (in their output perm), so
    a final relayout is checked too. A direct conversion (no Keras model) has no tensors:
    its targets carry the plan's perms, for the direct writer's files.
    """
    result, graph = converted.result, converted.graph
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    keras = result.model is not None  # else a direct conversion: values by the plan's perms
    if full:
        computed = result.values if keras else converted.plan.perms
        names = [o for n in graph.nodes for o in n.outputs if o and o in computed]
        names += [o for o in graph.outputs if o not in producers]
    else:
        names = list(graph.outputs)
    found = []
    for name in dict.fromkeys(names):
        node = producers.get(name)
        node_name, op_type = (node.name, node.op_type) if node else ("(graph output)", "")
        if not keras:
            perm = result.output_perms.get(name) or converted.plan.perms[name]
            found.append(Target(name, node_name, op_type, tuple(perm)))
            continue
        if name in result.output_names:
            tensor = result.model.output[result.output_names[name]]
            found.append(Target(name, node_name, op_type, result.output_perms[name], tensor))
            continue
        value = result.values[name]
        if value.const is not None:
            found.append(Target(name, node_name, op_type, value.perm, const=value.const))
        elif hasattr(value.tensor, "numpy"):  # an eager constant a handler returned
            const = np.transpose(value.tensor.numpy(), np.argsort(value.perm))
            found.append(Target(name, node_name, op_type, value.perm, const=const))
        else:
            found.append(Target(name, node_name, op_type, value.perm, value.tensor))
    return found


# --- onnxruntime ------------------------------------------------------------------------
def ort_session(model: onnx.ModelProto, expose: list[str]):
    """An onnxruntime session of `model` whose outputs are `expose` (any computed values);
    the QDQ pairs the converter fused (passes/qdq_pairs.py) run as the pairs they were."""
    import onnxruntime as ort

    from onnx2tf_alt.passes.qdq_pairs import unfused_quant_pairs

    exposed = unfused_quant_pairs(model)  # a copy where it has pairs
    if exposed is model:
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
    infos = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    del exposed.graph.output[:]
    exposed.graph.output.extend(
        infos.get(name) or helper.make_value_info(name, onnx.TypeProto()) for name in expose
    )
    options = ort_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    # onnxruntime's own warnings (e.g. execution providers) go to its default logger; they
    # are for debugging only (-v debug)
    ort.set_default_logger_severity(
        2 if logging.getLogger("onnx2tf_alt").isEnabledFor(logging.DEBUG) else 3)
    return ort.InferenceSession(
        exposed.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def ort_values(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]
) -> dict[str, np.ndarray]:
    """Values `names` as onnxruntime computes them; graph inputs and initializers are
    returned as they are."""
    known = {i.name: to_array(i) for i in model.graph.initializer}
    known.update(feeds)
    computed = [n for n in dict.fromkeys(names) if n not in known]
    values = {n: known[n] for n in names if n in known}
    if computed:
        session = ort_session(model, computed)
        wanted = {i.name for i in session.get_inputs()}
        outputs = session.run(computed, {n: v for n, v in feeds.items() if n in wanted})
        values.update(zip(computed, outputs))
    return values


# --- Keras ---------------------------------------------------------------------------------
def tf_values(converted, found: list[Target], feeds: dict[str, np.ndarray],
              failures: dict[str, str] | None = None) -> dict:
    """Each target's value from one run of a Keras model exposing all of them (ONNX order).

    When that run raises (e.g. a gather index out of range), the first target whose
    computation raises is found by bisection over the targets in ONNX order; the values
    before it are returned and `failures` gets {its ONNX name: the error}, so the report
    names the op that went wrong instead of failing as a whole."""
    import tensorflow as tf
    import tf_keras

    model = converted.result.model
    inputs = list(converted.result.to_physical(feeds).values())
    tensors = list(_distinct_tensors(found).items())
    values = {t.onnx_name: t.const for t in found if t.const is not None}

    def run(count: int) -> dict:
        outputs = [_detached(t, model.inputs, tf) for _, t in tensors[:count]]
        arrays = tf_keras.Model(inputs=model.inputs, outputs=outputs)(inputs, training=False)
        arrays = arrays if isinstance(arrays, (list, tuple)) else [arrays]
        return {key: np.asarray(a) for (key, _), a in zip(tensors, arrays)}

    if not tensors:
        return values
    try:
        by_id = run(len(tensors))
    except Exception as exc:  # located below, then reported per value
        if failures is None:
            raise
        by_id, first_bad, error = _first_failing_prefix(run, len(tensors), exc)
        bad = tensors[first_bad - 1][0]
        for t in found:
            if t.const is None and id(t.tensor) == bad:
                failures[t.onnx_name] = f"TF raised: {_last_line(error)}"
    for t in found:
        if t.const is None and id(t.tensor) in by_id:
            values[t.onnx_name] = P.to_onnx_order(by_id[id(t.tensor)], t.perm)
    return values


def _first_failing_prefix(run, count: int, error: Exception) -> tuple[dict, int, Exception]:
    """The smallest k such that run(k) raises (run(count) raised `error`), the values of
    run(k - 1) and run(k)'s error: a bisection, so about log2(count) runs of Keras probes."""
    good, good_values, bad = 0, {}, count
    while bad - good > 1:
        middle = (good + bad) // 2
        try:
            good_values, good = run(middle), middle
        except Exception as exc:  # noqa: BLE001 - the failure is what is searched for
            bad, error = middle, exc
    return good_values, bad, error


def _last_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    useful = [line for line in lines if "[Op:" in line or "indices" in line]
    return (useful or lines or [type(exc).__name__])[0][:300]


def _distinct_tensors(found: list[Target]) -> dict[int, object]:
    return {id(t.tensor): t.tensor for t in found if t.const is None}


def _detached(tensor, inputs, tf):
    """A model input cannot also be a model output; route it through an identity."""
    return tf.identity(tensor) if any(tensor is i for i in inputs) else tensor


# --- TFLite --------------------------------------------------------------------------------
def probe_conversion(converted, found: list[Target]):
    """A copy of `converted` whose model returns every non-constant target, as its outputs
    named value_<i>; `result.output_names` maps ONNX names to them, `output_perms` gives
    their perms. (Constants have no tensor and are not part of it.)"""
    import dataclasses

    import tensorflow as tf
    import tf_keras

    result = converted.result
    model = result.model
    tensors = _distinct_tensors(found)
    keys = {k: f"value_{i}" for i, k in enumerate(tensors)}
    probe = tf_keras.Model(
        inputs=model.inputs,
        outputs={keys[k]: _detached(t, model.inputs, tf) for k, t in tensors.items()},
    )
    variable = [t for t in found if t.const is None]
    probe_result = dataclasses.replace(
        result, model=probe,
        output_names={t.onnx_name: keys[id(t.tensor)] for t in variable},
        output_perms={t.onnx_name: t.perm for t in variable},
    )
    return dataclasses.replace(converted, result=probe_result, _tflite_result=None)


def debug_tflite(converted, found: list[Target]) -> tuple[bytes, dict[str, str]]:
    """A float32 .tflite whose `serving_default` signature returns every target tensor.

    Returns the flatbuffer and {ONNX value name: signature output name}. Builtins only: the
    interpreter that runs the check has no Flex delegate.
    """
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    probe = probe_conversion(converted, found).result
    return tflite_bytes(probe, select_tf_ops=False), dict(probe.output_names)


# A .tflite file larger than this is run on TFLite's reference kernels: XNNPACK would
# pack its weights once more in memory (same values, slower).
REFERENCE_KERNEL_BYTES = 1 << 30


def tflite_values(
    converted, content: bytes | str, output_keys: dict[str, str], perms: dict[str, tuple],
    feeds: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Run a .tflite's `serving_default` once (its bytes, or its path: the interpreter maps
    the file); values by ONNX name, in ONNX order."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    if isinstance(content, str):
        resolver = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                    if os.path.getsize(content) > REFERENCE_KERNEL_BYTES else OpResolverType.AUTO)
        interpreter = Interpreter(model_path=content, experimental_op_resolver_type=resolver)
    else:
        interpreter = Interpreter(model_content=content)
    outputs = run_signature(interpreter, converted.result.to_physical(feeds))
    return {
        name: P.to_onnx_order(outputs[key], perms[name])
        for name, key in output_keys.items()
        if key in outputs
    }
