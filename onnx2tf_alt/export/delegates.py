"""`<stem>_delegates.json`: which ops of a .tflite the XNNPACK CPU delegate takes, which the
GPU delegate would reject, each mapped back to the ONNX nodes it came from.

XNNPACK: the file is loaded in ai-edge-litert's interpreter, which applies its default
XNNPACK delegate; each delegate kernel it adds to the main subgraph is one partition, and
the ops it replaced are the ones computed from that kernel's inputs (everything else runs
on TFLite's reference kernels). GPU: TFLite's analyzer no longer checks GPU compatibility
(its `gpu_compatibility` mode prints "compatible" for any model since TF 2.19), so this is
a static check of each op against the rules the GPU delegate's compatibility checker
applied (TF's lite/tools/versioning/gpu_compatibility.cc): supported op types, run-time vs
constant inputs, ranks, dtypes and options. Only the main subgraph is listed (the bodies of
control-flow ops are not).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from onnx2tf_alt.layout.explain import tflite_transposes
from onnx2tf_alt.tflite.flatbuffer import op_name, pack_model, schema, unpack_model
from onnx2tf_alt.tflite.late_weights import mapped

log = logging.getLogger("onnx2tf_alt")

XNNPACK_ANALYSIS_BYTES = 1 << 30  # larger files: see analyze
RUN_TIME_DIM = 224  # an input's run-time dims past the batch, in the report (1 fails)
DTYPE_NAMES = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}

ONE_RUNTIME_INPUT = frozenset({
    "RESHAPE", "TRANSPOSE", "TILE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "QUANTIZE",
    "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "PAD", "PADV2", "MIRROR_PAD", "MEAN", "SUM",
    "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "HARD_SWISH",
    "ABS", "CEIL", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGISTIC", "NEG", "RSQRT",
    "SIGN", "SIN", "SQRT", "SQUARE", "TANH",
})
BINARY = frozenset({
    "ATAN2", "DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL",
    "LOGICAL_AND", "LESS", "LESS_EQUAL", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW",
    "SQUARED_DIFFERENCE", "SUB",
})
GPU_OPS = ONE_RUNTIME_INPUT | BINARY | frozenset({
    "ADD", "ADD_N", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CAST", "CONCATENATION", "CONV_2D",
    "CUMSUM", "DENSIFY", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "DYNAMIC_UPDATE_SLICE",
    "EMBEDDING_LOOKUP", "FULLY_CONNECTED", "GATHER", "LEAKY_RELU", "LSTM", "MAX_POOL_2D",
    "MUL", "ONE_HOT", "PACK", "PRELU", "RELU", "RELU6", "RELU_N1_TO_1", "SELECT",
    "SELECT_V2", "SLICE", "SOFTMAX", "SPLIT", "SPLIT_V", "STRIDED_SLICE", "TRANSPOSE_CONV",
    "STABLEHLO_CLAMP",
})
GPU_CUSTOM_OPS = frozenset({
    "Convolution2DTransposeBias", "MaxPoolingWithArgmax2D", "MaxUnpooling2D", "Resampler",
})
GPU_CASTS = {
    ("BOOL", "FLOAT16"), ("BOOL", "FLOAT32"), ("FLOAT16", "BOOL"), ("FLOAT32", "BOOL"),
    ("FLOAT32", "FLOAT32"), ("FLOAT32", "INT32"), ("INT32", "FLOAT32"), ("INT32", "INT32"),
}


@dataclass
class TfliteOp:
    """One op of the main subgraph."""

    index: int
    op: str
    delegated: bool | None  # None when the interpreter could not load the file
    partition: int | None  # XNNPACK partition (0-based), None on reference kernels
    gpu_issue: str | None  # why the GPU delegate would reject it, None when it takes it
    onnx_nodes: list[dict] = field(default_factory=list)  # {"name", "op_type"}, graph order
    outputs: list[str] = field(default_factory=list)  # output tensor names


@dataclass
class DelegateReport:
    ops: list[TfliteOp]
    partitions: int | None
    subgraphs: int
    error: str | None = None  # why XNNPACK delegation is unknown

    @property
    def reference_ops(self) -> list[TfliteOp]:
        return [o for o in self.ops if o.delegated is False]

    @property
    def gpu_incompatible(self) -> list[TfliteOp]:
        return [o for o in self.ops if o.gpu_issue]

    def summary(self) -> str:
        """One line: XNNPACK coverage and GPU-incompatible ops, with their ONNX nodes."""
        if self.error:
            head = f"XNNPACK coverage unknown ({self.error})"
        else:
            head = (f"{len(self.ops) - len(self.reference_ops)}/{len(self.ops)} ops delegated "
                    f"to XNNPACK in {self.partitions} partition(s)")
            if self.reference_ops:
                head += "; on reference kernels: " + _listing(self.reference_ops)
        gpu = self.gpu_incompatible
        return head + (f"; {len(gpu)} GPU-incompatible: " + _listing(gpu) if gpu
                       else "; all GPU-compatible")

    def to_json(self) -> dict:
        return {
            "what": "ops of the main subgraph of the float32 .tflite: delegated = taken by "
                    "the XNNPACK CPU delegate (else TFLite reference kernels); gpu_issue = "
                    "why the GPU delegate would reject it (static check); onnx_nodes = the "
                    "ONNX nodes (after the converter's rewrites) the op computes",
            "summary": self.summary(),
            "ops_total": len(self.ops),
            "ops_delegated": None if self.error else len(self.ops) - len(self.reference_ops),
            "xnnpack_partitions": self.partitions,
            "subgraphs": self.subgraphs,
            "error": self.error,
            "ops": [asdict(o) for o in self.ops],
        }


def _listing(ops: list[TfliteOp], limit: int = 5) -> str:
    def one(o: TfliteOp) -> str:
        nodes = ", ".join(f"'{n['name']}' ({n['op_type']})" for n in o.onnx_nodes[:2])
        return f"{o.op} #{o.index}" + (f" from node {nodes}" if nodes else "")

    text = "; ".join(one(o) for o in ops[:limit])
    return text + (f"; ... {len(ops) - limit} more" if len(ops) > limit else "")


# --- XNNPACK --------------------------------------------------------------------------------
def xnnpack_partitions(content: bytes | None, path: str | None = None
                       ) -> tuple[list[int | None], int]:
    """For each op of the main subgraph, the XNNPACK partition that computes it (None: a
    reference kernel), and the number of partitions; of the file at `path` when given (the
    interpreter maps it: no copy of its bytes)."""
    from ai_edge_litert.interpreter import Interpreter

    if path is not None:
        interpreter = Interpreter(model_path=path, num_threads=1)
    else:
        interpreter = Interpreter(model_content=content, num_threads=1)
    try:
        interpreter.allocate_tensors()  # the default delegate is applied here
    except RuntimeError:
        if not _sized_for_windows(interpreter):
            raise
        interpreter.allocate_tensors()
    details = interpreter._get_ops_details()
    kernels = [d for d in details if d["op_name"] == "DELEGATE"]
    originals = [d for d in details if d["op_name"] != "DELEGATE"]
    producer = {int(t): d["index"] for d in originals for t in d["outputs"]}
    inputs_of = {d["index"]: [int(t) for t in d["inputs"] if t >= 0] for d in originals}
    partition: list[int | None] = [None] * len(originals)
    for number, kernel in enumerate(kernels):
        # A partition is closed: its outputs are computed from its inputs alone.
        boundary = {int(t) for t in kernel["inputs"]}
        pending = [int(t) for t in kernel["outputs"]]
        while pending:
            op = producer.get(pending.pop())
            if op is None or partition[op] is not None:
                continue
            partition[op] = number
            pending += [t for t in inputs_of[op] if t not in boundary]
    return partition, len(kernels)


def _sized_for_windows(interpreter) -> bool:
    """Gives the inputs' run-time dims past the batch RUN_TIME_DIM (they are 1 until set,
    too small for a network's strided windows: its XNNPACK subgraph fails to reshape);
    whether there were any. The partitions do not depend on the sizes."""
    resized = False
    for detail in interpreter.get_input_details():
        signature = detail["shape_signature"]
        if any(d < 0 for d in signature[1:]):
            shape = [1 if a == 0 and d < 0 else RUN_TIME_DIM if d < 0 else d
                     for a, d in enumerate(signature)]
            interpreter.resize_tensor_input(detail["index"], shape, strict=False)
            resized = True
    return resized


# --- GPU ------------------------------------------------------------------------------------
@dataclass
class _Operand:
    dtype: str
    shape: tuple
    const: bool


def _gpu_issue(op: str, ins: list[_Operand], outs: list[_Operand], options) -> str | None:
    """Why the GPU delegate's compatibility rules reject this op, or None."""
    if op not in GPU_OPS:
        return f"{op} is not supported by the GPU delegate"
    runtime = sum(not i.const for i in ins)
    if op in ONE_RUNTIME_INPUT and runtime != 1:
        return f"{op} needs 1 run-time input, has {runtime}"
    if op in BINARY and not (len(ins) == 2 and runtime >= 1):
        return f"{op} needs 2 inputs, at most one constant"
    if op in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD") and not (
            len(ins) > 1 and ins[1].const and ins[1].dtype == "INT32"):
        return f"{op} needs constant int32 axes"
    if op in ("PAD", "PADV2", "MIRROR_PAD"):
        if op == "MIRROR_PAD" and options.mode != schema.MirrorPadMode.REFLECT:
            return "MIRROR_PAD supports only REFLECT mode"
        if not ins[1].const or len(ins[1].shape) != 2 or ins[1].shape[0] not in (3, 4):
            return f"{op} needs constant 3x2 or 4x2 paddings (rank 3 or 4)"
    if op in ("SLICE", "STRIDED_SLICE") and len(ins[0].shape) not in (3, 4):
        return f"{op} supports rank 3 or 4 only (rank {len(ins[0].shape)})"
    if op == "STRIDED_SLICE" and (
            options.ellipsisMask or options.newAxisMask or options.shrinkAxisMask):
        return "STRIDED_SLICE with ellipsis, new-axis or shrink-axis masks"
    if op == "GATHER" and (ins[0].dtype == "INT32" or len(ins[1].shape) != 1
                           or ins[1].dtype != "INT32"):
        return "GATHER needs non-int32 data and 1-D int32 indices"
    if op == "CAST" and (ins[0].dtype, outs[0].dtype) not in GPU_CASTS:
        return f"CAST {ins[0].dtype} -> {outs[0].dtype} is not supported"
    if op == "SOFTMAX" and options.beta != 1:
        return "SOFTMAX with beta != 1"
    if op == "FULLY_CONNECTED" and (ins[0].const or runtime > 2):
        return "FULLY_CONNECTED needs a run-time first input and at most 2 run-time inputs"
    if op == "MUL" and len(ins) == 2 and len(ins[0].shape) == len(ins[1].shape):
        a, b = ins[0].shape, ins[1].shape
        if any(x < y for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b)):
            return "MUL needs one input at least as large as the other in every axis"
    return None


