"""Which ops of an INT8 .tflite lose the most accuracy, and mixed precision that keeps
them in float (--keep_float NODE..., --keep_float_auto COSINE).

The INT8 files are made in two steps: one calibration of the float model (a float
flatbuffer carrying every tensor's range), then the project's own quantizer on it
(quant/integer.py). The second step takes a tenth of a second and takes a denylist of op
output tensors that stay in float, so many denylists can be tried on one calibration.

An op left in float alone gains almost nothing: its input is still dequantized from INT8
and its output re-quantized for the next op. What loses accuracy is an activation tensor's
8-bit resolution, so the unit kept in float is a segment: an op and every op that reads its
output (through ops that only move values, up to the ones that compute with it), which
keeps that output in float.

Segments are ranked in one pass, before any re-quantization (noise_scores): each tensor's
real rounding error on the all-INT8 grid, taken through the outputs' gradient along the
INT8 file's own output error (one backward pass of the TF model per sample), is its share
of that error, which estimates the output cosine keeping it in float would win back. The ranking used to measure each segment kept in
float directly (one re-quantization and SEARCH_SAMPLES runs per op): 12 minutes on a
trained DB text detector of 300 ops. Cheaper proxies that look at one op at a time ranked
badly there: the cosine each op loses against its inputs (error growth) put the sigmoid
head first, which only amplifies earlier error, and missed the early backbone tensors that
matter; the gradient weighs each tensor's error by what it does to the outputs.
The direct writer's file has no TF model to differentiate: there the segments are ranked by
measurement instead (quant/group_ranking.py: groups of segments kept in float, re-quantized
and run, the groups that gain most split first; about 24 files), with no TensorFlow.
--keep_float_auto then tries the best segments in that order, re-quantizing and measuring
the outputs on the selection set (the last SEARCH_SAMPLES calibration samples) after each,
keeping a segment only when it gains and ranking the rest again on the new file (a
measured ranking keeps its gains: measuring it again would cost another 24 files), until
the outputs reach the target. What the search
finds is then judged on samples it did not see (quantize.py keeps it only when it beats the
all-INT8 file there beyond noise): ranked and stopped on the same 3 held-out samples it was
reported on, a trained text detector's mixed file once came out worse on unseen data than
the all-INT8 one (0.886 against 0.944).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from onnx2tf_alt import progress
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.quant.notes import Note

if TYPE_CHECKING:  # TensorFlow is imported where its converter runs
    import tensorflow as tf

    from calibration.ranges import Calibrated

SEARCH_SAMPLES = 8  # calibration samples the ranking and each re-quantization use
MAX_TRIED_SEGMENTS = 32  # --keep_float_auto measures at most this many re-quantized files
TOP_OFFENDERS = 12  # segments listed in the quant report
SKIPPED = {"QUANTIZE", "DEQUANTIZE"}
MOVES_VALUES = {"RESHAPE", "TRANSPOSE", "PAD", "PADV2", "MIRROR_PAD", "SQUEEZE", "EXPAND_DIMS",
                "SLICE", "STRIDED_SLICE", "GATHER", "CONCATENATION", "SPLIT", "SPLIT_V", "PACK",
                "UNPACK", "TILE", "BROADCAST_TO", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH"}


@dataclass
class OpInfo:
    """One op of a calibrated (float) flatbuffer, as the denylist names it."""

    index: int
    op_type: str
    tensor: str  # its first output tensor: the name the MLIR quantizer's denylist takes
    nodes: list[str] = field(default_factory=list)  # the ONNX nodes it computes (part of)
    readers: list[int] = field(default_factory=list)  # ops reading its outputs


# --- the ONNX nodes behind each TFLite op -----------------------------------------------------
def node_key(node) -> str:
    """How the report and --keep_float name an ONNX node: its name, or for an unnamed one
    its first output."""
    return node.name or node.outputs[0]


def node_layers(converted) -> dict[str, set[str]]:
    """{node_key: names of the Keras layers its handler made}: each node output's Keras
    history, walked back to the tensors of other ONNX values."""
    result = converted.result
    value_tensors = {id(v.tensor) for v in result.values.values() if v.tensor is not None}
    layers: dict[str, set[str]] = {}
    for node in converted.graph.nodes:
        found: set[str] = set()
        pending = [result.values[o].tensor for o in node.outputs
                   if o in result.values and result.values[o].tensor is not None]
        seen: set[int] = set()
        while pending:
            tensor = pending.pop()
            history = getattr(tensor, "_keras_history", None)
            if history is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            layer = history.layer
            if type(layer).__name__ == "InputLayer":
                continue
            found.add(layer.name)
            inbound = layer.inbound_nodes[history.node_index]
            pending += [t for t in inbound.keras_inputs if id(t) not in value_tensors]
        layers[node_key(node)] = found
    return layers


def op_infos(calibrated: bytes, converted) -> list[OpInfo]:
    """Every op of a calibrated flatbuffer with the ONNX nodes its fused name carries
    ('model/<layer>/<op>' segments joined by ';'; the direct writer's '<node>/<what>')."""
    from ai_edge_litert.interpreter import Interpreter

    if converted.result.model is None:
        return _direct_op_infos(calibrated, converted)

    prefix = f"{converted.result.model.name}/"
    by_layer: dict[str, list[str]] = {}
    for node, layers in node_layers(converted).items():
        for layer in layers:
            by_layer.setdefault(layer, []).append(node)
    interpreter = Interpreter(model_content=calibrated)
    ops = [op for op in interpreter._get_ops_details() if len(op["outputs"])]
    readers: dict[int, list[int]] = {}
    for op in ops:
        for tensor in op["inputs"]:
            readers.setdefault(int(tensor), []).append(op["index"])
    infos = []
    for op in ops:
        tensor = interpreter._get_tensor_details(op["outputs"][0], 0)["name"]
        nodes: dict[str, None] = {}
        for part in tensor.split(";"):
            if part.startswith(prefix):
                for node in by_layer.get(part[len(prefix):].split("/")[0], []):
                    nodes[node] = None
        users = [k for t in op["outputs"] for k in readers.get(int(t), [])]
        infos.append(OpInfo(op["index"], op["op_name"], tensor, list(nodes), users))
    return infos


def _direct_op_infos(calibrated: bytes, converted) -> list[OpInfo]:
    """op_infos of the direct writer's file, whose tensors name their ONNX nodes
    (export/delegates.onnx_origins): no Keras layers, no TensorFlow."""
    from onnx2tf_alt.export.delegates import onnx_origins
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = unpack_model(calibrated)
    graph = model.subgraphs[0]
    keys = {node.name: node_key(node) for node in converted.graph.nodes}
    readers: dict[int, list[int]] = {}
    for k, op in enumerate(graph.operators):
        for t in op.inputs:
            readers.setdefault(int(t), []).append(k)
    infos = []
    for k, (op, nodes) in enumerate(zip(graph.operators, onnx_origins(
            model, converted.result, converted.graph))):
        if len(op.outputs):
            users = [r for t in op.outputs for r in readers.get(int(t), [])]
            infos.append(OpInfo(k, op_name(model, op), graph.tensors[op.outputs[0]].name.decode(),
                                [keys.get(n["name"], n["name"]) for n in nodes], users))
    return infos


def denylist(infos: list[OpInfo], nodes: set[str]) -> list[str]:
    """The op output tensors that compute (part of) any of `nodes` or read their outputs:
    the segments that keep those nodes' outputs in float."""
    return sorted({t for i in infos if nodes & set(i.nodes) for t in _segment(infos, i)})


def _segment(infos: list[OpInfo], info: OpInfo) -> set[str]:
    """`info`'s output tensor and those of the ops reading it, followed through ops that
    only move values (RESHAPE, PAD, ...): the quantizer keeps such an op in 8 bits on its
    input's grid even when denylisted, so the value stays float only up to the first op
    that computes with it (basic-pitch's log spectrum reaches its LOG through RESHAPEs)."""
    by_index = {i.index: i for i in infos}
    found, pending = {info.tensor}, list(info.readers)
    while pending:
        reader = by_index.get(pending.pop())
        if reader is None or reader.tensor in found:
            continue
        found.add(reader.tensor)
        if reader.op_type in MOVES_VALUES:
            pending += reader.readers
    return found



def check_keep_float(names: list[str] | None, converted) -> list[str]:
    """--keep_float names (ONNX node names, or output names of unnamed nodes) as node keys;
    InputError for a name the model does not have. A node the conversion computes as
    several (passes/conv_regions.py names them "<node>/region_...") stands for all of them."""
    keys: dict[str, list[str]] = {}
    for node in converted.graph.nodes:
        keys[node_key(node)] = [node_key(node)]
        keys.update({o: [node_key(node)] for o in node.outputs if o and o not in keys})
    for name in names or []:
        if name not in keys:
            parts = [key for key in dict.fromkeys(k for ks in keys.values() for k in ks)
                     if key.startswith(f"{name}/")]
            if parts:
                keys[name] = parts
    unknown = [n for n in names or [] if n not in keys]
    if unknown:
        raise InputError(
            f"--keep_float names node(s) {unknown} that the model does not have; give ONNX "
            "node names, or an output name for an unnamed node (the quant report's "
            "'sensitivity' lists them)."
        )
    return list(dict.fromkeys(k for n in names or [] for k in keys[n]))


# --- ops whose 8-bit kernel cannot run ---------------------------------------------------------
DIV = 42  # builtin operator code


TRANSPOSE_CONV = 67  # builtin operator code (schema.BuiltinOperator.TRANSPOSE_CONV)


def kept_float(calibrated: bytes, integer_kernels_only: bool, io_dtypes: tuple | None
               ) -> tuple[list[str], list[Note]]:
    """(output tensors the INT8 files keep in float whatever the user asks, the report's
    notes on them): the DIVs by a computed divisor (unsafe_divisions), and in the files with
    float inputs and outputs the transposed convolutions (slow_int8_kernels) and the ops
    XNNPACK has no int8 kernel for (float_only_on_xnnpack); nothing for
    --target micro, whose kernels are integer only, and the full-integer files keep their
    transposed convolutions in int8 (an NPU's, an Edge TPU's)."""
    if integer_kernels_only:
        return [], []
    divisions = unsafe_divisions(calibrated)
    slow = [] if io_dtypes else slow_int8_kernels(calibrated)
    undelegated = [] if io_dtypes else float_only_on_xnnpack(calibrated)
    notes = []
    if divisions:
        notes.append(Note(
            f"INT8 files: {len(divisions)} DIV op(s) with a computed divisor kept in "
            "float: TFLite's int8 DIV stops the invocation on a divisor at its zero "
            "point, where 8-bit error upstream can take any computed divisor",
            f"INT8 files: {len(divisions)} DIV op(s) with a computed divisor kept in "
            "float (int8 DIV stops on a zero divisor)"))
    if slow:
        notes.append(Note(
            f"INT8 files with float inputs and outputs: {len(slow)} TRANSPOSE_CONV op(s) "
            "kept in float: XNNPACK's int8 transposed convolution runs several times slower "
            "than its float one (PP-OCRv4 detector: 57 ms against 9 ms); the full-integer "
            "files keep them int8",
            f"INT8 files (float I/O): {len(slow)} TRANSPOSE_CONV op(s) float (XNNPACK's int8 "
            "one is slower)"))
    if undelegated:
        notes.append(Note(
            f"INT8 files with float inputs and outputs: {len(undelegated)} SOFTMAX / GELU / "
            "RSQRT / HARD_SWISH op(s) kept in float: XNNPACK has no int8 kernel for them, and "
            "each one on TFLite's builtin kernel splits the delegated graph (ViT-B/16: 50 "
            "partitions, 1 in float, 0.91x the time at 1 thread; MobileNetV3-Large: 22, 1 in "
            "float, 0.39x); the full-integer files keep them int8",
            f"INT8 files (float I/O): {len(undelegated)} SOFTMAX/GELU/RSQRT/HARD_SWISH op(s) "
            "float (no int8 XNNPACK kernel)"))
    return [*divisions, *slow, *undelegated], notes


def slow_int8_kernels(calibrated: bytes) -> list[str]:
    """Output tensors of the TRANSPOSE_CONV ops of a calibrated flatbuffer. XNNPACK runs an
    int8 transposed convolution 6.4x slower than the float one on this machine's CPU (the
    PP-OCRv4 DB detector's two, 2x upsampling to 320x320 and 640x640: 57.1 ms against
    8.95 ms, benchmarks/profile_tflite.py, 1 thread), more than half of its INT8 file's
    time; behind a DEQUANTIZE and before a QUANTIZE in float, the QDQ detector's INT8 file
    went from 1.62x onnxruntime's QDQ execution to 0.74x (which runs ConvTranspose in float
    too)."""
    return _outputs_of(calibrated, TRANSPOSE_CONV)


SOFTMAX, GELU, RSQRT, HARD_SWISH = 25, 150, 76, 117  # builtin operator codes


def float_only_on_xnnpack(calibrated: bytes) -> list[str]:
    """Output tensors of the ops XNNPACK runs in float but has no int8 kernel for (SOFTMAX,
    GELU, RSQRT, HARD_SWISH): in int8 each runs on TFLite's builtin kernel between two
    delegated partitions. ViT-B/16's INT8 file had 49 of them in 50 partitions; kept float
    (behind a DEQUANTIZE, before a QUANTIZE, all delegated: one partition) it ran at 0.907
    of the time at 1 thread and 0.802 at 2, its held-out cosine 0.9911 -> 0.9982.
    MobileNetV3-Large's 20 HARD_SWISH: 22 partitions -> 1, 8.74 -> 3.37 ms at 1 thread and
    10.53 -> 1.95 ms at 2 (its int8 file had been slower than its float32 one)."""
    return _outputs_of(calibrated, SOFTMAX, GELU, RSQRT, HARD_SWISH)


def _outputs_of(calibrated: bytes, *builtins: int, computed_input: int | None = None
                ) -> list[str]:
    """Output tensors of the ops of one of `builtins` in a flatbuffer's main subgraph, in
    graph order (with `computed_input`, only those whose input at that position is not a
    constant)."""
    from onnx2tf_alt.tflite.flatbuffer import builtin_codes, read_model

    model = read_model(calibrated)
    graph = model.Subgraphs(0)
    codes = builtin_codes(model)
    found = []
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        if codes[op.OpcodeIndex()] not in builtins:
            continue
        if computed_input is not None:
            if op.InputsLength() <= computed_input:
                continue
            tensor = graph.Tensors(op.Inputs(computed_input))
            if model.Buffers(tensor.Buffer()).DataLength():  # a constant
                continue
        found.append(graph.Tensors(op.Outputs(0)).Name().decode())
    return found


def unsafe_divisions(calibrated: bytes) -> list[str]:
    """Output tensors of the DIV ops of a calibrated flatbuffer whose divisor is computed
    (not a constant). TFLite's int8 DIV stops the whole invocation when a divisor is at its
    zero point ("data[i] != zero_point"), and the 8-bit error upstream can take any computed
    divisor there, whatever its float range: basic-pitch's div_no_nan by the peak of a log
    spectrum was at least 57.6 on every calibration clip in float, but its INT8 files
    failed on a quiet clip, whose spectrum the int8 LOG flattened to one value. These DIVs
    stay in float in the INT8 files."""
    return _outputs_of(calibrated, DIV, computed_input=1)


# --- calibrate once, quantize many times ----------------------------------------------------
def calibrate_only(converter: tf.lite.TFLiteConverter) -> bytes:
    """The converter's calibrate-only result: a float flatbuffer holding every tensor's
    range over its representative dataset."""
    converter._experimental_calibrate_only = True
    return converter.convert()


def quantize_calibrated(calibrated: bytes, per_tensor: bool, io_dtypes: tuple | None,
                        float_tensors: list[str], ranges: dict[int, tuple] | None = None
                        ) -> bytes:
    """INT8 flatbuffer of a calibrated one, by the project's own quantizer
    (quant/integer.py); `float_tensors` (op output names) stay float; `io_dtypes`: (input,
    output) type names of an integer-only file; `ranges` ({tensor: (low, high)}) recorded
    over the file's own first (calibration/ranges.record_ranges)."""
    from onnx2tf_alt.quant.integer import quantize

    return quantize(calibrated, per_tensor, io_dtypes, float_tensors, ranges=ranges)


def tf_quantize_calibrated(calibrated: bytes, per_tensor: bool, io_dtypes: tuple | None,
                           float_tensors: list[str], activations: str = "int8",
                           ranges: dict[int, tuple] | None = None) -> bytes:
    """quantize_calibrated by TF's MLIR quantizer (`activations` "int16": its 16x8 mode;
    `ranges` written into the file first): the oracle the own quantizer is tested and
    benchmarked against (tests/quant/test_integer.py, benchmarks/bench_int8_heldout.py),
    never a file's maker."""
    import tensorflow as tf
    from tensorflow.compiler.mlir.lite import types_pb2
    from tensorflow.lite.python.convert import mlir_quantize

    from calibration.ranges import with_ranges

    inputs, outputs = map(tf.as_dtype, io_dtypes or ("float32", "float32"))
    if ranges is not None:
        calibrated = with_ranges(calibrated, ranges)[0]
    kind = types_pb2.QUANTIZED_INT16 if activations == "int16" else types_pb2.QUANTIZED_INT8
    return mlir_quantize(calibrated, per_tensor, inference_type=kind, input_data_type=inputs,
                         output_data_type=outputs, denylisted_nodes=sorted(float_tensors) or None)


# --- one-pass ranking ------------------------------------------------------------------------
def noise_scores(int8: bytes, infos: list[OpInfo], converted,
                 samples: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """{op output tensor of `int8`: its share of the INT8 file's output error energy,
    relative to the outputs' energy}, from one forward and backward pass of the TF model per
    sample, before any re-quantization.

    To first order, rounding a tensor t to its INT8 grid adds e = q(t) - t and moves the
    outputs by c = J e (J: their Jacobian in t); the INT8 file's output error d is the sum of
    all tensors' c. The share of t is d . c = (J^T d) . e: one backward pass of d gives it
    for every tensor at once. Keeping t in float removes c and changes the error energy by
    |d - c|^2 - |d|^2 = |c|^2 - 2 d . c, which is -d . c both when t's error is the
    whole error (c = d) and when it is one of many independent ones (d . c = |c|^2): the
    share estimates the energy won back, and half of it (relative to |y|^2) the output
    cosine. e is the tensor's real rounding and clipping error, on the scale and zero point
    `int8` gives it; it is taken at the output of the Keras layer the tensor's name starts
    with. Tensors without such a layer (parts of a layer TFLite split into several ops)
    score 0."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.flatbuffer import SIGNATURE
    from onnx2tf_alt.tflite.run import as_input, dequantized, run_signature

    result = converted.result
    model = result.model
    prefix = f"{model.name}/"
    interpreter = Interpreter(model_content=int8)
    params = {t["name"]: t["quantization"] for t in interpreter.get_tensor_details()}
    layers = {layer.name: layer for layer in model.layers
              if type(layer).__name__ != "InputLayer"}
    grid: dict[str, tuple[float, int]] = {}  # layer name -> (scale, zero point)
    owner: dict[str, str] = {}  # op output tensor -> layer name
    for info in infos:
        scale, zero = params.get(info.tensor, (0.0, 0))
        first = info.tensor.split(";")[0]
        name = first[len(prefix):].split("/")[0] if first.startswith(prefix) else None
        if scale and name in layers and name not in grid:
            grid[name], owner[info.tensor] = (float(scale), int(zero)), name
    if not grid or not samples:
        return {}
    runner = interpreter.get_signature_runner(SIGNATURE)
    details, out_details = runner.get_input_details(), runner.get_output_details()
    physical = [result.to_physical(s) for s in samples]
    quantized = []
    for feeds in physical:
        raw = run_signature(interpreter, {k: as_input(v, details[k]) for k, v in feeds.items()})
        quantized.append({k: dequantized(v, out_details[k]) for k, v in raw.items()})
    inputs = [[tf.constant(feeds[result.input_names[n]]) for n in converted.graph.inputs]
              for feeds in physical]
    floats = [{k: v.numpy() for k, v in model(x, training=False).items()} for x in inputs]
    energy = {k: sum(float(np.sum(np.square(f[k], dtype=np.float64))) for f in floats)
              for k in floats[0]}
    captured: dict[str, tf.Tensor] = {}
    originals = {name: layers[name].call for name in grid}

    def watched(name: str, call):
        def run(*args, **kwargs):
            out = call(*args, **kwargs)
            if isinstance(out, tf.Tensor) and out.dtype.is_floating:
                tape.watch(out)
                captured[name] = out
            return out
        return run

    share = dict.fromkeys(grid, 0.0)
    try:
        for name, call in originals.items():
            layers[name].call = watched(name, call)
        for x, found, expected in progress.each(list(zip(inputs, quantized, floats)),
                                                "ranking ops"):
            captured.clear()
            with tf.GradientTape() as tape:
                outputs = model(x, training=False)
                error = tf.add_n([tf.reduce_sum(value * (found[k] - expected[k]).astype(
                    np.float32)) / np.float32(max(energy[k], 1e-30))
                    for k, value in outputs.items() if k in found and value.dtype.is_floating])
            names = list(captured)
            grads = tape.gradient(error, [captured[n] for n in names])
            for name, grad in zip(names, grads):
                if grad is None:
                    continue
                scale, zero = grid[name]
                value = captured[name].numpy()
                codes = np.clip(np.round(value / scale) + zero, -128, 127)
                share[name] += float(np.sum(grad.numpy() * ((codes - zero) * scale - value)))
    finally:
        for name, call in originals.items():
            layers[name].call = call
    return {tensor: share[name] for tensor, name in owner.items()}


# --- ranking and --keep_float_auto ------------------------------------------------------------
@dataclass
class MixedPrecision:
    """What the sensitivity ranking and the keep-float choice found for one calibration."""

    ranking: list[dict]
    kept_nodes: list[str]
    float_ops: list[str]
    cosine_int8: float | None = None  # all-INT8 (but `keep`) outputs on the search samples
    search: list[dict] = field(default_factory=list)  # one step per re-quantization
    reached: bool | None = None  # --keep_float_auto: whether the target was met
    measured: bool = False  # ranked by measuring groups kept in float (no TF model)

    def report(self, target: float | None) -> dict:
        how = ("the output cosine a segment gains kept in float, measured on re-quantized "
               "files with groups of segments in float, the groups that gain most split "
               "first (quant/group_ranking.py)" if self.measured else
               "its share of the all-INT8 file's output error, in output cosine (rounding "
               "error x gradient along the output error; one forward and backward pass of "
               "the TF model per sample)")
        entry = {
            "method": f"each op's segment (the op and the ops reading its output) ranked by "
                      f"{how}, over up to {SEARCH_SAMPLES} calibration samples (the "
                      "selection set)",
            "cosine_int8": self.cosine_int8,
            "top_offenders": self.ranking[:TOP_OFFENDERS],
            "kept_float_nodes": self.kept_nodes, "float_ops": len(self.float_ops)}
        if target is not None:
            entry.update(target_cosine=target, target_reached=self.reached, search=self.search)
        return entry


def choose_float_ops(calibrated: Calibrated, converted, score, per_tensor: bool,
                     keep: list[str], target: float | None, rank: bool,
                     samples: list[dict[str, np.ndarray]] = ()) -> MixedPrecision:
    """Float ops of `calibrated`: the segments of the ONNX nodes `keep`; with `rank` or a
    `target`, the other segments ranked by noise_scores on `samples` (one pass, no
    re-quantization). With `target`, segments are tried best first, each re-quantized and
    measured by `score(content)` (the outputs' pooled cosine on the search samples; a
    file the denylist leaves unchanged is not run): a segment that gains on top of those
    kept is added and the rest ranked again on the new file (its output error is another),
    until the score reaches the target or MAX_TRIED_SEGMENTS were measured."""
    if not keep and not rank and target is None:  # nothing to find (nor Keras layers needed)
        return MixedPrecision([], [], [])
    infos = op_infos(calibrated.content, converted)
    nodes, float_ops = set(keep), denylist(infos, set(keep))
    chosen = MixedPrecision([], sorted(nodes), float_ops,
                            measured=converted.result.model is None)
    if not rank and target is None:
        return chosen
    divisions, _ = kept_float(calibrated.content, False, None)  # float in the written files too

    def quantized(tensors) -> bytes:
        return quantize_calibrated(calibrated.content, per_tensor, None,
                                   sorted({*tensors, *divisions}), ranges=calibrated.ranges)

    scores: dict[int, float] = {}
    first: list[dict] = []

    def scored(content: bytes) -> float:
        key = hash(content)
        if key not in scores:
            scores[key] = score(content)
        return scores[key]

    def ranked(content: bytes, kept_nodes: set[str], kept: set[str]) -> list[dict]:
        if chosen.measured and first:  # measured once: the rest keep their gains
            return [e for e in first
                    if not frozenset(denylist(infos, kept_nodes | set(e["nodes"]))) <= kept]
        entries, segments, seen = [], [], set()
        for info in infos:
            if info.op_type in SKIPPED or not info.nodes:
                continue
            segment = frozenset(denylist(infos, kept_nodes | set(info.nodes)))
            if segment in seen or segment <= kept:
                continue
            seen.add(segment)
            segments.append(segment - kept)
            entries.append({"op": info.op_type, "tensor": info.tensor, "nodes": info.nodes,
                            "float_ops": len(segment)})
        units = []
        if chosen.measured:
            gains, units = measured_gains(segments, frozenset(kept), content)
        else:
            shares = noise_scores(content, infos, converted, list(samples))
            gains = [sum(shares.get(t, 0.0) for t in segment) / 2 for segment in segments]
        for entry, estimate in zip(entries, gains):
            entry["estimated_gain"] = float(f"{estimate:.3g}")
        for unit in units:  # segments whose gain is joint: one candidate
            members = entries[unit.first:unit.stop]
            entries.append({
                "op": f"{unit.size} segments, {members[0]['op']} ... {members[-1]['op']}",
                "tensor": members[0]["tensor"],
                "nodes": list(dict.fromkeys(n for e in members for n in e["nodes"])),
                "float_ops": len(frozenset().union(*segments[unit.first:unit.stop])),
                "estimated_gain": float(f"{unit.gain:.3g}"), "joint": True})
        first[:] = sorted(entries, key=lambda r: -r["estimated_gain"])
        return list(first)

    def measured_gains(segments: list[frozenset], kept: frozenset, content: bytes
                       ) -> list[float]:
        from onnx2tf_alt.quant.group_ranking import MEASUREMENTS, ranked_gains

        base = scored(content)
        with progress.counting("ranking ops", MEASUREMENTS) as steps:
            def measured(tensors: frozenset) -> float:
                steps.begin(f"{len(tensors)} float ops")
                made = quantized(tensors)
                return base if made == content else scored(made)

            return ranked_gains(segments, kept, base, measured)

    content, kept = quantized(float_ops), set(float_ops)
    current = chosen.cosine_int8 = round(scored(content), 6)
    chosen.ranking = candidates = ranked(content, nodes, kept)
    if target is None:
        return chosen
    chosen.search.append({"float_ops": len(kept), "cosine": current})
    with progress.counting("trying float ops", MAX_TRIED_SEGMENTS) as trials:
        current = _search(chosen, candidates, infos, nodes, kept, content, current, target,
                          quantized, ranked, scored, trials)
    chosen.reached = current >= target
    return chosen


def _search(chosen: MixedPrecision, candidates: list[dict], infos, nodes: set[str],
            kept: set[str], content: bytes, current: float, target: float, quantized, ranked,
            score, trials) -> float:
    """choose_float_ops' search from the all-INT8 file `content` (cosine `current`): fills
    `chosen` and returns the cosine reached."""
    tried: set[frozenset] = set()
    measured = 0
    while current < target and measured < MAX_TRIED_SEGMENTS:
        for pick in candidates:
            trial = frozenset(denylist(infos, nodes | set(pick["nodes"])))
            if pick["estimated_gain"] <= 0 or measured >= MAX_TRIED_SEGMENTS:
                candidates = []
                break
            if trial in tried:
                continue
            tried.add(trial)
            made = quantized(trial)
            if made == content:  # the quantizer keeps these ops in 8 bits all the same
                pick["measured_gain"] = 0.0
                continue
            measured += 1
            trials.begin(f"cosine {current:.4f}, target {target}")
            cosine = round(score(made), 6)
            pick["measured_gain"] = round(cosine - current, 6)
            if cosine > current:  # a gain on top of the nodes kept so far
                nodes |= set(pick["nodes"])
                content, kept, current = made, set(trial), cosine
                chosen.search.append({"added": pick["nodes"], "float_ops": len(kept),
                                      "cosine": current, "measured": measured})
                candidates = ranked(content, nodes, kept) if current < target else []
                break
        else:
            break  # every candidate tried
        if not candidates:
            break
    chosen.kept_nodes, chosen.float_ops = sorted(nodes), sorted(kept)
    return current
