"""Which ops of an INT8 .tflite lose the most accuracy, and mixed precision that keeps
them in float (--keep_float NODE..., --keep_float_auto COSINE).

The INT8 files are made in two steps, as TF's QuantizationDebugger makes them: one
calibration of the float model (the converter's calibrate-only mode: a float flatbuffer
carrying every tensor's range), then the MLIR quantizer on it. The second step takes under
a second and takes a denylist of op output tensors that stay in float, so many denylists
can be tried on one calibration.

An op left in float alone gains almost nothing: its input is still dequantized from INT8
and its output re-quantized for the next op. What loses accuracy is an activation tensor's
8-bit resolution, so the unit kept in float is a segment: an op and every op that reads its
output, which keeps that output in float. Sensitivity is measured directly: each segment in
turn stays float and the model outputs are compared with the float32 TFLite on the last
SEARCH_SAMPLES calibration samples, the selection set (one quantization and up to
SEARCH_SAMPLES runs per op: minutes for a model of a few hundred ops). What the search
finds is then judged on the held-out samples, which no choice saw (quantize.py keeps it only
when it beats the all-INT8 file there beyond noise): ranked and stopped on the same 3
held-out samples it was reported on, a trained text detector's mixed file came out worse on
unseen data than the all-INT8 one (0.886 against 0.944). Cheaper proxies ranked badly on
that detector: the cosine each op loses against its inputs (error growth) put the sigmoid
head first, which only amplifies earlier error, and missed the early backbone tensors that
matter.
--keep_float_auto then keeps the best segments, in that order, until the outputs reach the
target, re-quantizing and measuring after each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf

from onnx2tf_alt.errors import InputError

SEARCH_SAMPLES = 8  # calibration samples each re-quantization is measured on
MAX_KEPT_SEGMENTS = 16  # --keep_float_auto tries this many of a ranking's best segments
SEARCH_ROUNDS = 2  # --keep_float_auto: rankings at most (the first and one on top of it)
TOP_OFFENDERS = 12  # segments listed in the quant report
SKIPPED = {"QUANTIZE", "DEQUANTIZE"}


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
    ('model/<layer>/<op>' segments joined by ';')."""
    from ai_edge_litert.interpreter import Interpreter

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


def denylist(infos: list[OpInfo], nodes: set[str]) -> list[str]:
    """The op output tensors that compute (part of) any of `nodes` or read their outputs:
    the segments that keep those nodes' outputs in float."""
    return sorted({t for i in infos if nodes & set(i.nodes) for t in _segment(infos, i)})


def _segment(infos: list[OpInfo], info: OpInfo) -> set[str]:
    by_index = {i.index: i for i in infos}
    return {info.tensor, *(by_index[k].tensor for k in info.readers if k in by_index)}



def check_keep_float(names: list[str] | None, converted) -> list[str]:
    """--keep_float names (ONNX node names, or output names of unnamed nodes) as node keys;
    InputError for a name the model does not have."""
    keys = {}
    for node in converted.graph.nodes:
        keys[node_key(node)] = node_key(node)
        keys.update({o: node_key(node) for o in node.outputs if o and o not in keys})
    unknown = [n for n in names or [] if n not in keys]
    if unknown:
        raise InputError(
            f"--keep_float names node(s) {unknown} that the model does not have; give ONNX "
            "node names, or an output name for an unnamed node (the quant report's "
            "'sensitivity' lists them)."
        )
    return list(dict.fromkeys(keys[n] for n in names or []))


# --- calibrate once, quantize many times ----------------------------------------------------
def calibrate_only(converter: tf.lite.TFLiteConverter) -> bytes:
    """The converter's calibrate-only result: a float flatbuffer holding every tensor's
    range over its representative dataset."""
    converter._experimental_calibrate_only = True
    return converter.convert()