def _operands(model, subgraph, indices) -> list[_Operand]:
    found = []
    for t in indices:
        if t < 0:
            continue
        tensor = subgraph.tensors[t]
        buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
        const = buffer is not None and (
            (buffer.data is not None and len(buffer.data) > 0) or buffer.size > 0)
        shape = tuple(tensor.shape) if tensor.shape is not None else ()
        found.append(_Operand(DTYPE_NAMES.get(tensor.type, str(tensor.type)), shape, const))
    return found


def _indices(array) -> list[int]:
    return [] if array is None else [int(t) for t in array]


def _main_ops(model) -> Iterator[tuple[str, object]]:
    for op in model.subgraphs[0].operators or []:
        yield op_name(model, op), op


def gpu_issues(model) -> list[str | None]:
    """For each op of the main subgraph of `model` (a schema.ModelT), the GPU issue."""
    subgraph = model.subgraphs[0]
    issues = []
    for name, op in _main_ops(model):
        if name in GPU_CUSTOM_OPS:
            issues.append(None)
            continue
        ins = _operands(model, subgraph, _indices(op.inputs))
        outs = _operands(model, subgraph, _indices(op.outputs))
        issues.append(_gpu_issue(name, ins, outs, op.builtinOptions))
    return issues


# --- ONNX origins ---------------------------------------------------------------------------
def onnx_origins(model, result, graph) -> list[list[dict]]:
    """For each op of the main subgraph, the ONNX nodes it computes, in graph order: the
    nodes whose handlers created the Keras layers named in its output tensors' names (TF's
    converter joins the names of the ops it fuses with ';'), else, for a model output, the
    node producing that output."""
    from onnx2tf_alt.export.tflite import layer_owners

    owners = {layer: node.name for layer, node in layer_owners(result, graph).items()}
    op_types = {node.name: node.op_type for node in graph.nodes}
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    producer = {o: node.name for node in graph.nodes for o in node.outputs if o}
    subgraph = model.subgraphs[0]
    by_output = {}
    for signature in model.signatureDefs or []:
        for entry in signature.outputs or []:
            key = entry.name.decode()
            onnx_name = dict(zip(result.output_keys, graph.outputs)).get(key, key)
            by_output[entry.tensorIndex] = producer.get(onnx_name)
    origins = []
    for _, op in _main_ops(model):
        names = set()
        for t in _indices(op.outputs):
            tensor_name = subgraph.tensors[t].name.decode()
            for part in name_parts(tensor_name, lambda n: n.split(":")[0] in producer
                                   or _direct_owner(n, order) is not None):
                names.update(owners[p] for p in part.split("/") if p in owners)
                if part.split(":")[0] in producer:  # tensors named like ONNX values (-coion)
                    names.add(producer[part.split(":")[0]])
                elif _direct_owner(part, order):  # the direct writer's "<node>/<what>"
                    names.add(_direct_owner(part, order))
            if not names and by_output.get(t):
                names.add(by_output[t])
        origins.append([{"name": n, "op_type": op_types[n]}
                        for n in sorted(names, key=order.get)])
    return origins


