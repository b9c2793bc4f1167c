"""The converted Keras model as a serving function and as a .tflite flatbuffer in memory:
what export/ writes into files and check/ runs."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from onnx2tf_alt.tflite.finish import Finish
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, pack_model, unpack_model
from onnx2tf_alt.tflite.late_weights import Bound, Signature, Unbindable, bind
from onnx2tf_alt.tflite.saved_model_reader import saved_functions, saved_model_converter
from onnx2tf_alt.tflite.shared_weights import fold_runtime_biases, fold_runtime_biases_model
from onnx2tf_alt.translate.builder import BuildResult
from onnx2tf_alt.translate.keras_layers import LATE_VALUES, ConstantWeights, weight_view
from onnx2tf_alt.translate.node_layer import derived_weights, serving_weights

# ConstantWeights of at least this many elements are bound after conversion
# (tflite/late_weights.py); smaller ones the converter sees as constants, as before.
LATE_ELEMENTS = 1 << 14
LATE_PREFIX = "onnx2tf_alt_weight_"
FROZEN_BYTES = 128 << 20  # bound weights up to which the frozen route is taken
FINISH_BYTES = 1 << 30  # weights up to which TF's last passes are ours (_finish_for)

log = logging.getLogger("onnx2tf_alt")


def signature_function(model, input_names, late: dict[str, object] | None = None,
                       name: str = "serve"):
    """A tf.function over a Keras model with dict outputs: inputs named `input_names` (in
    model.inputs order), outputs named by the model's output keys; with `late` ({input
    name: ConstantWeights layer}) each of those layers' values is one more input. `name` is
    the signature key TF's converter gives it when it converts several functions."""
    late = late or {}
    specs = [
        tf.TensorSpec(t.shape, t.dtype, name=name) for t, name in zip(model.inputs, input_names)
    ]
    specs += [tf.TensorSpec(layer.value_shape, layer.value_dtype, name=name)
              for name, layer in late.items()]

    def serve(*args):
        LATE_VALUES.update({id(layer): a for layer, a in zip(late.values(),
                                                              args[len(input_names):])})
        try:
            outputs = model(list(args[:len(input_names)]), training=False)
        finally:
            LATE_VALUES.clear()
        return {name: tf.identity(value) for name, value in outputs.items()}

    serve.__name__ = name
    # No autograph: the model's layers were traced already and `serve` has no control
    # flow; its AST transformation alone is 0.1 s of a small model's conversion.
    return tf.function(serve, input_signature=specs, autograph=False)


def serving_function(result: BuildResult):
    """The converted model's signature: ONNX-derived input and output names."""
    return signature_function(result.model, list(result.input_names.values()))


def serving_module(result: BuildResult) -> tf.Module:
    """A light trackable holding the weights and the serving function. Saving or converting
    it skips serializing every Keras layer (the cost of passing the Keras model itself: a
    minute for ViT-B/16); the signature and the variables are the same."""
    holder = tf.Module()
    holder.weights = serving_weights(result.model)
    holder.serve = serving_function(result)
    return holder


def late_layers(model) -> list:
    """The ConstantWeights layers of `model` bound after conversion."""
    layers = [layer for layer in model.layers if isinstance(layer, ConstantWeights)]
    return [layer for layer in layers + derived_weights(model)
            if layer.value_dtype != "bool"
            and int(np.prod(layer.value_shape, dtype=np.int64)) >= LATE_ELEMENTS]


def late_bound(result: BuildResult, select_tf_ops: bool = True) -> Bound | None:
    """The float32 .tflite with its large weights bound after conversion
    (tflite/late_weights.py), or None where that does not apply: no large weight, or an op
    on weights alone that late_weights.py does not compute (said at -v info)."""
    return late_bound_signatures({SIGNATURE: result}, select_tf_ops)


