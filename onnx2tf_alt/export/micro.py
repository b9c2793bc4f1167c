"""`--target micro`: the full-integer .tflite checked on TensorFlow Lite for Microcontrollers
(the `tflite-micro` package's interpreter), and `<stem>_micro.json`.

The check refuses a file (ConversionError, exit 1, naming the ONNX nodes and the way out)
when an op has no TFLite Micro kernel, computes in float, or has a run-time shape, or when
TFLite Micro cannot prepare or run it. Otherwise it measures, with the real interpreter:
the smallest tensor arena that works (bisection to the byte), and the outputs on the
held-out calibration samples against ai-edge-litert's on the same file. TFLite Micro runs
in a process of its own (micro_worker.py): a failed allocation can crash it.

TFLite Micro's op resolver looks ops up by builtin code only, not by version: what a newer
version adds (int16 activations, per-channel weights, ...) is checked by each kernel's
Prepare, which the run exercises.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from onnx2tf_alt.errors import ConversionError, InputError
from onnx2tf_alt.export.delegates import DTYPE_NAMES, onnx_origins
from onnx2tf_alt.interrupts import checkpoint
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, op_name, schema, unpack_model
from onnx2tf_alt.tflite.run import as_input

log = logging.getLogger("onnx2tf_alt")

TFLITE_MICRO = "tflite-micro==0.dev20261023182759"  # the version the table below was measured on
# Builtin op -> the MicroMutableOpResolver call that registers its kernel in firmware
# (micro_mutable_op_resolver.h). Exactly the builtins TFLite Micro's Python interpreter
# registers: tests/export/test_micro.py probes every builtin code against it.
MICRO_RESOLVER = {
    "ABS": "AddAbs", "ADD": "AddAdd", "ADD_N": "AddAddN", "ARG_MAX": "AddArgMax",
    "ARG_MIN": "AddArgMin", "ASSIGN_VARIABLE": "AddAssignVariable",
    "AVERAGE_POOL_2D": "AddAveragePool2D", "BATCH_MATMUL": "AddBatchMatMul",
    "BATCH_TO_SPACE_ND": "AddBatchToSpaceNd", "BROADCAST_ARGS": "AddBroadcastArgs",
    "BROADCAST_TO": "AddBroadcastTo", "CALL_ONCE": "AddCallOnce", "CAST": "AddCast",
    "CEIL": "AddCeil", "CONCATENATION": "AddConcatenation", "CONV_2D": "AddConv2D",
    "COS": "AddCos", "CUMSUM": "AddCumSum", "DEPTH_TO_SPACE": "AddDepthToSpace",
    "DEPTHWISE_CONV_2D": "AddDepthwiseConv2D", "DEQUANTIZE": "AddDequantize", "DIV": "AddDiv",
    "DYNAMIC_UPDATE_SLICE": "AddDynamicUpdateSlice", "ELU": "AddElu",
    "EMBEDDING_LOOKUP": "AddEmbeddingLookup", "EQUAL": "AddEqual", "EXP": "AddExp",
    "EXPAND_DIMS": "AddExpandDims", "FILL": "AddFill", "FLOOR": "AddFloor",
    "FLOOR_DIV": "AddFloorDiv", "FLOOR_MOD": "AddFloorMod",
    "FULLY_CONNECTED": "AddFullyConnected", "GATHER": "AddGather", "GATHER_ND": "AddGatherNd",
    "GREATER": "AddGreater", "GREATER_EQUAL": "AddGreaterEqual", "HARD_SWISH": "AddHardSwish",
    "IF": "AddIf", "L2_NORMALIZATION": "AddL2Normalization", "L2_POOL_2D": "AddL2Pool2D",
    "LEAKY_RELU": "AddLeakyRelu", "LESS": "AddLess", "LESS_EQUAL": "AddLessEqual",
    "LOG": "AddLog", "LOGICAL_AND": "AddLogicalAnd", "LOGICAL_NOT": "AddLogicalNot",
    "LOGICAL_OR": "AddLogicalOr", "LOGISTIC": "AddLogistic", "LOG_SOFTMAX": "AddLogSoftmax",
    "MAXIMUM": "AddMaximum", "MAX_POOL_2D": "AddMaxPool2D", "MEAN": "AddMean",
    "MINIMUM": "AddMinimum", "MIRROR_PAD": "AddMirrorPad", "MUL": "AddMul", "NEG": "AddNeg",
    "NOT_EQUAL": "AddNotEqual", "PACK": "AddPack", "PAD": "AddPad", "PADV2": "AddPadV2",
    "PRELU": "AddPrelu", "QUANTIZE": "AddQuantize", "READ_VARIABLE": "AddReadVariable",
    "REDUCE_ALL": "AddReduceAll", "REDUCE_MAX": "AddReduceMax", "REDUCE_MIN": "AddReduceMin",
    "RELU": "AddRelu", "RELU6": "AddRelu6", "RESHAPE": "AddReshape",
    "RESIZE_BILINEAR": "AddResizeBilinear",
    "RESIZE_NEAREST_NEIGHBOR": "AddResizeNearestNeighbor", "REVERSE_V2": "AddReverseV2",
    "ROUND": "AddRound", "RSQRT": "AddRsqrt", "SELECT_V2": "AddSelectV2", "SHAPE": "AddShape",
    "SIN": "AddSin", "SLICE": "AddSlice", "SOFTMAX": "AddSoftmax",
    "SPACE_TO_BATCH_ND": "AddSpaceToBatchNd", "SPACE_TO_DEPTH": "AddSpaceToDepth",
    "SPLIT": "AddSplit", "SPLIT_V": "AddSplitV", "SQRT": "AddSqrt", "SQUARE": "AddSquare",
    "SQUARED_DIFFERENCE": "AddSquaredDifference", "SQUEEZE": "AddSqueeze",
    "STRIDED_SLICE": "AddStridedSlice", "SUB": "AddSub", "SUM": "AddSum", "SVDF": "AddSvdf",
    "TANH": "AddTanh", "TRANSPOSE": "AddTranspose", "TRANSPOSE_CONV": "AddTransposeConv",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "AddUnidirectionalSequenceLSTM", "UNPACK": "AddUnpack",
    "VAR_HANDLE": "AddVarHandle", "WHILE": "AddWhile", "ZEROS_LIKE": "AddZerosLike",
}
# The way out for an op TFLite Micro cannot run, where one was measured (docs/micro.md)
OP_HINTS = {
    "GELU": "-rtpo GeLU writes it as MUL, ADD, DIV, MINIMUM and MAXIMUM ops, which run there",
    "POW": "-rtpo Pow writes a constant integer exponent as MUL ops, which run there",
    "TILE": "a Tile of size-1 axes is an Expand in the ONNX graph (BROADCAST_TO runs there)",
    "NEG": "a Mul by -1 in the ONNX graph quantizes (and folds into a convolution before it)",
    "ARG_MAX": "TFLite Micro's ARG_MAX writes int32 only and ONNX's ArgMax is int64: take the "
               "argmax outside the model (-onimc up to its input)",
    "EXP": "TFLite Micro has this kernel in float only",
    "SQRT": "TFLite Micro has this kernel in float only",
}
QUANTIZERS = frozenset({"QUANTIZE", "DEQUANTIZE"})
ARENA_LIMIT = 1 << 30  # past this, a failed allocation is not a matter of arena size
OUT_OF_MEMORY = re.compile(r"Failed to (allocate|resize)|missing: \d+")
FAILED_NODE = re.compile(r"Node (\S+) \(number (\d+)\) failed to (\w+)")
NO_KERNEL = re.compile(r"Didn't find op for builtin opcode '([^']+)'")
RECORDED = re.compile(r"Arena allocation (total|head|tail) (\d+) bytes")
LARGEST_TENSORS = 5
# Most microcontrollers have 2 MB of SRAM or less (i.MX RT1170: 2 MB, STM32H7: up to 1.4 MB,
# ESP32-S3 and nRF5340: 512 KB): an arena past it needs external RAM, where the board has any
MICRO_SRAM_BYTES = 2 << 20
# Boards add at most a few tens of MB of external SDRAM / PSRAM (8 to 32 MB): a tensor past
# this fits none, and quantizing and measuring such a model takes minutes for nothing
MICRO_REFUSE_BYTES = 64 << 20
BYTES = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "FLOAT16": 2, "INT32": 4, "FLOAT32": 4,
         "INT64": 8}
NO_HELD_OUT_SAMPLES = 2  # seeded random int8 inputs when no held-out sample exists


def require_tflite_micro() -> None:
    """InputError, before converting, when the `tflite-micro` package is missing."""
    import importlib.util

    if importlib.util.find_spec("tflite_micro") is None:
        raise InputError(f"--target micro runs TFLite Micro's interpreter, from the "
                         f"tflite-micro package: pip install '{TFLITE_MICRO}' (or the "
                         "onnx2tf_alt[micro] extra).")


def tflite_micro_version() -> str:
    from tflite_micro.python.tflite_micro._version import __version__

    return __version__


# --- TFLite Micro's interpreter, in its own process ----------------------------------------
class MicroInterpreter:
    """A micro_worker.py process and a scratch folder; `attempt` sends it one command."""

    def __init__(self):
        self._folder = tempfile.TemporaryDirectory(prefix="onnx2tf_alt_micro_")
        self._process: subprocess.Popen | None = None
        self._models: dict[bytes, str] = {}

    def __enter__(self):
        return self

    def __exit__(self, *_) -> None:
        self._stop()
        self._folder.cleanup()

    def _stop(self) -> None:
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait()
            self._process = None

    def path(self, name: str) -> str:
        return os.path.join(self._folder.name, name)

    def _model_path(self, content: bytes) -> str:
        if content not in self._models:
            self._models[content] = self.path(f"model{len(self._models)}.tflite")
            with open(self._models[content], "wb") as f:
                f.write(content)
        return self._models[content]

    def attempt(self, content: bytes, arena: int, **run) -> tuple[bool, str]:
        """(whether TFLite Micro allocated `content` in an arena of `arena` bytes, and ran
        it when `run` gives feeds; what it printed). A crash is a failure."""
        checkpoint()  # a signal stops the worker too: stop here, not at the next attempt
        if self._process is None:
            worker = os.path.join(os.path.dirname(__file__), "micro_worker.py")
            self._process = subprocess.Popen(
                [sys.executable, "-I", worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True)
        log_path = self.path("log.txt")
        command = {"model": self._model_path(content), "arena": int(arena), "log": log_path,
                   **run}
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        answer = json.loads(line) if line else None
        if answer is None:  # the process died: start a fresh one for the next command
            code = self._process.wait()
            self._process = None
            answer = {"ok": False, "error": f"TFLite Micro crashed (exit code {code})"}
        with open(log_path, errors="replace") as f:
            printed = f.read()
        return answer["ok"], "\n".join(filter(None, (printed.strip(), answer.get("error"))))

    def run(self, content: bytes, arena: int, feeds: list[list[np.ndarray]], outputs: int
            ) -> tuple[list[list[np.ndarray]] | None, str]:
        """The outputs (subgraph order) of `content` on each sample of `feeds` (arrays in
        the subgraph's input order), or None; and what TFLite Micro printed."""
        arrays = {f"s{k}_i{j}": a for k, sample in enumerate(feeds) for j, a in enumerate(sample)}
        np.savez(self.path("feeds.npz"), **arrays)
        ok, printed = self.attempt(
            content, arena, feeds=self.path("feeds.npz"), samples=len(feeds),
            inputs=len(feeds[0]), outputs=outputs, results=self.path("results.npz"))
        if not ok:
            return None, printed
        with np.load(self.path("results.npz")) as found:
            return [[found[f"s{k}_o{j}"] for j in range(outputs)]
                    for k in range(len(feeds))], printed


def smallest_arena(interpreter: MicroInterpreter, content: bytes, start: int = 1 << 18
                   ) -> tuple[int | None, int, str]:
    """(the smallest arena in bytes TFLite Micro allocates `content` in, or None when it
    fails for another reason than memory; the number of attempts; what the last failure
    printed). Doubles from `start` until an allocation succeeds, then bisects to the byte:
    the size returned works and one byte less does not."""
    low, high, attempts, printed = 0, start, 0, ""
    while True:
        ok, text = interpreter.attempt(content, high)
        attempts += 1
        if ok:
            break
        printed = text
        if not OUT_OF_MEMORY.search(text) or high >= ARENA_LIMIT:
            return None, attempts, text
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        ok, text = interpreter.attempt(content, middle)
        attempts += 1
        if ok:
            high = middle
        else:
            low, printed = middle, text
    return high, attempts, printed


# --- the report ---------------------------------------------------------------------------
@dataclass
class MicroReport:
    file: str
    tflite_micro: str
    flatbuffer_bytes: int
    arena_bytes: int
    arena_attempts: int
    recorded_arena: dict  # the recording allocator's own account at that size
    samples: int
    sample_source: str
    # per output, against ai-edge-litert's default kernels and its reference kernels: the
    # largest difference (in LSB for integer outputs) and how many values differ
    outputs: dict
    outputs_reference_kernels: dict
    litert_error: str | None  # why ai-edge-litert could not run the file (nothing compared)
    inputs: list
    largest_tensors: list
    ops: list
    resolver: list  # the C++ lines that register these kernels in firmware
    warnings: list  # e.g. an arena larger than a microcontroller's SRAM (arena_warning)

    @property
    def bit_exact(self) -> bool | None:
        return None if self.litert_error else _exact(self.outputs)

    def summary(self) -> str:
        head = (f"{self.file} runs on TFLite Micro: arena {self.arena_bytes} bytes, "
                f"flatbuffer {self.flatbuffer_bytes} bytes, {len(self.ops)} ops")
        if self.litert_error:
            return f"{head}; outputs not compared: ai-edge-litert cannot run it"
        return (f"{head}; outputs on {self.samples} {self.sample_source} "
                f"{_agreement(self.outputs)} with ai-edge-litert, "
                f"{_agreement(self.outputs_reference_kernels)} with its reference kernels")

    def to_json(self) -> dict:
        return {
            "what": "the full-integer .tflite on TensorFlow Lite for Microcontrollers: "
                    "arena_bytes = the smallest tensor arena its interpreter allocates the "
                    "model in (bisection: one byte less fails); flatbuffer_bytes = the "
                    "file (flash); outputs = its outputs against ai-edge-litert's on the "
                    "same file and inputs; ops = each op with its MicroMutableOpResolver "
                    "call and the ONNX nodes it computes; warnings = what a microcontroller "
                    "may not hold",
            "summary": self.summary(),
            "bit_exact": self.bit_exact,
            **asdict(self),
        }

    def write(self, folder: str, stem: str) -> str:
        name = f"{stem}_micro.json"
        with open(os.path.join(folder, name), "w") as f:
            json.dump(self.to_json(), f, indent=1, default=_plain)
        return name


def _exact(outputs: dict) -> bool:
    return all(o["differing_values"] == 0 for o in outputs.values())


def _agreement(outputs: dict) -> str:
    if _exact(outputs):
        return "bit-exact"
    worst = max(o["max_abs_diff"] for o in outputs.values())
    unit = " LSB" if all(o["unit"] == "LSB" for o in outputs.values()) else ""
    return f"within {worst:g}{unit}"


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)


