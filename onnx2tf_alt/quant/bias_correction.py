"""Bias correction of the INT8 files: each convolution's bias absorbs the mean error that
8-bit activations and weights leave in its output.

Rounding an activation to a coarse grid, or clipping its rare extremes (the `percentile`
ranges), is not error-free on average: a convolution that sums many such values shifts
each output channel by a constant that the next layers carry on and add to. Here the
shift is measured and taken out of the INT8 file's int32 bias, one convolution at a time
in graph order, each measured after the ones before it were corrected (corrected all at
once they over-correct: a downstream convolution would also take out the shift an upstream
one has just removed). The reference is the calibrated float flatbuffer the file was
quantized from, whose tensors carry the same names.

The INT8 file runs piece by piece (tflite/run.segment): the convolutions that can be
measured together (a wave: none upstream of another) on the ops since the last wave, fed
the tensors the pieces before wrote; once corrected, the wave's convolutions and what
follows them in the piece run again to give the next pieces their inputs. Each op runs
about twice in all, where a cut from the inputs per wave ran the DB detector's first ops
35 times (its corrections 6.3 -> 3.3 s, the same files).

Only CONV_2D and DEPTHWISE_CONV_2D without a fused activation are corrected: behind a
fused ReLU the output's mean error is no longer the bias's. On the PP-OCRv4 DB text detector
(640x640, percentile ranges, 8 calibration samples) the 41 such convolutions lift the
held-out cosine of the INT8 file from 0.976 to 0.985 without changing an op.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import (
    SIGNATURE,
    op_name,
    read_model,
    unpack_model,
    with_buffer_data,
)
from onnx2tf_alt.tflite.run import (
    as_input,
    exposed,
    on_cores,
    segment,
    set_inputs,
    signature_inputs,
)

BIAS_SAMPLES = 8  # calibration samples the mean errors are measured on
BIAS_FOLD_BELOW = 8  # fewer unused calibration samples: the correction is judged in folds
SIGNIFICANCE = 3.0  # standard errors a channel's mean error must exceed to be corrected
CORRECTED_OPS = {3: "CONV_2D", 4: "DEPTHWISE_CONV_2D"}  # builtin operator codes
NO_ACTIVATION = 0
DEQUANTIZE = 6
FLOAT32 = 0  # schema.TensorType


def corrected_biases(int8: bytes, calibrated: bytes, feeds: list[dict[str, np.ndarray]],
                     known: dict | None = None, errors: dict | None = None
                     ) -> tuple[bytes, int]:
    """(`int8` with the bias of each convolution without fused activation corrected for the
    mean error of its output against `calibrated` on `feeds` (signature inputs, physical
    layout, float), how many were corrected). `known` (filled here) holds the corrections
    by bias name, scales and the file's float ops: a second file quantized from the same
    calibration with the same float ops (the full-integer twin) takes them without running
    anything; a file with other float ops (--keep_float_auto's trials) measures its own, as
    the error a conv's bias takes out is that of the ops before it (the detector's mixed
    file with the all-INT8 file's corrections held 0.978 on unseen samples, against 0.993
    for the all-INT8 file). `errors`
    (filled here when the corrections are measured) gets each convolution's per-sample
    channel errors and bias steps, from which `refitted` makes the file of a subset."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    model = unpack_model(int8)
    float_model = unpack_model(calibrated)  # its buffers are views of `calibrated`
    targets = _targets(model, _float_tensors(float_model))
    if not targets:
        return int8, 0
    graph = model.subgraphs[0]
    known = {} if known is None else known
    record = errors
    floats = _float_ops(model)

    def key(op_index: int) -> tuple:
        bias = graph.tensors[graph.operators[op_index].inputs[2]]
        return _text(bias.name), tuple(bias.quantization.scale), floats

    if all(key(op) in known for op in targets):
        for op in targets:
            _shift_bias(model, graph.operators[op], known[key(op)])
        return _with_biases(int8, model, targets), len(targets)
    # the float model's channel means of every target output, per sample: the float file cut
    # after the last of them, their outputs exposed (the whole file, every tensor kept, took
    # ViT-B/16's 8 samples 11.8 s for its one patch convolution), on TFLite's reference
    # kernels as before. XNNPACK's float sums differ by ~3e-5 of the means (PP-OCRv4's
    # recognizer), which moved 1,466 of its bias codes and its INT8 file's figure on
    # unseen text lines by -0.001: noise, but another file for the same input.
    twins = list(dict.fromkeys(targets.values()))  # the cut's outputs, in this order
    cut = exposed(float_model, twins, True)
    del float_model

    def reference_means(chunk: list[int]) -> list[dict]:
        reference = Interpreter(
            model_content=cut,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        outputs = [d["index"] for d in reference.get_output_details()]
        runner = reference.get_signature_runner(SIGNATURE)
        means = []
        for k in chunk:
            runner(**feeds[k])
            means.append({op: _channel_means(reference.get_tensor(outputs[twins.index(twin)]))
                          for op, twin in targets.items()})
        return means

    expected = on_cores(len(feeds), len(cut), reference_means)
    # each wave's convolutions measured on the piece of the file since the last wave, fed
    # the tensors the pieces before wrote (with their corrections), on XNNPACK
    inputs = signature_inputs(model)
    states = [{inputs[name]: value for name, value in feed.items()} for feed in feeds]
    waves = _waves(graph, sorted(targets))
    for wave, piece in zip(waves, _pieces(graph, waves)):
        ops = [graph.operators[k] for k in wave]
        _run_piece(model, piece.measured, piece.measured_outputs, states)
        for op_index, op in zip(wave, ops):
            output = graph.tensors[op.outputs[0]]
            scale, zero_point = output.quantization.scale[0], output.quantization.zeroPoint[0]
            found = np.array([
                _channel_means((state[int(op.outputs[0])].astype(np.float64) - zero_point) * scale)
                - means[op_index] for state, means in zip(states, expected)])
            steps = np.asarray(graph.tensors[op.inputs[2]].quantization.scale, np.float64)
            known[key(op_index)] = -np.round(_significant(found) / steps).astype(np.int64)
            _shift_bias(model, op, known[key(op_index)])
            if record is not None:
                record[op_index] = (found, steps)
        _run_piece(model, piece.corrected, piece.corrected_outputs, states)
        for state in states:
            for tensor in piece.done:
                state.pop(tensor, None)
    return _with_biases(int8, model, targets), len(targets)


def _waves(graph, targets: list[int]) -> list[list[int]]:
    """`targets` (op indices, in graph order) in runs that can be measured on one cut: a
    target joins the run before it unless one of that run's targets is upstream of it
    (correcting it would change what it measures). Each conv is measured after every
    correction upstream of it, as one at a time would (the same files); the parallel
    branches of a feature pyramid share a cut."""
    writer = {int(o): k for k, op in enumerate(graph.operators) for o in op.outputs}
    upstream: dict[int, set[int]] = {}
    chosen = set(targets)
    for k, op in enumerate(graph.operators):
        found: set[int] = set()
        for i in op.inputs:
            producer = writer.get(int(i))
            if producer is not None:
                found |= upstream[producer] | ({producer} & chosen)
        upstream[k] = found
    waves: list[list[int]] = []
    for target in targets:
        if waves and not upstream[target] & set(waves[-1]):
            waves[-1].append(target)
        else:
            waves.append([target])
    return waves


class _Piece(NamedTuple):
    """The ops of the file between two waves' last convolutions, run in two parts: the
    measured part (the wave's convolutions and what they and later waves read, before
    the wave is corrected) and the corrected part (the wave's convolutions again and the
    piece's ops downstream of them, after); each part's outputs are what is read outside
    it. `done`: the tensors nothing after the piece reads."""
    measured: list[int]
    measured_outputs: list[int]
    corrected: list[int]
    corrected_outputs: list[int]
    done: list[int]


def _pieces(graph, waves: list[list[int]]) -> list[_Piece]:
    """The pieces of the ops the waves' convolutions depend on, one per wave (_Piece)."""
    operators = graph.operators
    writer = {int(o): k for k, op in enumerate(operators) for o in op.outputs}
    needed, stack = set(), [k for wave in waves for k in wave]
    while stack:
        k = stack.pop()
        if k not in needed:
            needed.add(k)
            stack += [writer[int(i)] for i in operators[k].inputs if int(i) in writer]
    order = sorted(needed)
    readers: dict[int, list[int]] = {}
    for k in order:
        for i in dict.fromkeys(int(i) for i in operators[k].inputs if int(i) >= 0):
            readers.setdefault(i, []).append(k)

    def read_outside(ops: list[int]) -> list[int]:
        inside = set(ops)
        return [int(o) for k in ops for o in operators[k].outputs
                if any(r not in inside for r in readers.get(int(o), ()))]

    pieces, start = [], -1
    for wave in waves:
        end = max(wave)
        piece = [k for k in order if start < k <= end]
        downstream = set(wave)
        for k in piece:
            if any(writer.get(int(i)) in downstream for i in operators[k].inputs):
                downstream.add(k)
        measured = [k for k in piece if k not in downstream or k in wave]
        corrected = [k for k in piece if k in downstream]
        wave_outputs = [int(operators[k].outputs[0]) for k in wave]
        later = [t for t in read_outside(corrected) if max(readers[t]) > end]
        touched = {int(t) for k in piece for t in [*operators[k].inputs, *operators[k].outputs]}
        done = [t for t in touched if max(readers.get(t, [-1])) <= end]
        # the corrected part runs the wave's convolutions again: it reads their inputs
        written = {int(o) for k in measured for o in operators[k].outputs}
        again = [int(i) for k in wave for i in operators[k].inputs
                 if int(i) in written] if later else []
        outputs = [*dict.fromkeys([*wave_outputs, *read_outside(measured), *again])]
        pieces.append(_Piece(measured, outputs, corrected if later else [], later, done))
        start = end
    return pieces


def _run_piece(model, ops: list[int], outputs: list[int], states: list[dict]) -> None:
    """Run the ops `ops` of `model` on each of `states` ({tensor index: value}, one per
    sample: the values of their inputs) and add the values of `outputs` to it."""
    if not ops:
        return
    from ai_edge_litert.interpreter import Interpreter

    content, inputs = segment(model, ops, outputs)
    interpreter = Interpreter(model_content=content, num_threads=os.cpu_count() or 1)
    interpreter.allocate_tensors()
    input_details = interpreter.get_input_details()
    output_details = interpreter.get_output_details()  # in the order of `outputs`
    for state in states:
        set_inputs(interpreter, input_details,
                   [as_input(state[t], d) for t, d in zip(inputs, input_details)])
        interpreter.invoke()
        for tensor, details in zip(dict.fromkeys(outputs), output_details):
            state[tensor] = interpreter.get_tensor(details["index"])


def refitted(int8: bytes, errors: dict, rows: list[int]) -> bytes:
    """`int8` corrected as corrected_biases would on the samples `rows` of the feeds whose
    `errors` it recorded, without running anything: each convolution's errors were measured
    after the earlier ones were corrected on all the feeds, so the file is that of the
    subset to first order (what a fold of the correction's judgement needs)."""
    model = read_model(int8)
    graph = model.Subgraphs(0)
    biases = {}
    for op_index, (per_sample, steps) in errors.items():
        tensor = graph.Tensors(graph.Operators(op_index).Inputs(2))
        values = model.Buffers(tensor.Buffer()).DataAsNumpy().view(np.int32)
        shift = -np.round(_significant(per_sample[rows]) / steps).astype(np.int64)
        biases[tensor.Buffer()] = _saturated(values.astype(np.int64) + shift)
    return with_buffer_data(int8, biases)


def _significant(errors: np.ndarray) -> np.ndarray:
    """The mean over samples of `errors` (samples x channels) where it stands out of their
    spread (|mean| > SIGNIFICANCE standard errors), else 0: a shift the samples do not
    agree on is noise, and taking it out adds error."""
    if len(errors) < 2:
        return np.zeros(errors.shape[-1])
    mean = errors.mean(0)
    standard_error = errors.std(0, ddof=1) / np.sqrt(len(errors))
    return np.where(np.abs(mean) > SIGNIFICANCE * standard_error, mean, 0.0)


def _shift_bias(model, op, delta: np.ndarray) -> None:
    """Add `delta` to the int32 bias of `op`, saturating."""
    buffer = model.buffers[model.subgraphs[0].tensors[op.inputs[2]].buffer]
    values = np.frombuffer(bytes(buffer.data), np.int32).astype(np.int64) + delta
    buffer.data = _saturated(values).view(np.uint8)


def _saturated(values: np.ndarray) -> np.ndarray:
    info = np.iinfo(np.int32)
    return np.clip(values, info.min, info.max).astype(np.int32)


def _with_biases(int8: bytes, model, ops: list[int]) -> bytes:
    """`int8` with the biases of `ops` as `model` (its unpacked form) now holds them, written
    where they lie (flatbuffer.with_buffer_data: the file, not a repacked one)."""
    graph = model.subgraphs[0]
    buffers = {int(graph.tensors[graph.operators[op].inputs[2]].buffer) for op in ops}
    return with_buffer_data(int8, {b: np.asarray(model.buffers[b].data, np.uint8)
                                   for b in buffers})


def _float_ops(model) -> frozenset[str]:
    """The outputs of the ops that compute in float (not DEQUANTIZE): a file's float ops."""
    graph = model.subgraphs[0]
    return frozenset(_text(graph.tensors[op.outputs[0]].name) for op in graph.operators
                     if len(op.outputs) and graph.tensors[op.outputs[0]].type == 0
                     and op_name(model, op) != "DEQUANTIZE")


def _targets(model, reference_tensors: dict[str, tuple[int, list[int]]]) -> dict[int, int]:
    """{op index: index of the same-named float tensor in the reference} of the convolutions
    to correct: no fused activation, an int8 output with one scale, an int32 bias of their
    own with one scale per output channel, a float twin of the output's shape."""
    graph, codes = model.subgraphs[0], model.operatorCodes
    readers: dict[int, int] = {}
    for tensor in graph.tensors:
        readers[tensor.buffer] = readers.get(tensor.buffer, 0) + 1
    # a graph output keeps its name on the DEQUANTIZE that makes it float again
    renamed = {op.inputs[0]: graph.tensors[op.outputs[0]].name for op in graph.operators
               if max(codes[op.opcodeIndex].builtinCode,
                      codes[op.opcodeIndex].deprecatedBuiltinCode) == DEQUANTIZE}
    targets = {}
    for index, op in enumerate(graph.operators):
        code = codes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) not in CORRECTED_OPS:
            continue
        if len(op.inputs) < 3 or op.inputs[2] < 0 or op.builtinOptions is None:
            continue
        if op.builtinOptions.fusedActivationFunction != NO_ACTIVATION:
            continue
        output, bias = graph.tensors[op.outputs[0]], graph.tensors[op.inputs[2]]
        channels = output.shape[-1]
        if (output.type != 9 or bias.type != 2  # INT8, INT32
                or output.quantization is None or len(output.quantization.scale) != 1
                or bias.quantization is None or len(bias.quantization.scale) != channels
                or readers.get(bias.buffer, 0) != 1):
            continue
        twin = reference_tensors.get(_text(output.name)) or reference_tensors.get(
            _text(renamed.get(op.outputs[0], b"")))
        if twin is None or twin[1] != list(output.shape):
            continue
        targets[index] = twin[0]
    return targets


def _float_tensors(model) -> dict[str, tuple[int, list[int]]]:
    """{name: (index, shape)} of the float tensors of `model`'s main subgraph."""
    return {_text(t.name): (k, list(t.shape))
            for k, t in enumerate(model.subgraphs[0].tensors) if t.type == FLOAT32}


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else name


def _channel_means(value: np.ndarray) -> np.ndarray:
    value = np.asarray(value, np.float64)
    return value.reshape(-1, value.shape[-1]).mean(0)