def late_bound_signatures(results: dict[str, BuildResult],
                          select_tf_ops: bool = True) -> Bound | None:
    """`late_bound` for one file with a signature per entry of `results` ({signature key:
    the model built for its input shapes}): a weight equal in several of them is one input
    name, so one buffer (late_weights.Bound.buffer_of) serves every signature."""
    sources: dict[str, tuple] = {}
    by_content: dict[tuple, list[str]] = {}
    functions, kept_weights, restore = [], [], {}
    holder = tf.Module()  # TF's converter saves it: the bound weights are not its own
    for key, result in results.items():
        layers = late_layers(result.model)
        if not layers:
            return None
        inputs = list(result.input_names.values())
        late: dict[str, object] = {}
        for layer in layers:
            name = _shared_name(layer, sources, by_content, set(late) | set(inputs))
            late[name] = layer
        late_refs = {layer.value.ref() for layer in layers}
        kept_weights += [w for w in serving_weights(result.model) if w.ref() not in late_refs]
        serve = signature_function(result.model, inputs, late, name=key)
        setattr(holder, f"signature_{len(functions)}", serve)
        functions.append(serve.get_concrete_function())
        signature = Signature.of(functions[-1], key, inputs + list(late), result.output_keys)
        dropped = _activation_after_product(functions[-1], set(late), restore)
        if dropped:
            log.info("the .tflite weights are converted by TF's converter: %s", dropped)
            return None
    holder.weights = kept_weights
    # One function with one output converts from its frozen graph (`bind` writes the
    # signature TF's saved_model route would). Several functions need that route, which
    # writes a signature for each; so do several outputs, whose order in the subgraph that
    # route decides (not the keys' order, nor the model's: ssdlite's is labels, boxes,
    # scores), as does its RESHAPE clean-up (ssdlite: 226 RESHAPE against 136 frozen).
    # TF's frozen route is faster (its tflite float32 phase: efficientnet_v2_s 4.1 -> 2.2 s,
    # convnext_tiny 3.6 -> 2.4 s, vit_b_16 4.4 -> 3.2 s) but some models keep memory about
    # their weights' size past it in TF's own allocations (after the phase: alexnet +245 MB,
    # vit_b_16 +246 MB, vgg19 +548 MB, 3509 MB peak against 2955; efficientnet_v2_s and
    # convnext_tiny none), so it is taken for models of up to FROZEN_BYTES of bound weights.
    weights = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                  for shape, dtype, _ in sources.values())
    frozen = len(functions) == 1 and len(signature.outputs) == 1 and weights <= FROZEN_BYTES
    try:
        bound = bind(_converted(functions, holder, False, select_tf_ops, frozen=frozen),
                     sources, signature if frozen else None)
    except Unbindable as exc:
        if not frozen:
            log.info("the .tflite weights are converted by TF's converter: %s", exc)
            return None
        log.info("the frozen graph's .tflite could not be bound (%s); converting through "
                 "a saved_model", exc)
        try:
            bound = bind(_converted(functions, holder, False, select_tf_ops), sources)
        except Unbindable as again:
            log.info("the .tflite weights are converted by TF's converter: %s", again)
            return None
    _key_single_signature(bound.model, results)
    missing = _restore_activations(bound.model, restore)
    if missing:
        log.info("the .tflite weights are converted by TF's converter: the activation of "
                 "%s was not found on a FULLY_CONNECTED", missing)
        return None
    fold_runtime_biases_model(bound.model)
    return bound


PRODUCTS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}
FUSED_BY_THE_CONVERTER = {"Relu", "Relu6", "Maximum", "Minimum"}


BIAS_ADDS = {"Add", "AddV2", "BiasAdd"}
RESTORED = {"Relu": "RELU", "Relu6": "RELU6"}


def _activation_after_product(concrete, late: set[str], restore: dict[str, str]) -> str | None:
    """Why the weights cannot be inputs for TF's converter here, or None. It fuses a Relu,
    Relu6 or clip after a rank-2 product into a FULLY_CONNECTED, and when the product's
    weight is not a constant (an input, as here) rewrites that into a BATCH_MATMUL that
    drops the activation (measured on TF 2.21: MatMul -> Relu gave max|err| 44). After a
    bias add (Gemm's) it writes a FULLY_CONNECTED without its activation, its output tensor
    still named after the Relu (vgg11_bn: max|err| 0.85): those Relu / Relu6 go into
    `restore` (TF op name -> the activation `_restore_activations` gives back); a clip
    there is a reason."""
    def through_identities(op):
        while op.type == "Identity":
            op = op.inputs[0].op
        return op

    def readers(tensor):
        for op in tensor.consumers():
            if op.type == "Identity":
                yield from readers(op.outputs[0])
            else:
                yield op

    for op in concrete.graph.get_operations():
        if op.type not in PRODUCTS or op.outputs[0].shape.rank != 2:
            continue
        if not any(through_identities(t.op).type == "Placeholder"
                   and through_identities(t.op).name in late for t in op.inputs[:2]):
            continue
        fused = [r.type for r in readers(op.outputs[0]) if r.type in FUSED_BY_THE_CONVERTER]
        if fused:
            return (f"a rank-2 {op.type} of a weight is followed by {fused[0]}, which TF's "
                    "converter drops when the weight is an input")
        for add in readers(op.outputs[0]):
            if add.type not in BIAS_ADDS:
                continue
            for after in readers(add.outputs[0]):
                if after.type in RESTORED:
                    restore[after.name] = RESTORED[after.type]
                elif after.type in FUSED_BY_THE_CONVERTER:
                    return (f"a rank-2 {op.type} of a weight and a bias add are followed by "
                            f"{after.type}, which TF's converter drops when the weight is an "
                            "input")
    return None