# --- what TFLite Micro cannot take ----------------------------------------------------------
def _where(origins: list[dict]) -> str:
    nodes = ", ".join(f"node '{n['name']}' ({n['op_type']})" for n in origins[:3])
    return f" from {nodes}" if nodes else ""


def static_shape_hint(name: str, shape) -> str:
    """What fixes a model input of run-time shape (ONNX layout; unknown dims shown as 1)."""
    known = [isinstance(d, int) and d > 0 for d in shape or ()]
    dims = ",".join(str(d) if k else "1" for d, k in zip(shape or (), known))
    batch = "-b 1 or " if known and not known[0] else ""
    return f"fix it with {batch}-ois {name}:{dims or 'D1,D2,...'}"


def dynamic_inputs(graph) -> list[str]:
    """The model inputs of `graph` (after -b / -ois) without a static shape, one line each:
    checked before quantizing, since TFLite Micro would refuse the file."""
    lines = []
    for name in graph.inputs:
        shape = graph.shapes.get(name)
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            shown = "unknown" if shape is None else [d if isinstance(d, int) else "?"
                                                     for d in shape]
            lines.append(f"input '{name}' has a run-time shape {shown}: TFLite Micro plans "
                         f"every tensor before it runs; {static_shape_hint(name, shape)}")
    return lines


