"""Quantized .tflite files (dynamic range, INT8, INT16 activations) and a report of how
far each one is from the float32 TFLite on held-out samples.

Float models are calibrated with `calibration.samples` (the user's -cind arrays or the
shipped photographs). QDQ models (QuantizeLinear -> DequantizeLinear pairs, as
onnxruntime's quantize_static writes them) carry their own ranges: each pair becomes a
TensorFlow FakeQuant op (the `FakeQuantize` handler of ops/quant.py), which the TFLite
converter turns into quantized ops without calibration data, as it does for
quantization-aware-trained models.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import textwrap
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from calibration.methods import (
    AUTO_CANDIDATES,
    AUTO_FOLDS,
    AUTO_METHOD,
    AUTO_SAMPLES,
    BY_NAME,
    DEFAULT_METHOD,
    MINMAX,
    NAMES,
    ONNXRUNTIME,
    PERCENTILE,
)
from calibration.ort import fake_quantized, onnx_ranges
from calibration.ranges import Calibrated, measured_ranges, measured_ranges_split
from calibration.samples import CustomData, Samples, plan_samples
from onnx2tf_alt import progress
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.export.names import DYNAMIC_RANGE_SUFFIXES, INTEGER_SUFFIXES
from onnx2tf_alt.interrupts import checkpoint
from onnx2tf_alt.ir.weights import to_array
from onnx2tf_alt.ops.quant import FAKE_QUANT_DOMAIN, integer_range
from onnx2tf_alt.passes.qdq_pairs import FUSED
from onnx2tf_alt.quant.measure import compare_outputs, cosine, figure, gain  # noqa: F401
from onnx2tf_alt.quant.notes import CONSOLE_WIDTH, Note, console_lines
from onnx2tf_alt.quant.options import QuantOptions
from onnx2tf_alt.quant.qdq_weights import requantize_per_tensor, weights_per_tensor
from onnx2tf_alt.tflite.late_weights import mapped
from onnx2tf_alt.tflite.run import (
    XNNPACK_MAX_BYTES,
    as_input,
    dequantized,
    give_back_heap,
    on_cores,
    op_resolver,
    run_signature,
)

log = logging.getLogger("onnx2tf_alt")

# -iqd / -oqd; a Variant names its ops sets (tf.lite.OpsSet) and integer I/O types (tf
# dtypes) as strings, looked up in TF only where its converter runs (quantized_tflite): this
# module loads without TensorFlow (the direct writer's -odrqt files need none)
QUANT_DTYPES = ("int8", "uint8", "float32")
QUANT_TYPES = ("per-channel", "per-tensor")
BUILTINS, BUILTINS_INT8 = "TFLITE_BUILTINS", "TFLITE_BUILTINS_INT8"
INT16_OPS = "EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8"


@dataclass(frozen=True)
class Variant:
    """One quantized file: converter settings and whether it needs calibration samples."""

    suffix: str
    supported_ops: tuple  # names of tf.lite.OpsSet members
    calibrated: bool = True
    io_dtypes: tuple | None = None  # (input, output) type names of integer I/O; None: float


def variants(options: QuantOptions, qdq: bool, from_ranges: bool | None = None
             ) -> list[Variant]:
    """The files the options ask for. QDQ models fix 8-bit ranges, so no INT16 ones. An
    integer-only file made `from_ranges` (FakeQuantize nodes: a QDQ model's, or the
    calibrators' of --calibration_method; default: `qdq`) is not restricted to INT8
    builtins, which the converter allows only with calibration data (the ranges make every
    quantized op integer anyway)."""
    from_ranges = qdq if from_ranges is None else from_ranges
    builtins = (BUILTINS,)
    chosen = []
    integer, full_integer, integer_int16, full_integer_int16 = INTEGER_SUFFIXES
    if options.dynamic_range:
        chosen.append(Variant(DYNAMIC_RANGE_SUFFIXES[0], builtins, calibrated=False))
    if options.integer:
        io = (options.input_quant_dtype, options.output_quant_dtype)
        int8_only = builtins if from_ranges else (BUILTINS_INT8,)
        chosen += [
            Variant(integer, builtins),
            Variant(full_integer, int8_only, io_dtypes=io),
        ]
        if not qdq:
            chosen += [
                Variant(integer_int16, (INT16_OPS, *builtins)),
                Variant(full_integer_int16, (INT16_OPS,), io_dtypes=("int16", "int16")),
            ]
    return chosen


# --- QDQ models -------------------------------------------------------------------------------
def fake_quant_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` with each 8-bit per-tensor QuantizeLinear -> DequantizeLinear pair
    (same constant scale and zero point) replaced by one FakeQuantize node; None when the
    model has no such pair. QuantizeLinear nodes left without consumers are dropped."""
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    graph = model_copy.graph
    constants = {i.name: to_array(i) for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    nodes, replaced = [], 0
    for node in graph.node:
        if node.op_type == FUSED and node.domain == FAKE_QUANT_DOMAIN:
            pair = node  # passes/qdq_pairs.py: the pair, fused already
        else:
            pair = producers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        params = _pair_params(pair, node, constants) if pair is not None else None
        if params is None:
            nodes.append(node)
            continue
        nodes.append(helper.make_node(
            "FakeQuantize", [pair.input[0]], [node.output[0]], name=node.name,
            domain=FAKE_QUANT_DOMAIN, **params,
        ))
        replaced += 1
    if not replaced:
        return None
    used = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    nodes = [n for n in nodes if n.op_type != "QuantizeLinear" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == FAKE_QUANT_DOMAIN for o in model_copy.opset_import):
        model_copy.opset_import.append(helper.make_opsetid(FAKE_QUANT_DOMAIN, 1))
    return model_copy


def _pair_params(quantize: onnx.NodeProto, dequantize: onnx.NodeProto, constants) -> dict | None:
    if quantize is dequantize:  # a fused pair
        if quantize.op_type != FUSED or len(quantize.input) < 3:
            return None
    elif quantize.op_type != "QuantizeLinear" or quantize.domain not in ("", "ai.onnx"):
        return None
    if list(quantize.input[1:]) != list(dequantize.input[1:]) or len(quantize.input) < 3:
        return None
    scale, zero_point = (constants.get(n) for n in quantize.input[1:3])
    if scale is None or zero_point is None or scale.size != 1:
        return None
    if zero_point.dtype not in (np.int8, np.uint8):
        return None
    qmin, qmax = integer_range(zero_point.dtype)
    return {"scale": float(scale.reshape(())), "zero_point": int(zero_point.reshape(())),
            "qmin": qmin, "qmax": qmax}


# --- conversion ----------------------------------------------------------------------------
def two_step(variant: Variant, calibration: list) -> bool:
    """Whether `variant` is calibrated once and then quantized by the own quantizer
    (quant/integer.py): the INT8 and INT16-activation files of float models."""
    return variant.calibrated and bool(calibration)


def int16_activations(variant: Variant) -> bool:
    return INT16_OPS in variant.supported_ops


def calibrated_tflite(converted, options: QuantOptions,
                      calibration: list[dict[str, np.ndarray]],
                      notes: list[str] | None = None, method: str | None = None
                      ) -> tuple[Calibrated, bool]:
    """(the calibrated float file for the INT8 files, whether it needed Select TF ops): the
    float file with its ranges measured again on the TFLite graph (calibration/ranges.py)
    by `method` (default --calibration_method), or min-max for onnxruntime's methods (their
    FakeQuantize nodes set the others: on the direct writer's file as the grids of the
    tensors they read, quant/qdq_grids.py); `auto` picks the method on calibration samples
    left out of a trial measurement (a note in `notes` says which and why)."""
    content = getattr(converted.result, "content", b"")
    if content:  # onnxruntime's ranges: the FakeQuantize grids go onto their tensors
        from onnx2tf_alt.quant.qdq_grids import take_grids

        content, _ = take_grids(content)
    else:  # TF's converter records the ranges; the direct writer's file has none
        calibrate = Variant(INTEGER_SUFFIXES[0], (BUILTINS,))
        made = quantized_tflite(converted, calibrate, options, calibration, calibrate_only=True)
        content = made.content
        if made.select_tf_ops:  # the interpreter cannot run Select TF ops: TF's records stay
            return Calibrated(content), True
    method = method or options.calibration_method
    feeds = [converted.result.to_physical(s) for s in calibration]
    try:  # TF's calibrator records some ranges wrong (calibration/ranges.py)
        measured: dict = {}  # ranges over all the samples that the auto trial measured too
        if method == AUTO_METHOD:
            method = _choose_range_method(content, converted, options, calibration, feeds,
                                          notes, measured)
        if BY_NAME[method].measurer == ONNXRUNTIME:
            method = MINMAX
        ranges = measured[method] if method in measured else measured_ranges(
            content, feeds, (method,))[method]
    except (RuntimeError, ValueError) as exc:  # a kernel the interpreter lacks
        if getattr(converted.result, "content", b""):  # nothing recorded: no INT8 file
            raise ValueError(f"the float model's activation ranges cannot be measured in the "
                             f"interpreter ({_short(exc)})") from exc
        log.warning("INT8 calibration: TF's recorded ranges kept; the float model "
                    "cannot run in the interpreter to measure them again (%s)", _short(exc))
        return Calibrated(content), False
    log.debug("INT8 calibration: %d activation ranges measured (%s)", len(ranges),
              BY_NAME[method].algorithm)
    return Calibrated(content, ranges), False


def _choose_range_method(content: bytes, converted, options: QuantOptions,
                         calibration: list[dict[str, np.ndarray]], feeds: list[dict],
                         notes: list[str] | None, measured: dict | None = None) -> str:
    """--calibration_method auto: the range method (AUTO_CANDIDATES) whose INT8 file, with
    ranges measured on the first three quarters of the calibration samples, is closest to
    the float model on the last quarter (at most AUTO_SAMPLES of them). With fewer than 8
    samples, each fold of AUTO_FOLDS is scored with ranges measured on the others and the
    outputs of all folds are pooled: scored on the samples they were measured on, the
    range fitted closest to them (mse) would be favoured. Scores are pooled cosines
    (quant/measure.py); another method replaces percentile, the robust default, only when
    it beats it beyond the noise of those few samples: on a DB text detector with 16
    samples, auto once chose minmax on 3 of them (0.990 against 0.985), and on 8 unseen
    photographs the minmax file held 0.944 where percentile's held 0.967."""
    count = len(calibration)
    if count >= 8:
        split = count - min(count // 4, AUTO_SAMPLES)
        check = calibration[split:]
        # the trial's ranges and those over every sample in one measurement
        trial, whole = measured_ranges_split(content, feeds, split, AUTO_CANDIDATES)
        if measured is not None:
            measured.update(whole)
        metrics = _range_metrics(content, trial, converted, options, check)
        where = f"on {len(check)} calibration sample(s) not used to measure the ranges"
        scored = f"on {len(check)} calibration samples the ranges did not see"
    else:
        check, metrics = calibration, _folded_metrics(content, converted, options,
                                                      calibration, feeds)
        where = (f"on {count} calibration sample(s), each with ranges measured on the "
                 f"others ({min(AUTO_FOLDS, count)} folds)" if count > 1 else
                 "on the one calibration sample, also used to measure the ranges")
        scored = (f"in {min(AUTO_FOLDS, count)} folds of {count} calibration samples"
                  if count > 1 else "on the one calibration sample")
    scores = {m: figure(v) for m, v in metrics.items()}
    best = max(scores, key=scores.get)
    chosen, why = best, ""
    short = f"best of {len(scores)} {scored}"
    if best != PERCENTILE and PERCENTILE in metrics:
        beats, _, noise = gain(metrics[best], metrics[PERCENTILE])
        if not beats:  # the robust default unless another is better beyond noise
            chosen, why = PERCENTILE, (f"; {best} is not better beyond the noise of "
                                       f"{len(check)} sample(s), {noise:.4f}")
            short = f"{best} not better beyond noise {scored}"
    note = Note(f"INT8 files: activation ranges by {chosen} (--calibration_method auto; INT8 "
                f"output pooled cosine {where}: "
                + ", ".join(f"{m} {v:.4f}" for m, v in scores.items()) + why + ")",
                f"INT8 ranges: {chosen} (auto: {short})")
    log.debug("%s", note)
    if notes is not None:
        notes.append(note)
    return chosen


def _folded_metrics(content: bytes, converted, options: QuantOptions,
                    calibration: list[dict[str, np.ndarray]], feeds: list[dict]) -> dict:
    """_range_metrics over AUTO_FOLDS folds of few samples: each fold scored with ranges
    measured on the others, the outputs of every fold pooled."""
    count = len(calibration)
    folds = min(AUTO_FOLDS, count)
    if folds < 2:
        return _range_metrics(content, measured_ranges(content, feeds, AUTO_CANDIDATES),
                              converted, options, calibration)
    reference, actual = [], {}
    for k in range(folds):
        held = [i for i in range(count) if i % folds == k]
        fit = [feeds[i] for i in range(count) if i % folds != k]
        ranges = measured_ranges(content, fit, AUTO_CANDIDATES)
        ref, outputs = _range_outputs(content, ranges, converted, options,
                                      [calibration[i] for i in held])
        reference += ref
        for method, values in outputs.items():
            actual.setdefault(method, []).extend(values)
    return {method: compare_outputs(reference, values) for method, values in actual.items()}


def _range_metrics(content: bytes, ranges: dict[str, dict[int, tuple]], converted,
                   options: QuantOptions, samples: list[dict[str, np.ndarray]]
                   ) -> dict[str, dict]:
    """{range method: the figures (quant/measure.py) of the INT8 file of `content` with
    that method's `ranges` (and the --keep_float nodes) against the float model on
    `samples`}."""
    reference, outputs = _range_outputs(content, ranges, converted, options, samples)
    return {method: compare_outputs(reference, values) for method, values in outputs.items()}


def _range_outputs(content: bytes, ranges: dict[str, dict[int, tuple]], converted,
                   options: QuantOptions, samples: list[dict[str, np.ndarray]]
                   ) -> tuple[list, dict[str, list]]:
    """(the float model's outputs on `samples`, {range method: the outputs of the INT8 file
    of `content` with its `ranges`}), the INT8 files with the float-I/O files' float ops
    (--keep_float's, kept_float's: an int8 DIV by a computed divisor stops the trial where
    it reaches its zero point). Each file is made from `content` with its ranges recorded
    on the way (no calibrated copy of the float file per method)."""
    from onnx2tf_alt.quant.sensitivity import denylist, kept_float, op_infos, quantize_calibrated

    reference = run_tflite(content, converted, samples)  # the float model: ranges unused
    float_ops = denylist(op_infos(content, converted), set(options.keep_float)) if (
        options.keep_float) else []
    float_ops += kept_float(content, options.integer_kernels_only, None)[0]
    outputs = {}
    for method, measured in ranges.items():
        int8 = quantize_calibrated(content, options.quant_type == "per-tensor", None, float_ops,
                                   ranges=measured)
        outputs[method] = run_tflite(int8, converted, samples)
        del int8
    return reference, outputs


@dataclass
class QuantizedTflite:
    """What quantized_tflite made."""

    content: bytes  # the flatbuffer
    select_tf_ops: bool = False  # whether a TFLite conversion of this call needed Select TF ops
    notes: list[str] = field(default_factory=list)  # for the report: what bias correction did


def quantized_tflite(converted, variant: Variant, options: QuantOptions,
                     calibration: list[dict[str, np.ndarray]], calibrated: Calibrated | None = None,
                     keep_nodes: list[str] | None = None, calibrate_only: bool = False,
                     bias_cache: dict | None = None) -> QuantizedTflite:
    """One quantized flatbuffer; `calibration` feeds (ONNX layout) for calibrated variants
    of float models, empty for QDQ models and dynamic range quantization. The 8-bit files of
    float models (`two_step`) are the MLIR quantizer's on `calibrated` (made here when
    None), with the ONNX nodes `keep_nodes` (default: --keep_float) left in float, and
    their biases corrected; `bias_cache` (a dict the caller keeps) lets the files quantized
    from one calibration share the corrections and the decision to keep them."""
    if not calibrate_only and two_step(variant, calibration):
        flex = False
        int16 = int16_activations(variant)
        if calibrated is None:
            calibrated, flex = calibrated_tflite(converted, options, calibration,
                                                 method=MINMAX if int16 else None)
            if flex and variant.io_dtypes:
                raise ValueError("integer-only files cannot fall back to Select TF ops")
        if int16:
            content, notes = quantize_16x8(calibrated, variant.io_dtypes)
            return QuantizedTflite(content, flex, notes=notes)
        content, notes = _own_int8(
            calibrated, converted, options.quant_type == "per-tensor", variant.io_dtypes,
            options.keep_float if keep_nodes is None else keep_nodes,
            options.integer_kernels_only)
        made = QuantizedTflite(content, flex, notes=notes)
        if options.bias_correction:
            made.content = _bias_corrected(made.content, calibrated, converted, calibration,
                                           {} if bias_cache is None else bias_cache, made.notes)
        return made
    import tensorflow as tf

    from onnx2tf_alt.tflite.lowering import serving_function

    concrete = serving_function(converted.result).get_concrete_function()

    def make(select_tf_ops: bool) -> tf.lite.TFLiteConverter:
        conv = tf.lite.TFLiteConverter.from_concrete_functions(
            [concrete], converted.result.model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        ops = [getattr(tf.lite.OpsSet, name) for name in variant.supported_ops]
        if select_tf_ops:
            ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
        conv.target_spec.supported_ops = ops
        int16 = int16_activations(variant)
        # -qt per-tensor: the INT8 files. TFLite's 16x8 mode cannot quantize depthwise
        # kernels per tensor ("Quantized dimension ... do not match"): INT16 files stay
        # per-channel (the report says so).
        if options.quant_type == "per-tensor" and variant.calibrated and not int16:
            conv._experimental_disable_per_channel = True
        if variant.calibrated and calibration:
            conv.representative_dataset = lambda: (converted.result.to_physical(s) for s in
                                                    progress.each(calibration, "calibrating"))
        if variant.io_dtypes:
            conv.inference_input_type, conv.inference_output_type = map(
                tf.as_dtype, variant.io_dtypes)
        conv._experimental_calibrate_only = calibrate_only
        return conv

    with warnings.catch_warnings():  # TF's calibrator still runs the deprecated tf.lite one
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        try:
            return QuantizedTflite(make(select_tf_ops=False).convert())
        except Exception:
            if variant.io_dtypes:  # integer-only files cannot fall back to TF ops
                raise
            log.warning("%s: TFLite builtins cannot express this model; using Select TF ops",
                        variant.suffix)
            return QuantizedTflite(make(select_tf_ops=True).convert(), select_tf_ops=True)


def quantize_16x8(calibrated: Calibrated, io_dtypes: tuple | None) -> tuple[bytes, list[str]]:
    """(an INT16-activation file of a calibrated flatbuffer, the report's notes on it):
    min-max ranges (16 bits need no clipping), weights per channel (TFLite has no per-tensor
    16x8 depthwise kernels), no op kept float but those without a 16-bit kernel and the
    softmaxes its kernel gets wrong (the notes say which), no bias correction (its error is
    a rounding of 1/256 of the 8-bit one's)."""
    from onnx2tf_alt.quant.integer import quantize

    notes: list[str] = []
    content = quantize(calibrated.content, False, io_dtypes, (), activations="int16",
                       ranges=calibrated.ranges, notes=notes)
    return content, notes


def _bias_corrected(content: bytes, calibrated: Calibrated, converted,
                    calibration: list[dict[str, np.ndarray]], cache: dict,
                    notes: list[str]) -> bytes:
    """`content` with its conv biases corrected (quant/bias_correction.py) on the first
    BIAS_SAMPLES calibration samples, unless corrections move the INT8 output away from the
    float model on samples they were not measured on (_bias_judgement). A constant shift per
    channel is what the correction can take out; on models whose error is not one it moves
    the output at random. `cache` carries the corrections and the decision to the next file
    quantized from the same calibration; the note on what was done goes to `notes`. The
    correction is dropped only when it loses beyond the noise of those samples (pooled
    cosine, quant/measure.py): on PP-OCRv4's recognizer it gained 0.004 there, within the
    noise of 5 samples (0.005), and 0.013 on 8 unseen text lines (0.975 -> 0.987); on its
    DB detector the file without it held 0.837 against 0.944."""
    from onnx2tf_alt.quant.bias_correction import BIAS_SAMPLES, corrected_biases

    fit = calibration[:BIAS_SAMPLES]
    errors: dict = {}
    fixed, count = corrected_biases(content, calibrated.content,
                                    [converted.result.to_physical(s) for s in fit],
                                    cache.setdefault("corrections", {}), errors)
    if not count:
        return content
    if "keep" not in cache:
        note = (f"INT8 files: the biases of {count} convolution(s) without fused activation "
                f"corrected for the mean error of their 8-bit output on {len(fit)} "
                "calibration samples")
        cache["keep"] = True
        short = ""
        judged = _bias_judgement(content, fixed, calibrated.content, converted, calibration,
                                 errors)
        if judged is not None:
            before, after, where = judged
            _, delta, noise = gain(after, before)
            cache["keep"] = delta > -noise
            note = (note if cache["keep"] else note.replace(" corrected for", " not corrected for")
                    ) + (f" (INT8 output pooled cosine {where} {figure(before):.6f} before, "
                         f"{figure(after):.6f} after; dropped only for a loss beyond the "
                         f"noise, {noise:.6f})")
            short = (" (kept: no loss beyond noise on samples it was not fitted on)"
                     if cache["keep"] else
                     " (dropped: a loss beyond noise on samples it was not fitted on)")
        note = Note(note, f"bias correction: {count} conv{'s' if count > 1 else ''}{short}")
        log.debug("%s", note)
        notes.append(note)
    return fixed if cache["keep"] else content


def _bias_judgement(content: bytes, fixed: bytes, float_file: bytes, converted,
                    calibration: list[dict[str, np.ndarray]], errors: dict
                    ) -> tuple[dict, dict, str] | None:
    """(INT8 output figures without, with bias correction, on which samples) on samples the
    corrections did not see: the calibration samples after the first BIAS_SAMPLES (at most
    AUTO_SAMPLES) when there are at least BIAS_FOLD_BELOW of them; else every calibration
    sample, those after the first BIAS_SAMPLES with `fixed` and each of AUTO_FOLDS folds of
    the first ones with the correction refitted (bias_correction.refitted, from the per-sample
    `errors` of `fixed`'s measurement) on the others, pooled. None for one sample."""
    from onnx2tf_alt.quant.bias_correction import BIAS_FOLD_BELOW, BIAS_SAMPLES, refitted

    check = calibration[BIAS_SAMPLES:][-AUTO_SAMPLES:]
    parts = [(fixed, check)] if check else []  # (corrected file, samples it is judged on)
    fit = calibration[:BIAS_SAMPLES]
    folds = min(AUTO_FOLDS, len(fit))
    if len(check) >= BIAS_FOLD_BELOW:
        where = f"on {len(check)} other calibration samples"
    elif folds < 2:
        return None
    else:
        for k in range(folds):
            rows = [i for i in range(len(fit)) if i % folds != k]
            parts.append((refitted(content, errors, rows),
                          [s for i, s in enumerate(fit) if i % folds == k]))
        where = (f"on {len(fit) + len(check)} calibration samples, each corrected by biases "
                 f"measured on others ({folds} folds of the first {len(fit)}),")
    judged = [sample for _, samples in parts for sample in samples]
    reference = run_tflite(float_file, converted, judged)  # one interpreter per file
    without = run_tflite(content, converted, judged)
    with_ = [out for corrected, samples in parts
             for out in run_tflite(corrected, converted, samples)]
    return compare_outputs(reference, without), compare_outputs(reference, with_), where


# --- running and measuring ------------------------------------------------------------------
def run_tflite(content: bytes | str, converted, samples: list[dict[str, np.ndarray]]
               ) -> list[dict]:
    """Outputs {ONNX name: value in ONNX order, dequantized} of a .tflite (its bytes, or
    its path) per sample; float inputs are quantized with the file's input parameters
    where its inputs are integers. The samples are shared among one interpreter per core
    (tflite/run.on_cores: the INT16 files, on TFLite's single-threaded builtin kernels,
    measure twice as fast on two cores)."""
    return run_tflites([content], converted, samples)[0]


def run_tflites(contents: list[bytes | str], converted, samples: list[dict[str, np.ndarray]]
                ) -> list[list[dict]]:
    """run_tflite of each of `contents` (files of one conversion) on the same samples, every
    (file, sample) run shared among the cores at once: three held-out samples of two
    INT16-activation files take three runs' time on two cores, not four."""
    from ai_edge_litert.interpreter import Interpreter

    result = converted.result
    sizes = [os.path.getsize(c) if isinstance(c, str) else len(c) for c in contents]

    def interpreter_of(content, size: int):
        resolver = op_resolver(size)  # past XNNPACK_MAX_BYTES without XNNPACK
        if isinstance(content, str):
            return Interpreter(model_path=content, experimental_op_resolver_type=resolver)
        return Interpreter(model_content=content if isinstance(content, bytes)
                           else bytes(content),  # a memory-mapped file
                           experimental_op_resolver_type=resolver)

    def run(chunk: list[int], counter) -> list[dict]:
        found, current = [], None
        for item in chunk:  # file by file: one interpreter at a time
            file, k = divmod(item, len(samples))
            if current is None or current[0] != file:
                interpreter = interpreter_of(contents[file], sizes[file])
                runner = interpreter.get_signature_runner("serving_default")
                current = file, interpreter, runner.get_input_details(), \
                    runner.get_output_details()
            _, interpreter, inputs, outputs = current
            counter.begin()  # (a counter shared by the threads: its count may lag by one)
            feeds = {key: as_input(v, inputs[key])
                     for key, v in result.to_physical(samples[k]).items()}
            raw = run_signature(interpreter, feeds)
            found.append(result.to_onnx({key: dequantized(raw[key], outputs[key])
                                         for key in raw}))
        return found

    count = len(contents) * len(samples)
    with progress.counting("measuring", count) as counter:
        values = on_cores(count, max(sizes, default=0), lambda chunk: run(chunk, counter))
    give_back_heap()  # the interpreters' packed weights and tensors
    return [values[f * len(samples):(f + 1) * len(samples)] for f in range(len(contents))]


@dataclass
class QuantReport:
    model: str
    quant_type: str
    qdq: bool
    sources: dict[str, str]
    calibration_samples: int
    held_out_samples: int
    calibration_method: str = DEFAULT_METHOD
    files: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sensitivity: dict | None = None  # the INT8 files' ranking and float nodes (sensitivity.py)
    sample_roles: dict = field(default_factory=dict)  # which samples each decision used

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def console_table(report: QuantReport) -> str:
    """The report for a person: the choices in one short line each, then one row per file
    and output; the JSON keeps the full sentences and every figure. Lines fit
    CONSOLE_WIDTH columns; file names lose their `<stem>_` where they would not."""
    ranges = "" if report.calibration_method == AUTO_METHOD else (
        f"; ranges: {report.calibration_method}")
    samples = f"; {report.calibration_samples} calibration samples" if (
        report.calibration_samples) else ""
    title = (f"quantization report ({report.quant_type}{samples}{ranges}; figures vs the "
             "float32 TFLite)")
    lines = [title]
    if report.held_out_samples:
        lines.append(f"  held-out: {report.held_out_samples} samples, none used for choices")
    lines += [f"  {line}" for note in report.notes if getattr(note, "short", None) != ""
              for line in console_lines(note, CONSOLE_WIDTH - 2)]
    names = {e["file"]: e["file"] for e in report.files}
    if max(map(len, names), default=0) > CONSOLE_WIDTH - 52:
        names = {n: n.removeprefix(f"{report.model}_") for n in names}
    width = max([len(n) for n in names.values()] + [4])
    lines.append(f"{'file':<{width}} {'output':<16} {'pooled':>8} {'SQNR dB':>8} "
                 f"{'lowest':>8} {'top-1':>7}")
    for entry in report.files:
        name = names[entry["file"]]
        if entry.get("error"):
            lines.append(f"{name:<{width}} not written (the warning above says why)")
            continue
        if entry.get("outputs") is None:
            lines.append(textwrap.shorten(f"{name:<{width}} not measured: "
                                          f"{entry['not_measured']}", CONSOLE_WIDTH))
            continue
        for output, m in entry["outputs"].items():
            top1 = f"{100 * m['top1_agreement']:.1f}%" if "top1_agreement" in m else "-"
            lines.append(f"{name:<{width}} {output[:16]:<16} {m['cosine_pooled']:>8.5f} "
                         f"{m['sqnr_db']:>8.2f} {m['cosine_min']:>8.5f} {top1:>7}")
    offenders = (report.sensitivity or {}).get("top_offenders", [])[:3]
    if offenders:
        lines += textwrap.wrap(
            "most sensitive INT8 nodes (estimated output cosine gained in float): "
            + "; ".join(f"{', '.join(r['nodes'])} +{r['estimated_gain']:.4f}"
                        for r in offenders), CONSOLE_WIDTH, subsequent_indent="    ")
    return "\n".join(lines)


@dataclass
class QuantPlan:
    """Everything decided before any file is written (so bad input fails early)."""

    options: QuantOptions
    samples: Samples
    qdq_model: onnx.ModelProto | None  # the FakeQuantize rewrite of a QDQ model
    # the model with FakeQuantize ranges from onnxruntime's calibrators (--calibration_method)
    calibrated_model: onnx.ModelProto | None = None
    kept_nodes: list[str] | None = None  # the INT8 files' float nodes, once written
    # the calibrated files' conversion: the model prepared for quantization (quant/prepare.py);
    # None: the model itself
    quant_source: object = None
    # the INT8 files' conversion when prepared differently (quant/prepare.py): None: the model
    int8_source: object = None
    notes: list[str] = field(default_factory=list)  # what that preparation changed
    # a QDQ model whose weights are all per tensor: its INT8 files' filters put back on that
    # grid (quant/qdq_weights.py)
    qdq_per_tensor: bool = False
    # the conversion each written file was quantized from, by suffix (export/micro.py maps
    # the full-integer file's ops to its ONNX nodes)
    made_from: dict = field(default_factory=dict)

    @property
    def range_model(self) -> onnx.ModelProto | None:
        """The FakeQuantize model whose ranges the 8-bit calibrated files take, if any."""
        return self.qdq_model if self.qdq_model is not None else self.calibrated_model

    def takes_ranges(self, variant: Variant) -> bool:
        """Whether `variant` is quantized from `range_model` (no calibration samples)."""
        int16 = int16_activations(variant)
        return self.range_model is not None and variant.calibrated and not int16

    def source_for(self, variant: Variant, converted, rebuilt):
        """The conversion `variant` is made from: `rebuilt` (the range model's) when it
        takes ranges, else the model prepared for it (`quant_source` for the
        INT16-activation files, `int8_source` for the INT8 ones), else `converted`.
        The INT8 files get no GPTQ weights: on the PP-OCRv4 DB detector they moved their
        held-out cosine by -0.04..+0.0 (8-bit activations limit it) while lifting the
        INT16-activation files from 0.919 to 0.993 (320x320) and 0.972 to 0.999 (640)."""
        source = self.source_of(variant, converted, rebuilt)
        _unspilled(source)
        return source

    def source_of(self, variant: Variant, converted, rebuilt):
        """source_for's conversion, its float file possibly still spilled (_spill)."""
        if self.takes_ranges(variant):
            return rebuilt
        int16 = int16_activations(variant)
        prepared = (self.quant_source if int16 else self.int8_source) if variant.calibrated \
            else None
        return converted if prepared is None else prepared

    def calibration_for(self, variant: Variant) -> list[dict[str, np.ndarray]]:
        """A QDQ model's own ranges need no samples; the calibrators' FakeQuantize ranges
        still do, for the tensors inside a lowered op (e.g. HardSigmoid's multiply-add) that
        no ONNX value names: without them TFLite leaves those ops in float."""
        return [] if self.qdq_model is not None and self.takes_ranges(variant) else (
            self.samples.calibration)


def plan_quantization(
    converted,
    options: QuantOptions,
    custom: dict[str, CustomData] | None = None,
    mean=None,
    std=None,
) -> QuantPlan:
    """Samples for calibration and for the report. QDQ models need no calibration data;
    float models need it for every input that is not an image (InputError otherwise)."""
    if options.quant_type not in QUANT_TYPES:
        raise InputError(f"-qt must be one of {list(QUANT_TYPES)}, got '{options.quant_type}'.")
    for flag, value in (("-iqd", options.input_quant_dtype), ("-oqd", options.output_quant_dtype)):
        if value not in QUANT_DTYPES:
            raise InputError(f"{flag} must be one of {list(QUANT_DTYPES)}, got '{value}'.")
    if options.calibration_method not in BY_NAME:
        raise InputError(f"--calibration_method must be one of {list(NAMES)}, got "
                         f"'{options.calibration_method}'.")
    qdq_model = fake_quant_model(converted.model) if options.integer else None
    samples = plan_samples(converted.graph, custom or {}, mean, std,
                           need_calibration=options.integer and qdq_model is None)
    from onnx2tf_alt.quant.sensitivity import check_keep_float

    options.keep_float = check_keep_float(options.keep_float, converted)
    if options.keep_float_auto is not None and not 0 < options.keep_float_auto <= 1:
        raise InputError(f"--keep_float_auto takes a target cosine in (0, 1], got "
                         f"{options.keep_float_auto}.")
    if not options.integer or qdq_model is not None:
        per_tensor = qdq_model is not None and weights_per_tensor(converted.model)
        notes = [Note("QDQ model with per-tensor weights: the INT8 files keep them per tensor "
                      "(TF's converter quantizes them per channel; quant/qdq_weights.py puts "
                      "them back on the model's grid)",
                      "QDQ model: its per-tensor weight scales kept")] if per_tensor else []
        return QuantPlan(options, samples, qdq_model, notes=notes, qdq_per_tensor=per_tensor)
    from onnx2tf_alt.quant.prepare import prepare_for_int8, prepare_for_quantization

    per_channel = options.quant_type == "per-channel"
    prepared, notes = prepare_for_quantization(converted.model, samples.calibration, per_channel)
    calibrated = None
    if BY_NAME[options.calibration_method].measurer == ONNXRUNTIME:
        ranges = onnx_ranges(converted.model, samples.calibration, options.calibration_method)
        calibrated = fake_quantized(converted.model, ranges)
    source = None if prepared is converted.model else converted.rebuild(
        prepared, for_quantization=True)
    if source is not None:  # read by the INT16-activation files, made after the INT8 ones
        _spill(source)
    int8_source = None
    if per_channel and calibrated is None:  # equalized scales would share one weight grid
        for_int8, int8_notes = prepare_for_int8(converted.model, samples.calibration)
        notes += int8_notes
        int8_source = None if for_int8 is converted.model else converted.rebuild(
            for_int8, for_quantization=True)
    return QuantPlan(options, samples, qdq_model, calibrated, quant_source=source,
                     int8_source=int8_source, notes=notes)


def _spill(converted) -> None:
    """Keep the float file of `converted` (a direct writer's conversion) in an unlinked
    temporary file until _unspilled reads it back: the INT16-activation files' source
    (GPTQ weights) is built with the plan, so a model it cannot be built for fails before
    anything is written, but is read only after the INT8 files, whose calibration peaks
    would hold it too (ViT-B/16: 327 MB); the INT8 files' source waits likewise while the
    INT16 files are made, and is back when write_quantized returns."""
    content = getattr(converted.result, "content", b"")
    if not isinstance(content, bytes) or not content or getattr(
            converted.result, "spilled", None) is not None:
        return
    spilled = tempfile.TemporaryFile()  # noqa: SIM115 (kept open: gone when closed or at exit)
    spilled.write(content)
    converted.result.content, converted.result.spilled = b"", spilled


def _with_content(converted) -> None:
    """The float file of a direct writer's rebuild whose weights passed BOUND_BYTES (it
    holds the table and writes the file on demand: tflite/late_weights.Bound) in its
    result's `content`, as the quantizer reads it (past 2 GB with the weights after the
    flatbuffer)."""
    result = converted.result
    if result.content or getattr(result, "bound", None) is None:
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "float32.tflite")
        result.bound.write(path)
        with open(path, "rb") as f:
            result.content = f.read()


def _unspilled(converted) -> None:
    """The float file _spill kept aside, back in `converted`'s result."""
    spilled = getattr(getattr(converted, "result", None), "spilled", None)
    if spilled is None:
        return
    spilled.seek(0)
    converted.result.content = spilled.read()
    spilled.close()
    converted.result.spilled = None




def write_quantized(
    converted,
    folder: str,
    stem: str,
    plan: QuantPlan,
    float_tflite: bytes | str,
    print_table: bool = True,
) -> list[str]:
    """Write every requested quantized .tflite and `<stem>_quant_report.json` into
    `folder` (`float_tflite`: the float32 file's bytes, or path); returns the file names. A variant the TFLite converter cannot produce is
    reported (log and report) and skipped; the others are still written."""
    options, samples, qdq = plan.options, plan.samples, plan.qdq_model is not None
    rebuilt = converted.rebuild(plan.range_model, for_quantization=True) if (
        plan.range_model is not None) else None
    report = QuantReport(
        model=stem, quant_type=("per-tensor" if plan.qdq_per_tensor else "per-channel") if qdq
        else options.quant_type, qdq=qdq, sources=samples.sources,
        calibration_samples=0 if qdq else len(samples.calibration),
        held_out_samples=len(samples.held_out),
        calibration_method="model's own QDQ ranges" if qdq else options.calibration_method,
    )
    report.notes += plan.notes
    if not qdq and options.integer:
        report.sample_roles = _sample_roles(len(samples.calibration), len(samples.held_out))
    if plan.calibrated_model is not None:
        report.notes.append(Note(
            f"INT8 files: activation ranges from onnxruntime's {options.calibration_method} "
            "calibrator on the ONNX graph; INT16-activation files: min-max ranges",
            f"INT8 ranges: onnxruntime's {options.calibration_method} calibrator; INT16 files: "
            "min-max"))
    if qdq:
        report.notes.append("QDQ model: quantized with its own 8-bit ranges, without "
                            "calibration; no INT16-activation files; deploy the INT8 file "
                            "(the float32 one emulates each pair in float)")
    elif options.quant_type == "per-tensor" and options.integer:
        report.notes.append(Note(
            "per-tensor applies to the INT8 files; the INT16-activation files keep "
            "per-channel weights (TFLite's 16x8 mode has no per-tensor depthwise kernels)",
            "per-tensor: the INT8 files; the INT16 files stay per-channel (no 16x8 kernels)"))
    reference, why_not = _reference_outputs(float_tflite, converted, samples.held_out,
                                            report.notes)
    if reference is None:
        report.notes.append(f"the float32 TFLite cannot run here ({why_not}): no metrics")
    written, calibrated = [], {}
    chosen = variants(options, qdq, plan.range_model is not None)
    sources = [plan.source_of(variant, converted, rebuilt) for variant in chosen]
    try:
        with progress.counting("quantizing", len(chosen)) as files:
            for k, variant in enumerate(chosen):
                checkpoint()
                files.begin(f"{stem}_{variant.suffix}.tflite")
                source = plan.source_for(variant, converted, rebuilt)
                entry = _write_variant(variant, source, folder, stem, plan, report,
                                       float_tflite, calibrated)
                report.files.append(entry)
                if "error" not in entry:
                    written.append(entry["file"])
                _release(calibrated, chosen[k + 1:], sources[k + 1:])
                for done in {id(s): s for s in sources[:k + 1]}.values():
                    if all(s is not done for s in sources[k + 1:]):
                        _spill(done)  # no later file reads it: on disk till the end
        _measure_written(report.files, plan.made_from, folder, plan.samples.held_out, reference)
    finally:
        for source in sources:
            _unspilled(source)
    report.notes += _verdicts(report, options.warn_below)
    report_name = f"{stem}_quant_report.json"
    with open(os.path.join(folder, report_name), "w") as f:
        json.dump(report.as_dict(), f, indent=2)
    written.append(report_name)
    if print_table:
        progress.clear()
        print(console_table(report), flush=True)
    return written


def _write_variant(variant: Variant, source, folder: str, stem: str, plan: QuantPlan,
                   report: QuantReport, float_tflite: bytes, calibrated: dict) -> dict:
    """One quantized file of write_quantized, written into `folder`: its report entry (with
    "error" when it could not be made; _measure_written adds its figures)."""
    name = f"{stem}_{variant.suffix}.tflite"
    entry = {"file": name, "variant": variant.suffix}
    try:
        content = _quantized_file(source, variant, plan, report, float_tflite, calibrated)
    except Exception as exc:  # reported; the other files are still written
        entry["error"] = _short(exc)
        log.warning("%s was not written: %s", name, entry["error"])
        log.debug("%s", name, exc_info=True)
        return entry
    with open(os.path.join(folder, name), "wb") as f:
        f.write(content)
    plan.made_from[variant.suffix] = source
    entry["size_bytes"] = len(content)
    if entry["size_bytes"] > XNNPACK_MAX_BYTES:
        entry["measured_on"] = "TFLite's reference kernels (file over 1 GiB: XNNPACK " \
                               "would pack its weights once more)"
    return entry


def _measure_written(entries: list[dict], made_from: dict, folder: str, samples: list,
                     reference: list[dict] | None) -> None:
    """Each written file's figures against the float32 file's `reference` outputs on the
    held-out `samples`, in its report entry (`made_from`: each variant's source, by
    suffix): the files of one source measured together,
    from their files (which the interpreter maps), every run on the cores at once
    (run_tflites); a file the interpreter cannot run (Flex ops) says why."""
    written = [e for e in entries if "error" not in e]
    groups: dict[int, list[dict]] = {}
    for entry in written:
        groups.setdefault(id(made_from[entry["variant"]]), []).append(entry)
    for group in groups.values():
        source = made_from[group[0]["variant"]]
        paths = [os.path.join(folder, e["file"]) for e in group]
        if reference is None:
            found = [(None, "no float32 reference")] * len(group)
        else:
            try:
                found = [(outputs, "") for outputs in run_tflites(paths, source, samples)]
            except Exception:  # noqa: BLE001 - each file alone says which cannot run
                found = [_measure(path, source, samples) for path in paths]
        for entry, (actual, why_not) in zip(group, found):
            entry["outputs"] = None if actual is None else compare_outputs(reference, actual)
            if actual is None:
                entry["not_measured"] = why_not


def _release(calibrated: dict, later: list[Variant], sources: list) -> None:
    """Drop the calibrations (calibration/ranges.Calibrated: a source's float file, held
    until its spill, and its ranges) and bias corrections that no `later` variant (made
    from `sources`) reads again: a source no later file reads can then leave memory
    (_spill)."""
    needed = {key for variant, source in zip(later, sources)
              for key in ((id(source), int16_activations(variant)), ("biases", id(source)))}
    for key in [key for key in calibrated if key not in needed]:
        del calibrated[key]
    give_back_heap()


def _sample_roles(calibration: int, held_out: int) -> dict[str, str]:
    """Which samples each step of the INT8 files used (for the report)."""
    from onnx2tf_alt.quant.bias_correction import BIAS_FOLD_BELOW, BIAS_SAMPLES
    from onnx2tf_alt.quant.sensitivity import SEARCH_SAMPLES

    scored = min(calibration // 4, AUTO_SAMPLES) if calibration >= 8 else calibration
    checked = min(max(0, calibration - BIAS_SAMPLES), AUTO_SAMPLES)
    return {
        "ranges": f"the {calibration} calibration samples",
        "calibration_method auto": (f"ranges measured on {calibration - scored}, scored on the "
                                    f"last {scored}" if calibration >= 8 else
                                    f"{min(AUTO_FOLDS, calibration)} folds of all "
                                    f"{calibration}, each scored with ranges measured on the "
                                    "others"),
        "bias correction": (f"measured on the first {min(calibration, BIAS_SAMPLES)}, judged on "
                            f"the {checked} after them" if checked >= BIAS_FOLD_BELOW else
                            f"measured on the first {min(calibration, BIAS_SAMPLES)}, judged "
                            f"on all {calibration}, each corrected by biases measured on "
                            f"others ({min(AUTO_FOLDS, calibration, BIAS_SAMPLES)} folds of "
                            f"the first {min(calibration, BIAS_SAMPLES)})"),
        "keep_float_auto": (f"searched on the last {min(calibration, SEARCH_SAMPLES)} "
                            f"calibration samples, judged on the "
                            f"{max(0, calibration - SEARCH_SAMPLES) + held_out} samples it "
                            f"did not see ({held_out} held out)"),
        "figures": f"the {held_out} held-out samples, which no step used",
    }


def _verdicts(report: QuantReport, threshold: float) -> list[str]:
    """One debug line per measured file with its held-out figure (the table shows them); a
    warning for each INT8 file below `threshold` that names the best file beside it."""
    measured = {e["file"]: figure(e["outputs"]) for e in report.files if e.get("outputs")}
    if not measured:
        return []
    held = report.held_out_samples
    for name, value in measured.items():
        log.debug("%s: held-out pooled cosine %.5f (%d held-out samples, none used for "
                  "choices)", name, value, held)
    lines = []
    int8 = [n for n in measured if n.endswith(("_integer_quant.tflite",
                                               "_full_integer_quant.tflite"))]
    others = {n: v for n, v in measured.items() if n not in int8}
    for name in int8:
        if measured[name] >= threshold:
            continue
        best = max(others, key=others.get, default=None)
        line = (f"{name}: held-out pooled cosine {measured[name]:.5f} is below "
                f"{threshold}" + (f"; {best} holds {others[best]:.5f}" if best else ""))
        log.warning("%s", line)
        lines.append(Note(line, ""))  # the warning says it: not again in the table
    return lines


def weight_only_tflite(converted, float_tflite=None) -> bytes | bytearray | None:
    """The dynamic-range file made from the float32 one (quant/weight_only.py): the direct
    writer's itself (its bytes in memory, which the file at `float_tflite` holds too: read
    from the file, a 2.3 GB model's weights were in memory twice), TF's converter's with
    its weights bound again; None where they cannot be bound (TF's converter then makes
    it)."""
    from onnx2tf_alt.quant.weight_only import dynamic_range_file, dynamic_range_model

    result = converted.tflite_result()
    if result.model is None:  # the direct writer's: no TF model to convert again
        return dynamic_range_file(getattr(result, "content", b"") or float_tflite,
                                  "the dynamic-range file")
    from onnx2tf_alt.tflite.lowering import late_bound

    bound = late_bound(result)
    if bound is None or not dynamic_range_model(bound.model):
        return None
    return bound.to_bytearray()  # written, then run from its file (write_quantized)


def _quantized_file(source, variant: Variant, plan: QuantPlan, report: QuantReport,
                    float_tflite: bytes, calibrated: dict) -> bytes:
    """One file of write_quantized. The two-step files share one calibration and one set of
    bias corrections per source (`calibrated`, filled here) and one choice of float nodes (recorded in `plan` and
    `report`)."""
    options, calibration = plan.options, plan.calibration_for(variant)
    direct = source.result.model is None  # the direct writer's conversion: no TF
    if variant.suffix == DYNAMIC_RANGE_SUFFIXES[0] and (plan.qdq_model is None or direct):
        content = weight_only_tflite(source, float_tflite)
        if content is not None:
            return content
    if plan.qdq_model is not None and plan.takes_ranges(variant) and direct:
        return _on_own_grids(source, variant, plan, report)
    if not two_step(variant, calibration):
        content = quantized_tflite(source, variant, options, calibration).content
        if plan.qdq_per_tensor and plan.takes_ranges(variant):
            content, _ = requantize_per_tensor(content)
        return content
    if direct:
        _with_content(source)
    int16 = int16_activations(variant)
    key = (id(source), int16)
    if key not in calibrated:
        calibrated[key] = calibrated_tflite(source, options, calibration, report.notes,
                                            method=MINMAX if int16 else None)
    ranged, flex = calibrated[key]  # the float file and its ranges
    if flex and variant.io_dtypes:
        raise ValueError("integer-only files cannot fall back to Select TF ops")
    if int16:
        content, notes = quantize_16x8(ranged, variant.io_dtypes)
        report.notes += [n for n in notes if n not in report.notes]
        return content
    biases = calibrated.setdefault(("biases", id(source)), {})

    def made(nodes: list[str]) -> QuantizedTflite:
        result = quantized_tflite(source, variant, options, calibration, calibrated=ranged,
                                  keep_nodes=nodes, bias_cache=biases)
        report.notes += [n for n in result.notes if n not in report.notes]
        return result

    if plan.kept_nodes is None:
        found = _choose_float_nodes(source, ranged, plan, report, float_tflite)
        plan.kept_nodes = _judged(found, made, source, plan, report, float_tflite)
    return made(plan.kept_nodes).content


def _on_own_grids(source, variant: Variant, plan: QuantPlan, report: QuantReport) -> bytes:
    """The INT8 file of a QDQ model on its own grids (quant/qdq_grids.py) by the own
    quantizer: no calibration, no bias correction; its weights per tensor where the model's
    are (the quantizer's max|w| / 127 scales are onnxruntime's symmetric int8 ones), with
    --keep_float's nodes and kept_float's ops in float (their notes into `report`)."""
    from onnx2tf_alt.quant.qdq_grids import take_grids

    content, taken = take_grids(source.result.content)
    log.debug("QDQ model: %d QuantizeLinear grids taken", taken)
    content, notes = _own_int8(Calibrated(content), source, plan.qdq_per_tensor, variant.io_dtypes,
                               plan.options.keep_float, plan.options.integer_kernels_only)
    report.notes += [n for n in notes if n not in report.notes]
    return content


def _own_int8(calibrated: Calibrated, converted, per_tensor: bool, io_dtypes: tuple | None,
              keep_nodes, integer_kernels_only: bool) -> tuple[bytes, list]:
    """(the own quantizer's INT8 file of `calibrated`, the report's notes): the ONNX nodes
    `keep_nodes` and what every INT8 file keeps (sensitivity.kept_float) in float."""
    from onnx2tf_alt.quant.sensitivity import (
        denylist,
        kept_float,
        op_infos,
        quantize_calibrated,
    )

    nodes = set(keep_nodes)
    float_ops = denylist(op_infos(calibrated.content, converted), nodes) if nodes else []
    kept, notes = kept_float(calibrated.content, integer_kernels_only, io_dtypes)
    return quantize_calibrated(calibrated.content, per_tensor, io_dtypes, [*float_ops, *kept],
                               ranges=calibrated.ranges), notes


def _judged(found: list[str], made, source, plan: QuantPlan, report: QuantReport,
            float_tflite: bytes) -> list[str]:
    """The float nodes the search `found`, kept only when the file with them (`made(nodes)`,
    made as the written file is, bias correction included) beats the all-INT8 one
    (--keep_float nodes only) beyond the noise of the comparison (quant/measure.py) on
    every sample the search did not see: the held-out ones and the calibration samples
    outside its selection set (a user's 16 samples leave 3 held out, too few to tell a
    real gain from noise alone); else the --keep_float nodes, and the report says why.
    The report's `held_out` figures are those of the held-out samples alone, the written
    file's figures in `files`."""
    from onnx2tf_alt.quant.sensitivity import SEARCH_SAMPLES

    keep = sorted(plan.options.keep_float)
    added = sorted(set(found) - set(keep))
    held = plan.samples.held_out
    unseen = plan.samples.calibration[:-SEARCH_SAMPLES] + held
    if not added or not unseen:
        return found
    truth = run_tflite(float_tflite, source, unseen)
    outputs = {name: run_tflite(made(n).content, source, unseen)
               for name, n in (("int8", keep), ("mixed", found))}
    int8, mixed = (compare_outputs(truth, outputs[name]) for name in ("int8", "mixed"))
    better, _, noise = gain(mixed, int8)
    if held:
        tail = len(unseen) - len(held)
        report.sensitivity["held_out"] = {
            "samples": len(held), **{name: figure(compare_outputs(truth[tail:], values[tail:]))
                                     for name, values in outputs.items()}}
    report.sensitivity["judged"] = {"samples": len(unseen), "held_out": len(held),
                                    "int8": figure(int8), "mixed": figure(mixed),
                                    "noise": round(noise, 6), "kept": better}
    verdict = (f"INT8 files: the {len(added)} node(s) --keep_float_auto found move the pooled "
               f"cosine on the {len(unseen)} samples the search did not see ({len(held)} "
               f"held out) from {figure(int8):.6f} to {figure(mixed):.6f}")
    short = (f"--keep_float_auto: {len(added)} node(s) found; cosine {figure(int8):.6f} -> "
             f"{figure(mixed):.6f} on {len(unseen)} unseen samples")
    if better:
        report.notes.append(Note(f"{verdict} (noise {noise:.6f}): kept", f"{short}: kept"))
        return found
    report.notes.append(Note(
        f"{verdict}, not above the noise ({noise:.6f}): not kept, the INT8 files are all-INT8"
        + (" but for the --keep_float nodes" if keep else ""), f"{short}: not kept (noise)"))
    report.sensitivity["kept_float_nodes"] = keep
    return keep


def _choose_float_nodes(source, calibrated: Calibrated, plan: QuantPlan, report: QuantReport,
                        float_tflite: bytes) -> list[str]:
    """--keep_float nodes, extended by --keep_float_auto; ranks the ops with -cotof.

    The search ranks and adds nodes on calibration samples (the last SEARCH_SAMPLES: the
    selection set); `_judged` then decides on the samples it never saw."""
    from onnx2tf_alt.quant.sensitivity import SEARCH_SAMPLES, choose_float_ops

    options = plan.options
    rank = options.sensitivity or options.keep_float_auto is not None
    search = plan.samples.calibration[-SEARCH_SAMPLES:]
    reference, why_not = _measure(float_tflite, source, search) if rank else ([], "")
    if reference is None:
        report.notes.append(f"no sensitivity ranking: the float32 TFLite cannot run here "
                            f"({why_not})")
        rank, target = False, None
    else:
        target = options.keep_float_auto

    def score(content: bytes) -> float:
        return figure(compare_outputs(reference, run_tflite(content, source, search)))

    per_tensor = options.quant_type == "per-tensor"
    try:
        mixed = choose_float_ops(calibrated, source, score, per_tensor, options.keep_float,
                                 target, rank, search)
    except Exception as exc:  # e.g. an INT8 kernel the interpreter lacks: no ranking
        if not rank:
            raise
        report.notes.append(f"no sensitivity ranking: the INT8 file cannot run here "
                            f"({_short(exc)})")
        rank, target = False, None
        mixed = choose_float_ops(calibrated, source, score, per_tensor, options.keep_float,
                                 None, False)
    if rank or mixed.float_ops:
        report.sensitivity = mixed.report(target)
        report.sensitivity["search_samples"] = f"the last {len(search)} calibration samples"
    if mixed.reached is False:
        report.notes.append(f"--keep_float_auto {target}: not reached on the {len(search)} "
                            f"selection samples (best {mixed.search[-1]['cosine']})")
    if mixed.float_ops:
        report.notes.append(
            f"INT8 files: {len(mixed.kept_nodes)} ONNX node(s) to keep in float "
            f"({len(mixed.float_ops)} TFLite ops): {', '.join(mixed.kept_nodes)}")
    return mixed.kept_nodes


def _reference_outputs(float_tflite, converted, samples, notes: list[str]
                       ) -> tuple[list[dict] | None, str]:
    """The float32 .tflite's outputs on `samples` (`float_tflite`: its bytes, or its path,
    run on TFLite's reference kernels past XNNPACK_MAX_BYTES); for TF's converter's
    file over XNNPACK_MAX_BYTES the TF model's (same weights, already in memory:
    loading the file would hold its weights once more, twice under XNNPACK)."""
    result = converted.tflite_result()
    if isinstance(float_tflite, str):
        if result.model is None or os.path.getsize(float_tflite) <= XNNPACK_MAX_BYTES:
            return _measure(float_tflite, converted, samples)
        float_tflite = mapped(float_tflite)
    if len(float_tflite) <= XNNPACK_MAX_BYTES:
        return _measure(bytes(float_tflite), converted, samples)
    notes.append(f"reference outputs: the TF model's (the float32 .tflite is "
                 f"{len(float_tflite) / 2**30:.1f} GiB)")
    found = []
    for sample in samples:
        physical = result.to_physical(sample)
        outputs = result.model([physical[result.input_names[n]] for n in converted.graph.inputs],
                               training=False)
        found.append(result.to_onnx({k: v.numpy() for k, v in outputs.items()}))
    return found, ""


def _measure(content: bytes | str, converted, samples) -> tuple[list[dict] | None, str]:
    """run_tflite (of a file's bytes or path), or (None, why) when the interpreter cannot
    run the file (Flex ops)."""
    try:
        return run_tflite(content, converted, samples), ""
    except Exception as exc:  # noqa: BLE001 - the report says why a file has no metrics
        return None, _short(exc)


def _short(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"