def _restore_activations(model, restore: dict[str, str]) -> list[str]:
    """Each FULLY_CONNECTED without activation whose output tensor TF named after a Relu of
    `restore` gets that activation back; returns the Relu names no op output carries (an
    op other than FULLY_CONNECTED named after one computes it: a RELU the converter kept)."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, schema

    found = set()
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            parts = subgraph.tensors[op.outputs[0]].name.decode().split(";")
            names = [p for p in parts if p in restore]
            if not names:
                continue
            found.update(names)
            if op_name(model, op) == "FULLY_CONNECTED" and not (
                    op.builtinOptions.fusedActivationFunction):
                op.builtinOptions.fusedActivationFunction = getattr(
                    schema.ActivationFunctionType, restore[names[0]])
    return sorted(set(restore) - found)


def signatures_bytes(results: dict[str, BuildResult], select_tf_ops: bool = True) -> bytes:
    """One .tflite with a signature per entry of `results`, converted by TF's converter with
    the weights in it (each signature its own copy): for models with no weight large
    enough to bind (late_bound_signatures)."""
    holder = tf.Module()
    holder.weights = [w for result in results.values() for w in serving_weights(result.model)]
    functions = []
    for key, result in results.items():
        serve = signature_function(result.model, list(result.input_names.values()), name=key)
        setattr(holder, f"signature_{len(functions)}", serve)
        functions.append(serve.get_concrete_function())
    content = fold_runtime_biases(_converted(functions, holder, False, select_tf_ops))
    if len(results) == 1:
        model = unpack_model(content)
        _key_single_signature(model, results)
        content = pack_model(model, len(content) + 1024)
    return content


def _key_single_signature(model, results: dict) -> None:
    """TF's converter keys the signature of a single function `serving_default`: give it
    the key asked for (--signature decode ...)."""
    if len(results) == 1 and len(model.signatureDefs) == 1:
        model.signatureDefs[0].signatureKey = next(iter(results)).encode()


def _shared_name(layer, sources: dict, by_content: dict, taken: set[str]) -> str:
    """The input name of `layer`'s value: that of an equal weight seen before (in another
    signature) unless `taken`, else a new one recorded in `sources` / `by_content`."""
    read = _reader(layer.value)
    value = read()
    sample = value.reshape(-1)[:: max(1, value.size // 4096)]
    key = (value.shape, value.dtype.str, sample.tobytes())
    for name in by_content.get(key, []):
        if name not in taken and np.array_equal(sources[name][2](), value):
            return name
    name = next(f"{LATE_PREFIX}{k}" for k in range(len(sources) + len(taken) + 1)
                if f"{LATE_PREFIX}{k}" not in sources and f"{LATE_PREFIX}{k}" not in taken)
    sources[name] = (layer.value_shape, layer.value_dtype, read)
    by_content.setdefault(key, []).append(name)
    return name


def _reader(variable):
    """A bound weight's source (late_weights.bind): a read-only view of the variable's
    memory. A copy would hold a transposed weight twice."""
    return lambda: weight_view(variable)


@dataclass
class Flat:
    """A .tflite flatbuffer and, where its making unpacked it, its unpacked model
    (schema.ModelT, the same content), for readers that would unpack it again."""
    content: bytes
    model: object | None = None


def tflite_bytes(result: BuildResult, float16: bool = False, select_tf_ops: bool = True,
                 saved_model: str | None = None, late: bool = True) -> bytes:
    """The model as a .tflite flatbuffer with a `serving_default` signature.

    TFLite builtins only; when the graph needs ops TFLite lacks, Select TF ops are allowed
    with a warning (the file then needs the Flex delegate) unless `select_tf_ops` is False.
    Run-time biases of FULLY_CONNECTED ops that share weights are folded (shared_weights.py).
    `saved_model`: the folder where `result` was saved (export/saved_model.py); the converter
    reads it instead of tracing the serving function and saving it once more to a temporary
    folder, which is what converting a concrete function does (with export/float16.py, the
    CLI converts an unrolled 2-layer bidirectional LSTM in 22 s instead of 38 s). Should
    that fail, the serving function is converted as before. A float32 file has its large
    weights bound after conversion (late_bound) unless `late` is False.
    """
    return tflite_flat(result, float16, select_tf_ops, saved_model, late).content


def tflite_flat(result: BuildResult, float16: bool = False, select_tf_ops: bool = True,
                saved_model: str | None = None, late: bool = True) -> Flat:
    """tflite_bytes, with the unpacked model where one was made on the way."""
    if late and not float16:
        bound = late_bound(result, select_tf_ops)
        if bound is not None:
            return Flat(bound.to_bytes())
    if saved_model is not None:
        try:
            return _tflite_flat(result, float16, select_tf_ops, saved_model)
        except Exception as exc:  # noqa: BLE001 - the traced function is the reference path
            message = str(exc).strip().splitlines()
            log.info("converting the saved_model to .tflite failed (%s); converting the "
                     "serving function instead", message[-1] if message else type(exc).__name__)
    return _tflite_flat(result, float16, select_tf_ops, None)


def _tflite_flat(result: BuildResult, float16: bool, select_tf_ops: bool,
                 saved_model: str | None) -> Flat:
    if saved_model is not None:
        if float16:
            return Flat(fold_runtime_biases(_converted(saved_model, None, True, select_tf_ops)))
        finish = _finish_for(result)
        content = _converted(saved_model, None, False, select_tf_ops, finish=finish)
        return _folded(finish.model(content), len(content))
    holder = serving_module(result)
    concrete = holder.serve.get_concrete_function()
    signature = Signature.of(concrete, SIGNATURE, list(result.input_names.values()),
                             result.output_keys)
    if float16:
        return Flat(fold_runtime_biases(_converted(concrete, holder, True, select_tf_ops)))
    if len(signature.outputs) == 1:  # see late_bound_signatures
        finish = _finish_for(result)
        content = _converted(concrete, holder, False, select_tf_ops, frozen=True,
                             finish=finish)
        try:
            model = finish.model(content)
            signature.write(model)  # the signature TF's saved_model route would give it
            return _folded(model, len(content))
        except Unbindable as exc:
            log.info("the frozen graph's .tflite could not be signed (%s); converting "
                     "through a saved_model", exc)
    finish = _finish_for(result)
    content = _converted(concrete, holder, False, select_tf_ops, finish=finish)
    return _folded(finish.model(content), len(content))


def _finish_for(result: BuildResult) -> Finish:
    """TF's last passes done on our unpacked model (tflite/finish.py) for a model of up to
    FINISH_BYTES of weights; a larger one keeps TF's own: its file may pass flatbuffers'
    2 GB, which TF then writes with its buffers after the flatbuffer, as before."""
    weights = sum(int(np.prod(w.shape, dtype=np.int64)) * w.dtype.size
                  for w in serving_weights(result.model))
    return Finish() if weights <= FINISH_BYTES else Finish(enabled=False)


def _folded(model, size: int) -> Flat:
    """The unpacked float32 `model` with its run-time biases folded (fold_runtime_biases),
    packed; `size`: about its bytes."""
    fold_runtime_biases_model(model)
    return Flat(pack_model(model, size + 4096), model)


def _converted(source, holder, float16: bool, select_tf_ops: bool,
               frozen: bool = False, finish: Finish | None = None) -> bytes:
    """TF's converter on a saved_model folder (`source`, `holder` None) or concrete
    functions of `holder` (one, or a list: a signature each): builtins only, else with
    Select TF ops (a warning) unless `select_tf_ops` is False. `frozen` (one function):
    from its frozen graph, a file with no signature, instead of from the temporary
    saved_model TF otherwise saves and reads back (efficientnet_b0's weightless function:
    0.50 s against 1.36 s; mobilenet_v2 0.26 against 0.82). `finish`: TF's last passes
    are left to it (tflite/finish.py); the caller unpacks the result with `finish.model`."""
    functions = source if isinstance(source, list) else [source]
    with ExitStack() as stack:
        keys = [SIGNATURE]
        if holder is not None and not frozen:  # what TF's converter would save first
            source, keys = stack.enter_context(saved_functions(functions, holder))

        def converter(select_tf_ops: bool):
            if holder is None or not frozen:
                conv = saved_model_converter(source, keys, functions=holder is not None)
            else:
                conv = tf.lite.TFLiteConverter.from_concrete_functions(functions, holder)
                conv.experimental_lower_to_saved_model = False
            ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            if select_tf_ops:
                ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
            conv.target_spec.supported_ops = ops
            if float16:
                conv.optimizations = [tf.lite.Optimize.DEFAULT]
                conv.target_spec.supported_types = [tf.float16]
            if finish is not None:
                finish.prepare(conv)
            return conv

        try:
            content = converter(select_tf_ops=False).convert()
        except Exception as exc:  # retried with TF ops (unless not allowed), then reported
            if not select_tf_ops:
                raise
            message = str(exc).strip().splitlines()
            log.warning(
                "TFLite builtins cannot express this model (%s); using Select TF ops, which "
                "need the Flex delegate at run time",
                message[-1] if message else type(exc).__name__,
            )
            content = converter(select_tf_ops=True).convert()
    return content