def check_micro_shapes(graph, name: str) -> None:
    """What the shapes of `graph` (after -b / -ois) rule out before quantizing, which takes
    minutes on large inputs: ConversionError when an input has a run-time shape
    (dynamic_inputs); InputError when a model input or output alone is more than
    MICRO_REFUSE_BYTES at one byte per element (the arena holds it, whatever the ops between),
    a warning when it is more than MICRO_SRAM_BYTES."""
    lines = dynamic_inputs(graph)
    if lines:
        raise _refuse(name, lines)
    edges = sorted(((_elements(graph.shapes[t]), t) for t in {*graph.inputs, *graph.outputs}
                    if graph.shapes.get(t) is not None), reverse=True)
    if not edges or edges[0][0] <= MICRO_SRAM_BYTES:
        return
    size, tensor = edges[0]
    kind = "input" if tensor in graph.inputs else "output"
    head = (f"{name}: the model {kind} '{tensor}' {list(graph.shapes[tensor])} alone needs "
            f"{size} bytes of tensor arena in int8")
    if size > MICRO_REFUSE_BYTES:
        raise InputError(f"--target micro: {head}, more than a microcontroller board holds "
                         f"(external RAM included, {MICRO_REFUSE_BYTES >> 20} MiB at most). "
                         f"{smaller_input_hint(graph)}.")
    log.warning("micro: %s, more than the %d MiB of SRAM of a microcontroller: expect an arena "
                "that needs external RAM, and a slow quantization. %s.", head,
                MICRO_SRAM_BYTES >> 20, smaller_input_hint(graph))