def name_parts(tensor_name: str, known) -> list[str]:
    """The names a fused op's tensor name joins with ';', where a name may hold ';' itself
    (tf2onnx names nodes and values 'model/a/conv;model/a/conv'): parts joined back where
    the join is `known` (a predicate), the longest join first."""
    parts = tensor_name.split(";")
    found, start = [], 0
    while start < len(parts):
        end = next((end for end in range(len(parts), start + 1, -1)
                    if known(";".join(parts[start:end]))), start + 1)
        found.append(";".join(parts[start:end]))
        start = end
    return found


def _direct_owner(tensor_name: str, nodes) -> str | None:
    """The node of a direct writer's tensor "<node name>/<what>" (node names hold "/" too:
    the longest prefix that names a node), or None."""
    name = tensor_name
    while "/" in name:
        name = name.rsplit("/", 1)[0]
        if name in nodes:
            return name
    return None


# --- the report -----------------------------------------------------------------------------
def analyze(content: bytes, result=None, graph=None, path: str | None = None,
            unavailable: str | None = None, model=None) -> DelegateReport:
    """The delegate report of a .tflite flatbuffer; with the BuildResult and the Graph it
    was converted from, each op names its ONNX nodes. A file over XNNPACK_ANALYSIS_BYTES
    is not loaded (XNNPACK would pack a second copy of its weights in memory): its report
    gives the GPU check and says why XNNPACK's coverage is unknown. `path`: the file
    `content` was read from (the interpreter then maps it instead of copying `content`).
    `unavailable`: why XNNPACK is not tried on it (the report's error). `model`: `content`
    already unpacked (schema.ModelT), only read here."""
    model = unpack_model(content) if model is None else model
    subgraph = model.subgraphs[0]
    issues = gpu_issues(model)
    origins = (onnx_origins(model, result, graph) if result is not None
               else [[] for _ in issues])
    error = None
    try:
        if unavailable is not None:
            raise RuntimeError(unavailable)
        if len(content) > XNNPACK_ANALYSIS_BYTES:
            raise MemoryError(f"not loaded: XNNPACK would pack a second copy of the "
                              f"{len(content) / 2**30:.1f} GiB file's weights in memory")
        partition, count = xnnpack_partitions(None if path else bytes(content), path)
    except Exception as exc:  # noqa: BLE001 - e.g. Select TF ops: reported, not fatal
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        partition, count = [None] * len(issues), None
    ops = []
    for index, (name, op) in enumerate(_main_ops(model)):
        ops.append(TfliteOp(
            index=index,
            op=name,
            delegated=None if error else partition[index] is not None,
            partition=partition[index],
            gpu_issue=issues[index],
            onnx_nodes=origins[index],
            outputs=[subgraph.tensors[t].name.decode() for t in _indices(op.outputs)],
        ))
    return DelegateReport(ops=ops, partitions=count, subgraphs=len(model.subgraphs),
                          error=error)