def quantize_calibrated(calibrated: bytes, per_tensor: bool, io_dtypes: tuple | None,
                        float_tensors: list[str]) -> bytes:
    """INT8 flatbuffer of a calibrated one; `float_tensors` (op output names) stay float."""
    from tensorflow.lite.python.convert import mlir_quantize

    inputs, outputs = io_dtypes or (tf.float32, tf.float32)
    return mlir_quantize(calibrated, per_tensor, input_data_type=inputs,
                         output_data_type=outputs, denylisted_nodes=sorted(float_tensors) or None)




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

    def report(self, target: float | None) -> dict:
        entry = {
            "method": "each op and the ops reading its output kept in float in turn; the "
                      "gain in pooled output cosine vs the float32 TFLite over up to "
                      f"{SEARCH_SAMPLES} calibration samples (the selection set)",
            "cosine_int8": self.cosine_int8,
            "top_offenders": self.ranking[:TOP_OFFENDERS],
            "kept_float_nodes": self.kept_nodes, "float_ops": len(self.float_ops)}
        if target is not None:
            entry.update(target_cosine=target, target_reached=self.reached, search=self.search)
        return entry


def choose_float_ops(calibrated: bytes, converted, score, per_tensor: bool,
                     keep: list[str], target: float | None, rank: bool) -> MixedPrecision:
    """Float ops of `calibrated`: the segments of the ONNX nodes `keep`; with `rank` or a
    `target`, each other op's segment is scored by `score(content)` (the outputs' lowest
    mean cosine on the search samples) and, with `target`, the best ones are added until
    the score reaches it (a node that adds nothing on top of those kept is skipped). When
    the first ranking's best MAX_KEPT_SEGMENTS do not reach it, the other segments are
    ranked again on top of the kept ones (SEARCH_ROUNDS rankings at most): gains that were
    lost in the noise of the first ranking show once its largest errors are gone."""
    infos = op_infos(calibrated, converted)
    nodes, float_ops = set(keep), denylist(infos, set(keep))
    chosen = MixedPrecision([], sorted(nodes), float_ops)
    if not rank and target is None:
        return chosen

    def measure(tensors) -> float:
        return score(quantize_calibrated(calibrated, per_tensor, None, sorted(tensors)))

    def ranked(kept_nodes: set[str], kept: set[str], base: float) -> list[dict]:
        """Each op's segment not yet float, by the cosine it gains on top of `kept`."""
        entries, seen = [], set()
        for info in infos:
            if info.op_type in SKIPPED or not info.nodes:
                continue
            segment = frozenset(denylist(infos, kept_nodes | set(info.nodes)))
            if segment in seen or segment <= kept:
                continue
            seen.add(segment)
            gain = measure(segment) - base
            entries.append({"op": info.op_type, "tensor": info.tensor, "nodes": info.nodes,
                            "float_ops": len(segment), "cosine_gain": round(gain, 6)})
        return sorted(entries, key=lambda r: -r["cosine_gain"])

    base = chosen.cosine_int8 = round(measure(float_ops), 6)
    ranking = candidates = ranked(nodes, set(float_ops), base)
    current, kept = base, set(float_ops)
    if target is not None:
        chosen.search.append({"float_ops": len(kept), "cosine": base})
        for search_round in range(SEARCH_ROUNDS):
            if search_round:
                candidates = ranked(nodes, kept, current)
                chosen.search.append({"ranked_again": len(candidates), "cosine": current})
            for pick in candidates[:MAX_KEPT_SEGMENTS]:
                if current >= target or pick["cosine_gain"] <= 0:
                    break
                trial = set(denylist(infos, nodes | set(pick["nodes"])))
                cosine = round(measure(trial), 6)
                if cosine <= current:  # no gain on top of the nodes kept so far
                    continue
                nodes |= set(pick["nodes"])
                kept, current = trial, cosine
                chosen.search.append({"added": pick["nodes"], "float_ops": len(kept),
                                      "cosine": current})
            if current >= target:
                break
        chosen.reached = current >= target
    chosen.ranking = ranking
    chosen.kept_nodes, chosen.float_ops = sorted(nodes), sorted(kept)
    return chosen