def smaller_input_hint(graph) -> str:
    """The way out of an arena too large: the model's inputs smaller (ONNX layout)."""
    given = " ".join(f"{t}:{','.join(map(str, graph.shapes[t]))}" for t in graph.inputs
                     if graph.shapes.get(t) is not None)
    batched = any(graph.shapes[t] and graph.shapes[t][0] > 1 for t in graph.inputs
                  if graph.shapes.get(t) is not None)
    return (f"Give the model smaller inputs with -ois (now {given})"
            + (", or a batch of 1 with -b 1" if batched else ""))


def arena_warning(name: str, arena: int, largest: list[str], hint: str) -> str | None:
    """The warning for an arena of `arena` bytes more than MICRO_SRAM_BYTES, naming the
    `largest` tensors (one line each) and the way out (`hint`); None when it fits."""
    if arena <= MICRO_SRAM_BYTES:
        return None
    return (f"{name} needs a tensor arena of {arena} bytes ({arena / (1 << 20):.1f} MiB), more "
            f"than the {MICRO_SRAM_BYTES >> 20} MiB of SRAM of a microcontroller; its largest "
            f"tensors: {'; '.join(largest)}. {hint}.")


def _elements(shape) -> int:
    return int(np.prod([d if isinstance(d, int) and d > 0 else 1 for d in shape],
                       dtype=np.int64))