def write_delegate_report(converted, folder: str, stem: str, model=None) -> str:
    """Analyze `<stem>_float32.tflite` in `folder` (`model`: that file unpacked, if at
    hand), write `<stem>_delegates.json` beside it, log the one-line summary; returns the
    file name."""
    path = os.path.join(folder, f"{stem}_float32.tflite")
    report = analyze(mapped(path), converted.tflite_result(), converted.graph, path,
                     model=model)
    name = f"{stem}_delegates.json"
    with open(os.path.join(folder, name), "w") as f:
        json.dump(report.to_json(), f, indent=1, default=_plain)
    # the run's closing summary (export/summary.py) shows it once, from the file
    log.debug("delegates (%s_float32.tflite): %s", stem, report.summary())
    if log.isEnabledFor(logging.DEBUG):
        found = tflite_transposes(report.ops, converted.graph, converted.plan)
        log.debug("TFLite TRANSPOSE ops by origin: %s", dict(found.most_common()) or "none")
    return name


def write_signature_delegate_report(built: dict, folder: str, stem: str) -> str:
    """`write_delegate_report` for a file of several signatures ({name: Converted}): one
    report per signature under "signatures". The runtime lists the ops of the first subgraph
    only, and XNNPACK packs the weights of every subgraph it is given (a prefill and a
    decode signature: twice the weights in memory), so each signature is analyzed in a copy
    of the file that holds its subgraph alone, written beside it a weight at a time and
    mapped (not for a file past XNNPACK_ANALYSIS_BYTES, nor with control flow, which names
    subgraphs by their index: said in its report's error)."""
    path = os.path.join(folder, f"{stem}_float32.tflite")
    content = mapped(path)
    model = unpack_model(content)  # buffers are views of the mapped file
    reports, calls = {}, _calls(model)
    for name, converted in built.items():
        index = next(d.subgraphIndex for d in model.signatureDefs
                     if d.signatureKey.decode() == name)
        result, graph = converted.tflite_result(), converted.graph
        if len(model.subgraphs) == 1 or (index == 0 and calls):
            report = analyze(content, result, graph, path)
        else:
            report = _analyzed_alone(model, index, content, calls, result, graph,
                                     os.path.join(folder, f".{stem}_{name}.tflite"))
        reports[name] = report.to_json()
        log.debug("delegates (%s_float32.tflite, signature %s): %s", stem, name,
                  report.summary())
    file_name = f"{stem}_delegates.json"
    with open(os.path.join(folder, file_name), "w") as f:
        json.dump({"signatures": reports}, f, indent=1, default=_plain)
    return file_name