def blocking_ops(model, origins: list[list[dict]], input_names: dict[int, str],
                 onnx_shapes: dict | None = None) -> list[str]:
    """Why TFLite Micro cannot take `model` (schema.ModelT), read from the flatbuffer: one
    line per op without a kernel, op computing in float, model input of run-time shape, or
    op that makes a run-time shape from static ones; each with its ONNX nodes and the way
    out. `input_names`: tensor index -> ONNX input name; `onnx_shapes`: ONNX input name ->
    its shape in ONNX layout, for the hint."""
    subgraph = model.subgraphs[0]
    dynamic = {i for i, t in enumerate(subgraph.tensors)
               if t.shapeSignature is not None and -1 in list(t.shapeSignature)}
    lines = []
    for tensor in sorted(dynamic & set(subgraph.inputs)):
        name = input_names.get(tensor, subgraph.tensors[tensor].name.decode())
        shape = [int(d) for d in subgraph.tensors[tensor].shapeSignature]
        hint = static_shape_hint(name, (onnx_shapes or {}).get(name))
        lines.append(f"input '{name}' has a run-time shape {shape}: TFLite Micro plans every "
                     f"tensor before it runs; {hint}")
    for index, op in enumerate(subgraph.operators or []):
        name = op_name(model, op)
        where = f"{name} #{index}{_where(origins[index])}"
        inputs = [t for t in op.inputs if t >= 0] if op.inputs is not None else []
        outputs = list(op.outputs) if op.outputs is not None else []
        if name not in MICRO_RESOLVER:
            hint = OP_HINTS.get(name, "replace the node in the ONNX graph with ops TFLite "
                                "Micro has (docs/micro.md)")
            lines.append(f"{where}: TFLite Micro has no {name} kernel; {hint}")
        elif name not in QUANTIZERS and any(
                subgraph.tensors[t].type == schema.TensorType.FLOAT32 for t in outputs):
            hint = OP_HINTS.get(name, "replace it with ops that quantize")
            lines.append(f"{where} computes in float32 (kept in float by --keep_float / "
                         "--keep_float_auto, or the quantizer has no integer kernel for it): "
                         "the micro target takes integer kernels only; leave the node out of "
                         f"those flags, or {hint}")
        if dynamic.intersection(outputs) and not dynamic.intersection(inputs):
            lines.append(f"{where} makes a tensor of run-time shape: TFLite Micro needs "
                         "static shapes; keep the input shapes static (-b, -ois) or replace "
                         "the node")
    return lines


def fill_origins(model, origins: list[list[dict]]) -> list[list[dict]]:
    """`origins` (export/delegates.onnx_origins) with each op that names no ONNX node given
    those of the nearest op reading its outputs, else of the op making its input: TF's
    quantizer renames the tensors of the ops it leaves in float, between a DEQUANTIZE and a
    QUANTIZE that carry the names."""
    ops = model.subgraphs[0].operators or []
    readers: dict[int, list[int]] = {}
    makers: dict[int, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs if op.inputs is not None else []:
            readers.setdefault(int(t), []).append(i)
        for t in op.outputs if op.outputs is not None else []:
            makers[int(t)] = i
    filled = [list(o) for o in origins]
    for i in range(len(ops)):
        for step in (lambda k: [r for t in ops[k].outputs for r in readers.get(int(t), [])],
                     lambda k: [makers[int(t)] for t in ops[k].inputs if int(t) in makers]):
            seen, frontier = {i}, [i]
            while not filled[i] and frontier:
                frontier = [n for k in frontier for n in step(k) if n not in seen]
                seen.update(frontier)
                found = next((origins[n] for n in frontier if origins[n]), None)
                filled[i] = list(found or [])
    return filled


def _failed_node(printed: str, origins: list[list[dict]]) -> str:
    """The op a TFLite Micro failure names, with its ONNX nodes, or the first lines printed."""
    found = FAILED_NODE.search(printed)
    if found and int(found.group(2)) < len(origins):
        index, op = int(found.group(2)), found.group(1)
        hint = OP_HINTS.get(op, "replace the node in the ONNX graph, or convert only the part "
                            "before it (-onimc)")
        return (f"{op} #{index}{_where(origins[index])} failed to {found.group(3)} on TFLite "
                f"Micro (below); {hint}")
    missing = NO_KERNEL.search(printed)
    if missing:
        return f"TFLite Micro has no {missing.group(1)} kernel"
    return "TFLite Micro could not run it"


def _refuse(name: str, lines: list[str], printed: str = "") -> ConversionError:
    text = f"{name} cannot run on TFLite Micro (--target micro):\n" + "\n".join(
        f"  - {line}" for line in lines)
    detail = [line for line in printed.splitlines() if line.strip()][:6]
    if detail:
        text += "\nTFLite Micro printed:\n" + "\n".join(f"    {line}" for line in detail)
    return ConversionError([], headline=text)


# --- inputs and outputs ---------------------------------------------------------------------
def _feeds(model, source, samples: list[dict]) -> tuple[list[dict], str]:
    """Each sample as the file's inputs {tensor index: array, quantized as the file takes
    it}, and where the samples came from."""
    subgraph = model.subgraphs[0]
    details = {}
    for t in subgraph.inputs:
        info = _tensor_info(subgraph, t)
        details[t] = {"dtype": np.dtype(info["dtype"].lower()), "shape": info["shape"],
                      "quantization": (info["scale"] or 0.0, info["zero_point"] or 0)}
    if not samples:
        rng = np.random.default_rng(0)
        return [{t: _random_input(d, rng) for t, d in details.items()}
                for _ in range(NO_HELD_OUT_SAMPLES)], "seeded random inputs"
    signature = next(s for s in model.signatureDefs if s.signatureKey.decode() == SIGNATURE)
    by_key = {m.name.decode(): m.tensorIndex for m in signature.inputs}
    feeds = []
    for sample in samples:
        physical = source.result.to_physical(sample)
        feeds.append({by_key[k]: as_input(v, details[by_key[k]]) for k, v in physical.items()})
    return feeds, "held-out calibration samples"


def _random_input(details: dict, rng) -> np.ndarray:
    dtype = np.dtype(details["dtype"])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=details["shape"], endpoint=True
                            ).astype(dtype)
    return rng.standard_normal(details["shape"]).astype(dtype)