def _analyzed_alone(model, index: int, content, calls: set[str], result, graph, scratch: str
                    ) -> DelegateReport:
    """The report of subgraph `index` of `model` (unpacked from `content`, the file's
    memory map; `calls`: its control-flow ops), analyzed in a copy that holds it alone (the
    runtime lists the first subgraph; XNNPACK packs the weights of each), written to
    `scratch` (removed after)."""
    import copy
    import mmap

    from onnx2tf_alt.tflite.late_weights import Bound, LazyBuffer

    moved = copy.copy(model)
    if calls:  # its bodies are subgraphs named by index: listed in place, not run
        order = [index, *(k for k in range(len(model.subgraphs)) if k != index)]
    else:
        order = [index]
    moved.subgraphs = [model.subgraphs[k] for k in order]
    moved.signatureDefs = []
    for definition in model.signatureDefs:
        if definition.subgraphIndex in order:
            definition = copy.copy(definition)
            definition.subgraphIndex = order.index(definition.subgraphIndex)
            moved.signatureDefs.append(definition)
    size = len(content)
    if calls or size > XNNPACK_ANALYSIS_BYTES:
        moved.buffers = [schema.BufferT() for _ in model.buffers]  # listed, not run
        why = ("not analyzed: a signature other than the first, with control flow" if calls
               else f"not loaded: XNNPACK would pack a second copy of the {size / 2**30:.1f} "
               "GiB file's weights in memory")
        report = analyze(pack_model(moved), result, graph, unavailable=why)
        report.subgraphs = len(model.subgraphs)
        return report
    moved.buffers = [LazyBuffer(make=lambda data=b.data: np.asarray(data), nbytes=len(b.data))
                     if b.data is not None and len(b.data) else b for b in model.buffers]
    try:
        Bound(moved, {}).write(scratch)
        if isinstance(content, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            content.madvise(mmap.MADV_DONTNEED)  # the pages the copy read: not held twice
        report = analyze(mapped(scratch), result, graph, scratch)
        report.subgraphs = len(model.subgraphs)  # the file's, not the copy's
        return report
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


def _calls(model) -> set[str]:
    """The control-flow ops of `model` (their bodies are subgraphs named by index)."""
    return {"WHILE", "IF", "CALL_ONCE"} & {op_name(model, op) for g in model.subgraphs
                                          for op in g.operators}


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)