def litert_outputs(content: bytes, feeds: list[dict], reference_kernels: bool = False
                   ) -> list[list[np.ndarray]]:
    """ai-edge-litert's outputs (subgraph order) of `content` on each sample of `feeds`
    ({tensor index: array}): with its default kernels (XNNPACK where it applies), or its
    reference kernels, which are TFLite Micro's arithmetic too."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    outputs = [d["index"] for d in interpreter.get_output_details()]
    found = []
    for sample in feeds:
        for index, value in sample.items():
            interpreter.set_tensor(index, value)
        interpreter.invoke()
        found.append([interpreter.get_tensor(i).copy() for i in outputs])
    return found


def compare(micro: list[list[np.ndarray]], litert: list[list[np.ndarray]],
            names: list[str]) -> dict:
    """Per output: the largest |micro - litert| (in LSB for integer outputs) and how many
    values differ, over all samples."""
    found = {}
    for j, name in enumerate(names):
        diffs = [np.abs(m[j].astype(np.float64) - r[j].astype(np.float64))
                 for m, r in zip(micro, litert)]
        found[name] = {
            "max_abs_diff": float(max(d.max(initial=0.0) for d in diffs)),
            "unit": "LSB" if np.dtype(litert[0][j].dtype).kind in "iu" else "value",
            "differing_values": int(sum(np.count_nonzero(d) for d in diffs)),
            "values": int(sum(d.size for d in diffs)),
        }
    return found


# --- the check ------------------------------------------------------------------------------
def _tensor_info(subgraph, index: int) -> dict:
    tensor = subgraph.tensors[index]
    shape = [int(d) for d in (tensor.shape if tensor.shape is not None else [])]
    dtype = DTYPE_NAMES.get(tensor.type, str(tensor.type))
    quant = tensor.quantization
    scales = list(quant.scale) if quant is not None and quant.scale is not None else []
    zeros = list(quant.zeroPoint) if quant is not None and quant.zeroPoint is not None else []
    return {"name": tensor.name.decode(), "shape": shape, "dtype": dtype,
            "scale": float(scales[0]) if len(scales) == 1 else None,
            "zero_point": int(zeros[0]) if len(zeros) == 1 else None}


def _largest_tensors(model, origins: list[list[dict]]) -> list[dict]:
    """The largest tensors ops compute (the arena holds them), with the op making each."""
    subgraph = model.subgraphs[0]
    made_by = {t: (i, op_name(model, op)) for i, op in enumerate(subgraph.operators or [])
               for t in (op.outputs if op.outputs is not None else [])}
    sizes = []
    for t in set(made_by) | set(subgraph.inputs):
        info = _tensor_info(subgraph, t)
        info["bytes"] = int(np.prod(info["shape"], dtype=np.int64)) * BYTES.get(info["dtype"], 1)
        op = made_by.get(t)
        info["op"] = None if op is None else f"{op[1]} #{op[0]}"
        info["onnx_nodes"] = [] if op is None else origins[op[0]]
        sizes.append(info)
    sizes.sort(key=lambda i: -i["bytes"])
    return sizes[:LARGEST_TENSORS]


def _tensor_line(tensor: dict, input_names: dict[str, str]) -> str:
    """One of _largest_tensors as a person reads it: the ONNX input it is, or the op (and
    ONNX nodes) making it; shape, type and bytes."""
    if tensor["op"] is None:
        what = f"input '{input_names.get(tensor['name'], tensor['name'])}'"
    else:
        what = f"{tensor['op']}{_where(tensor['onnx_nodes'])}"
    return f"{what} {tensor['shape']} {tensor['dtype'].lower()} {tensor['bytes']} bytes"


def _op_list(model, origins: list[list[dict]]) -> tuple[list[dict], list[str]]:
    """Each op with its version and resolver call; the firmware's resolver lines."""
    ops, calls = [], []
    for index, op in enumerate(model.subgraphs[0].operators or []):
        name = op_name(model, op)
        call = MICRO_RESOLVER.get(name)
        ops.append({"index": index, "op": name,
                    "version": int(model.operatorCodes[op.opcodeIndex].version),
                    "resolver_call": call, "onnx_nodes": origins[index]})
        if call and call not in calls:
            calls.append(call)
    resolver = [f"tflite::MicroMutableOpResolver<{len(calls)}> resolver;",
                *(f"resolver.{c}();" for c in calls)]
    return ops, resolver


def check_micro(content: bytes, name: str, source, samples: list[dict],
                published: bytes | None = None) -> MicroReport:
    """Check the full-integer file `content` (named `name`, converted from `source`, a
    pipeline.Converted) on TFLite Micro and measure it (see the module's docstring);
    `samples` are held-out inputs {ONNX name: array in ONNX layout}. `published` is the
    file as it will be published when that differs from `content` (-coion renames its
    inputs and outputs): the one run and measured. Raises a ConversionError naming the ONNX
    nodes when it cannot run there."""
    published = content if published is None else published
    model = unpack_model(content)  # TF's tensor names: how ops map to ONNX nodes
    shipped = model if published is content else unpack_model(published)
    result = source.tflite_result()
    origins = fill_origins(model, onnx_origins(model, result, source.graph))
    signature = next(s for s in model.signatureDefs if s.signatureKey.decode() == SIGNATURE)
    onnx_inputs = {key: onnx for onnx, key in result.input_names.items()}
    input_names = {m.tensorIndex: onnx_inputs.get(m.name.decode(), m.name.decode())
                   for m in signature.inputs}
    blocking = blocking_ops(model, origins, input_names, source.graph.shapes)
    if blocking:
        raise _refuse(name, blocking)
    subgraph = shipped.subgraphs[0]
    largest = _largest_tensors(model, origins)
    by_tensor_name = {model.subgraphs[0].tensors[t].name.decode(): onnx_name
                      for t, onnx_name in input_names.items()}
    tensor_lines = [_tensor_line(t, by_tensor_name) for t in largest]
    if largest and largest[0]["bytes"] > MICRO_REFUSE_BYTES:  # the arena holds it
        raise InputError(
            f"--target micro: {name} needs a tensor arena of more than {largest[0]['bytes']} "
            f"bytes, more than a microcontroller board holds (external RAM included, "
            f"{MICRO_REFUSE_BYTES >> 20} MiB at most); its largest tensors: "
            f"{'; '.join(tensor_lines[:3])}. {smaller_input_hint(source.graph)}.")
    samples_by_tensor, source_text = _feeds(model, source, samples)
    feeds = [[sample[t] for t in subgraph.inputs] for sample in samples_by_tensor]
    with MicroInterpreter() as interpreter:
        arena, attempts, printed = smallest_arena(interpreter, published)
        if arena is None:
            raise _refuse(name, [_failed_node(printed, origins)], printed)
        micro, printed = interpreter.run(published, arena, feeds, len(subgraph.outputs))
        if micro is None:
            raise _refuse(name, [_failed_node(printed, origins)], printed)
    recorded = {k: int(v) for k, v in RECORDED.findall(printed)}
    output_keys = {m.tensorIndex: m.name.decode() for m in signature.outputs}
    onnx_outputs = {key: onnx for onnx, key in result.output_names.items()}
    names = [onnx_outputs.get(output_keys.get(t), subgraph.tensors[t].name.decode())
             for t in subgraph.outputs]
    try:
        outputs = compare(micro, litert_outputs(published, samples_by_tensor), names)
        reference = compare(micro, litert_outputs(published, samples_by_tensor, True), names)
        litert_error = None
    except (RuntimeError, ValueError) as exc:  # e.g. an op version ai-edge-litert lacks
        outputs, reference = {}, {}
        litert_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        log.warning("micro: ai-edge-litert cannot run %s, so the outputs are not compared "
                    "(%s)", name, litert_error)
    ops, resolver = _op_list(model, origins)
    warning = arena_warning(name, arena, tensor_lines[:3], smaller_input_hint(source.graph))
    if warning:
        log.warning("micro: %s", warning)
    report = MicroReport(
        file=name, tflite_micro=tflite_micro_version(), flatbuffer_bytes=len(published),
        arena_bytes=arena, arena_attempts=attempts, recorded_arena=recorded,
        samples=len(feeds), sample_source=source_text,
        outputs=outputs, outputs_reference_kernels=reference, litert_error=litert_error,
        inputs=[{"onnx_name": input_names.get(t), **_tensor_info(subgraph, t)}
                for t in subgraph.inputs],
        largest_tensors=largest, ops=ops, resolver=resolver,
        warnings=[warning] if warning else [])
    log.info("micro: %s", report.summary())
    return report
