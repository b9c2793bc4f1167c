"""The project's own quantizer: a calibrated float flatbuffer becomes an INT8 or an
INT16-activation one, without TensorFlow.

Its input is the float model with every activation's calibrated range recorded on its
tensor (quantization min / max: the calibrate-only flatbuffer of TF's converter, or the
direct writer's file with ranges measured in the interpreter, calibration/ranges.py). Each
op with a rule in op_rules.py is rewritten in place into its integer form:
- activations take an asymmetric int8 grid over their range (0 exact), or a symmetric
  int16 one, the grid a kernel's rule fixes, a QDQ model's own grid where the file names
  one (quant/qdq_grids.py), or one grid shared by every tensor that a
  SAME op joins (a reshape's input and output, a concatenation's inputs): the tensors a
  chain of such ops connects are one group whose range is the union of its members'. Two
  fixed grids never merge: the later input is re-quantized (a QUANTIZE from int8 to int8);
- kernels become symmetric int8 per output channel ([-127, 127], or one scale per tensor
  with `per_tensor`), their biases int32 (int64 beside 16-bit activations) on the scale
  input x weight of each channel;
- other constants read as values take their own grid, or their group's.
Ops without a rule, and the ops whose output tensors `float_tensors` names, stay float:
they read a DEQUANTIZE of each integer input and their outputs go through a QUANTIZE to
the integer ops after them. Each tensor keeps its name: the reports, bias correction and
--keep_float find them by it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from calibration.ranges import record_ranges
from onnx2tf_alt.quant.grids import (
    IO_TYPES,
    LIMITS,
    NUMPY,
    TT,
    Grid,
    activation_grid,
    centred_grid,
    fits,
    given_grid,
    in_blocks,
    row_blocks,
)
from onnx2tf_alt.quant.integer_io import integer_io, renumber_signature
from onnx2tf_alt.quant.notes import Note
from onnx2tf_alt.quant.op_rules import FIXED, READS, RULES, SAME, Rule
from onnx2tf_alt.tflite.flatbuffer import (
    op_name,
    opcode_index,
    pack_model,
    read_model,
    unpack_model,
)

log = logging.getLogger("onnx2tf_alt")
MAX_REFUSED = 32  # ops kept float because the interpreter refuses their integer kernel
# the arithmetic of a power spectrum before its LOG (before_log), and how far back it goes
POWER_OPS = {"MUL", "ADD", "SUB", "SUM", "MEAN", "SQRT", "ABS", "SQUARED_DIFFERENCE",
             "MAXIMUM"}
MAX_LOG_CHAIN = 8
# TFLite's int16 SOFTMAX looks exp up on [-10, 0] only: a class further than 10 below the
# largest logit counts e^-10 in the sum. A softmax whose classes can add more than this
# much mass that way stays float in the INT16 files (wide_softmaxes).
EXP_FLOOR = 10.0
SOFTMAX_MASS = 2.0**-10

SHAPE_ONLY = {"SHAPE", "RANK"}  # ops whose results depend on their inputs' shapes alone
KERNEL_LIMIT = 127  # symmetric int8 weights: -128 is never used
NEAR_ZERO_PEAK = 5e-7  # a kernel channel's smallest peak (TF's quantizer's near-zero range)
BIAS_TYPES = {TT.INT8: TT.INT32, TT.INT16: TT.INT64}
BIAS_ROOM = 2.0**30  # largest int32 bias code
# builtin versions that name the integer kernels (TFLite's op_version.cc), raised to at least
# these when an op of the builtin is quantized
VERSIONS = {TT.INT8: {
    "CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "TRANSPOSE_CONV": 3,
    "ADD": 2, "SUB": 2, "MUL": 2, "MEAN": 2, "SUM": 2, "CONCATENATION": 2, "RESHAPE": 1,
    "MAX_POOL_2D": 2, "AVERAGE_POOL_2D": 2, "PAD": 2, "PADV2": 2, "SOFTMAX": 2,
    "LOGISTIC": 2, "TANH": 2, "RESIZE_BILINEAR": 2, "RESIZE_NEAREST_NEIGHBOR": 2,
    "TRANSPOSE": 2, "STRIDED_SLICE": 2, "SLICE": 2, "GATHER": 2, "SPLIT": 2, "SPLIT_V": 2,
    "MAXIMUM": 2, "MINIMUM": 2, "QUANTIZE": 2, "DEQUANTIZE": 2, "BATCH_MATMUL": 2,
    "LEAKY_RELU": 2, "PRELU": 2, "RELU": 2, "RELU6": 2, "HARD_SWISH": 1, "PACK": 2,
    "UNPACK": 2, "DEPTH_TO_SPACE": 2, "SPACE_TO_DEPTH": 2, "REDUCE_MAX": 2,
    "SQUARED_DIFFERENCE": 2, "RSQRT": 2, "SELECT_V2": 1, "ARG_MAX": 2,
}, TT.INT16: {
    "CONV_2D": 4, "DEPTHWISE_CONV_2D": 5, "FULLY_CONNECTED": 7, "TRANSPOSE_CONV": 3,
    "ADD": 3, "SUB": 3, "MUL": 4, "MEAN": 3, "CONCATENATION": 3, "MAX_POOL_2D": 3,
    "AVERAGE_POOL_2D": 3, "PAD": 4, "SOFTMAX": 3, "LOGISTIC": 3, "TANH": 3, "TRANSPOSE": 5,
    "STRIDED_SLICE": 4, "QUANTIZE": 3, "DEQUANTIZE": 4, "RESIZE_BILINEAR": 4,
    "RESIZE_NEAREST_NEIGHBOR": 4, "LEAKY_RELU": 2, "RELU": 3, "RELU6": 3,
}}


def quantize(calibrated: bytes, per_tensor: bool = False, io_dtypes: tuple | None = None,
             float_tensors: Iterable[str] = (), activations: str = "int8",
             ranges: dict[int, tuple] | None = None, notes: list[str] | None = None) -> bytes:
    """The quantized flatbuffer of a calibrated one (module docstring): `activations`
    "int8" or "int16"; `io_dtypes` (input, output) type names of an integer-only file (the
    signature's inputs and outputs on the integer grid), None for float ones; `ranges`
    ({tensor: (low, high)}) are recorded over `calibrated`'s own first (a float file and
    the ranges measured on it, calibration/ranges.Calibrated: no copy of the float file
    with them written in); `notes`, where given, gets a sentence on each op the quantizer
    itself chose to keep float (wide_softmaxes).

    The file is prepared once in the interpreter: an op whose integer kernel TFLite refuses
    (a type its build lacks) is kept float and the model quantized again."""
    kept = set(float_tensors)
    for _ in range(MAX_REFUSED + 1):
        model = unpack_model(calibrated)
        if ranges is not None:
            record_ranges(model, ranges)
        quantized = _Quantizer(model, IO_TYPES[activations], per_tensor, kept)
        quantized.run()
        if io_dtypes:
            integer_io(model, *(IO_TYPES[t] for t in io_dtypes))
        drop_unused(model)
        content = pack_model(model, release=True)  # (unpacked again for another try)
        del model
        refused = _refused_op(content, quantized.names)
        if refused is None:
            if notes is not None and quantized.wide:
                notes.append(_wide_softmax_note(quantized.wide))
            return content
        log.debug("quantizer: %s has no %s kernel here; kept float", refused[0], activations)
        kept |= refused[1]
    raise RuntimeError(f"more than {MAX_REFUSED} ops refused their {activations} kernels")


def _refused_op(content: bytes, quantized: set[str]) -> tuple[str, set[str]] | None:
    """(the op, its output names) of the first quantized op the interpreter fails to
    prepare; None when every op prepares (or the one that fails was never quantized)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    try:
        Interpreter(model_content=content, experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)).allocate_tensors()
        return None
    except (RuntimeError, ValueError) as exc:
        found = re.search(r"Node number (\d+) \((\w+)\) failed to prepare", str(exc))
    if found is None:
        return None
    model = read_model(content)
    graph = model.Subgraphs(0)
    op = graph.Operators(int(found.group(1)))
    names = {graph.Tensors(op.Outputs(k)).Name().decode() for k in range(op.OutputsLength())}
    names = {n.removesuffix("/int8").removesuffix("/int16") for n in names}  # outputs()
    return (f"{found.group(2)} {min(names)}", names) if names & quantized else None


def _wide_softmax_note(wide: dict[str, int]) -> Note:
    classes = ", ".join(str(n) for n in sorted(set(wide.values())))
    return Note(
        f"INT16 files: {len(wide)} SOFTMAX op(s) over {classes} classes kept in float: "
        "TFLite's int16 softmax counts every class more than 10 below the largest logit as "
        f"e^-10, which would add up to {max(wide.values()) * math.exp(-EXP_FLOOR):.2g} to "
        "the sum and scale every probability down by as much",
        f"INT16 files: {len(wide)} wide SOFTMAX op(s) float (int16 kernel clamps exp at "
        "e^-10)")


class _Quantizer:
    """One rewrite of a model's main subgraph (module docstring)."""

    def __init__(self, model, activation_type: int, per_tensor: bool,
                 float_tensors: set[str]):
        self.model, self.graph = model, model.subgraphs[0]
        self.type, self.per_tensor = activation_type, per_tensor
        self.float_tensors = float_tensors
        self.parent: dict[int, int] = {}  # tensor -> its group (a tensor of it)
        self.views: dict[tuple[int, int], int] = {}  # (tensor, type) -> converted tensor
        self.constants: dict[tuple, int] = {}  # (tensor, role...) -> quantized copy
        self.emitted: list = []
        self.data = self._data_dependent()

    def _data_dependent(self) -> set[int]:
        """The tensors whose values depend on the values of the subgraph's inputs: not those
        computed from constants and shapes alone (a resize's size from SHAPE, CAST and MUL,
        a run-time size's taps), which are exact arithmetic on sizes, never quantized."""
        found = {int(i) for i in self.graph.inputs}
        for op in self.graph.operators:
            if op_name(self.model, op) in SHAPE_ONLY:
                continue
            if any(int(i) in found for i in op.inputs if i >= 0):
                found.update(int(t) for t in op.outputs)
        return found

    # --- which ops -------------------------------------------------------------------------
    def tensor(self, index: int):
        return self.graph.tensors[index]

    def constant(self, index: int) -> bool:
        data = self.model.buffers[self.tensor(index).buffer].data
        return data is not None and len(data) > 0

    def value(self, index: int) -> np.ndarray:
        t = self.tensor(index)
        data = np.asarray(self.model.buffers[t.buffer].data, np.uint8)
        return data.view(np.float32).reshape([] if t.shape is None else [int(d) for d in t.shape])

    def measured(self, index: int) -> tuple[float, float] | None:
        q = self.tensor(index).quantization
        if q is None or q.min is None or len(q.min) != 1 or q.max is None:
            return None
        return float(q.min[0]), float(q.max[0])

    def value_inputs(self, op, rule: Rule) -> list[int]:
        return [i for pos, i in enumerate(op.inputs) if i >= 0 and pos not in (
            rule.kernel, rule.bias) and (rule.values is None or pos in rule.values)
            and self.tensor(i).type == TT.FLOAT32]

    def float_outputs(self, op) -> list[int]:
        return [int(t) for t in op.outputs if self.tensor(t).type == TT.FLOAT32]

    def rule_of(self, op) -> Rule | None:
        """The rule `op` is quantized by, or None: it stays float."""
        rule = RULES.get(op_name(self.model, op))
        if rule is None or (self.type == TT.INT16 and not rule.int16):
            return None
        if any(self.tensor(t).name.decode() in self.float_tensors for t in op.outputs):
            return None
        values = self.value_inputs(op, rule)
        if rule.values is not None and len(values) != len(
                [p for p in rule.values if p < len(op.inputs) and op.inputs[p] >= 0]):
            return None  # a value input that is not float (indices, integers)
        if not values or all(self.constant(i) for i in op.inputs if i >= 0):
            return None  # computes on constants alone (a GATHER of a table by indices does not)
        if not any(int(i) in self.data for i in op.inputs if i >= 0):
            return None  # computes on sizes alone
        if any(not self.constant(i) and self.measured(i) is None for i in values):
            return None
        for pos in (rule.kernel, rule.bias):
            if pos is not None and pos < len(op.inputs) and op.inputs[pos] >= 0 and not (
                    self.constant(op.inputs[pos])
                    and self.tensor(op.inputs[pos]).type == TT.FLOAT32):
                return None  # weights computed at run time stay float
        others = [i for pos, i in enumerate(op.inputs) if i >= 0 and i not in values
                  and pos not in (rule.kernel, rule.bias)]
        if any(self.tensor(i).type == TT.FLOAT32 for i in others):
            return None
        outputs = [self.tensor(t) for t in op.outputs]
        if rule.output == READS:
            return rule if all(t.type != TT.FLOAT32 for t in outputs) else None
        if not self.float_outputs(op) or any(
                t.type not in (TT.FLOAT32, TT.INT32, TT.INT64) for t in outputs):
            return None  # (a TOPK_V2's indices beside its values are fine)
        if rule.output not in (SAME, FIXED) and any(self.measured(t) is None
                                                   for t in self.float_outputs(op)):
            return None
        if rule.output == FIXED and (rule.fixed16 if self.type == TT.INT16
                                     else rule.fixed8) is None:
            return None
        return rule

    # --- grids ----------------------------------------------------------------------------
    def find(self, index: int) -> int:
        root = self.parent.setdefault(index, index)
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[index] = root
        return root

    def plan_groups(self, chosen: dict[int, Rule]) -> None:
        """The grid of every tensor a quantized op reads or writes. The tensors SAME ops
        connect are one group over the union of what its members need (span). A kernel's
        fixed output grid is the group's when it is the group's only one and the group's
        values fit on it; else that output keeps its grid and the SAME ops reading it
        re-quantize it (rewrite). A QDQ model's grids (quant/qdq_grids.py) are fixed ones.
        """
        ops = self.graph.operators
        for k, rule in chosen.items():
            if rule.output == SAME:
                first = self.find(self.written[k][0])
                for t in [*self.written[k][1:], *self.values[k]]:
                    self.parent[self.find(t)] = first
        members: dict[int, list[int]] = {}
        for t in list(self.parent):
            members.setdefault(self.find(t), []).append(t)
        fixed = {}
        for k, rule in chosen.items():
            if rule.output == FIXED:
                pair = rule.fixed16 if self.type == TT.INT16 else rule.fixed8
                fixed[ops[k].outputs[0]] = Grid(*pair, self.type)
        if self.type == TT.INT8:  # a QDQ model's own grids (quant/qdq_grids.py)
            for t in self.parent:
                if (grid := given_grid(self.tensor(t))) is not None:
                    fixed.setdefault(t, grid)
        # XNNPACK takes an int8 BATCH_MATMUL only with its second operand's zero point at 0
        centred = {int(ops[k].inputs[1]) for k in chosen
                   if op_name(self.model, ops[k]) == "BATCH_MATMUL"
                   and not self.constant(ops[k].inputs[1])} if self.type == TT.INT8 else set()
        self.grids: dict[int, Grid] = {}
        for root, group in members.items():
            spans = [s for t in group if (s := self.span(t)) is not None]
            span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0.0, 0.0)
            kept = {fixed[t] for t in group if t in fixed}
            if len(kept) == 1 and fits(next(iter(kept)), span):
                self.grids[root] = next(iter(kept))
                continue
            self.grids[root] = (centred_grid(*span) if centred.intersection(group) and not kept
                                else activation_grid(*span, self.type))
            for t in group:
                if t in fixed:  # its own grid, moved onto the group's where read
                    self.parent[t] = t
                    self.grids[t] = fixed[t]

    def span(self, index: int) -> tuple[float, float] | None:
        """The values `index` needs on its grid: a constant's, or its calibrated range;
        None where only SAME ops read it that keep no value outside their output's range
        (a ReLU6 written as a MINIMUM: the input's values above 6 need no codes)."""
        if self.constant(index):
            value = self.value(index)
            return (float(value.min()), float(value.max())) if value.size else None
        readers = self.readers.get(index, [])
        if readers and index not in self.graph.outputs and all(
                (rule := self.chosen.get(k)) is not None and rule.output == SAME
                and not rule.mixes for k in readers):
            return None
        return self.measured(index)

    def grid(self, index: int) -> Grid:
        return self.grids[self.find(index)]

    # --- the rewrite -----------------------------------------------------------------------
    def run(self) -> None:
        ops = self.graph.operators
        for op in ops:
            self.reciprocal(op)
        self.float_tensors |= self.before_log()
        self.wide = self.wide_softmaxes() if self.type == TT.INT16 else {}
        self.float_tensors |= set(self.wide)
        self.chosen = chosen = {k: r for k, op in enumerate(ops)
                                if (r := self.rule_of(op)) is not None}
        # the value inputs and outputs, read before any is retyped
        self.values = {k: self.value_inputs(ops[k], r) for k, r in chosen.items()}
        self.written = {k: self.float_outputs(ops[k]) if r.output != READS else []
                        for k, r in chosen.items()}
        self.readers: dict[int, list[int]] = {}
        for k, op in enumerate(ops):
            for i in op.inputs:
                self.readers.setdefault(int(i), []).append(k)
        # every float activation an integer op reads or writes has a group
        for k, rule in chosen.items():
            for i in self.values[k]:
                self.find(i)
            for t in self.written[k]:
                self.find(t)
        self.plan_groups(chosen)
        self.names = {self.tensor(t).name.decode() for k in chosen for t in ops[k].outputs}
        integer = {t for k in chosen for t in self.written[k]}
        for t in integer:
            tensor = self.tensor(t)
            tensor.type, tensor.quantization = self.type, self.grid(t).params()
        alias = self.clamps_on_their_grid()
        for k, op in enumerate(ops):
            if alias:
                if len(op.outputs) and int(op.outputs[0]) in alias:
                    continue  # a clamp left out
                op.inputs = [alias.get(int(i), i) for i in op.inputs]
                if k in self.values:
                    self.values[k] = [alias.get(int(i), i) for i in self.values[k]]
            rule = chosen.get(k)
            if rule is None:
                op.inputs = [self.float_input(i) for i in op.inputs]
            else:
                self.rewrite(k, op, rule)
                self.raise_version(op)
                if self.type == TT.INT16:
                    _general_int16_scales(op)
            self.emitted.append(op)
        self.outputs()
        self.graph.operators = self.emitted
        for t in self.graph.tensors:  # the calibrated ranges are not part of a float tensor
            if t.type == TT.FLOAT32 and t.quantization is not None:
                t.quantization = None

    def clamps_on_their_grid(self) -> dict[int, int]:
        """{output: input} of the 8-bit MINIMUM / MAXIMUM ops by a constant that their grid
        already clamps to (a hard sigmoid's MINIMUM(x, 1), a ReLU6's MINIMUM(x, 6): the
        group's grid ends at the constant, and the op writing x saturates its codes there),
        which are left out, their readers reading x. XNNPACK has no int8 MINIMUM / MAXIMUM,
        so each ran on TFLite's reference kernel between two delegated partitions (the
        PP-OCR direction classifier's 9 made 10 partitions). Not a graph output's op."""
        alias: dict[int, int] = {}
        if self.type != TT.INT8:
            return alias
        low_code, high_code = LIMITS[self.type]
        outputs = {int(o) for o in self.graph.outputs}
        for k in self.chosen:
            op = self.graph.operators[k]
            name = op_name(self.model, op)
            if name not in ("MINIMUM", "MAXIMUM") or len(op.inputs) != 2 or int(
                    op.outputs[0]) in outputs:
                continue
            constants = [i for i in op.inputs if self.constant(i)]
            values = [int(i) for i in op.inputs if not self.constant(i)]
            if len(constants) != 1 or len(values) != 1:
                continue
            bound = self.value(constants[0])
            if not bound.size or np.any(bound != bound.flat[0]):
                continue
            out, value = int(op.outputs[0]), alias.get(values[0], values[0])
            grid = self.grid(out)
            if self.grid(value) != grid:
                continue
            end = grid.scale * ((high_code if name == "MINIMUM" else low_code) - grid.zero_point)
            if abs(end - float(bound.flat[0])) <= grid.scale / 2:
                alias[out] = value
        return alias

    def float_input(self, index: int) -> int:
        """What a float op reads for tensor `index`: a DEQUANTIZE of an integer one; a QDQ
        model's value written by a float op on its grid and back (QUANTIZE, DEQUANTIZE),
        as the pair computes it: the model's exporter may have dropped a ReLU or a Clip
        whose range the pair's grid clamps to (onnxruntime's quantizer does)."""
        if index < 0:
            return index
        tensor = self.tensor(index)
        if tensor.type in (TT.INT8, TT.UINT8, TT.INT16) and index in self.parent:
            return self.view(index, TT.FLOAT32)
        grid = given_grid(tensor) if self.type == TT.INT8 else None
        if grid is None or self.constant(index):
            return index
        return self.view(self.view(index, self.type, grid), TT.FLOAT32)

    def before_log(self) -> set[str]:
        """The outputs of the arithmetic that feeds a LOG (a power spectrum: squares, their
        sum, a root, a scale, an epsilon), which stay float. Its values span many decades
        (basic-pitch's CQT: 1e-29 to 270) and the LOG needs each one to a few percent: a
        fixed-point grid of 289 / 32767 made every quiet bin log(1e-10) and took the
        INT16 file's cosine to 0.92 (0.94 kept float)."""
        writer = {int(o): op for op in self.graph.operators for o in op.outputs}
        kept: set[str] = set()
        for op in self.graph.operators:
            if op_name(self.model, op) != "LOG":
                continue
            pending, steps = [int(op.inputs[0])], 0
            while pending and steps < MAX_LOG_CHAIN:
                producer = writer.get(pending.pop())
                if producer is None or op_name(self.model, producer) not in POWER_OPS:
                    continue
                steps += 1
                kept |= {self.tensor(t).name.decode() for t in producer.outputs}
                pending += [int(i) for i in producer.inputs if i >= 0 and not self.constant(i)]
        return kept

    def wide_softmaxes(self) -> dict[str, int]:
        """{output name: classes} of the SOFTMAX ops TFLite's int16 kernel would get wrong,
        which stay float: it looks exp up on [-10, 0] only, so every class further than 10
        (input range x beta) below the largest logit adds e^-10 to the sum. A recognizer's
        6,625 classes added 0.30: its INT16 file's top probability was 0.71 for 0.9996 in
        float (SQNR 10.9 dB, though every argmax agreed). Kept where the classes can add
        more than SOFTMAX_MASS; a run-time class count counts as wide."""
        wide = {}
        for op in self.graph.operators:
            if op_name(self.model, op) != "SOFTMAX" or (span := self.measured(
                    op.inputs[0])) is None:
                continue
            beta = getattr(op.builtinOptions, "beta", 1.0) or 1.0
            tensor = self.tensor(op.inputs[0])
            dims = tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape
            classes = int(dims[-1]) if dims is not None and len(dims) else 1
            spread = (span[1] - span[0]) * beta
            if spread > EXP_FLOOR and (classes < 0 or (classes - 1) * math.exp(
                    -EXP_FLOOR) > SOFTMAX_MASS):
                name = self.tensor(op.outputs[0]).name.decode()
                wide[name] = classes if classes > 0 else int(tensor.shape[-1])
        return wide

    def reciprocal(self, op) -> None:
        """A DIV by a constant becomes a MUL by its reciprocal, as TF's converter writes it:
        XNNPACK has no int8 DIV (a detector's 24 hard-swish divisions by 6 ran on TFLite's
        reference kernel, in 36 partitions), and the product on the int8 grid is as exact."""
        if op_name(self.model, op) != "DIV" or len(op.inputs) != 2 or not self.constant(
                op.inputs[1]) or self.tensor(op.inputs[1]).type != TT.FLOAT32 or any(
                self.tensor(t).name.decode() in self.float_tensors for t in op.outputs):
            return
        divisor = self.value(op.inputs[1])
        if not divisor.size or not np.all(np.isfinite(divisor)) or np.any(divisor == 0):
            return
        name = f"{self.tensor(op.inputs[1]).name.decode()}/reciprocal"
        op.inputs = [op.inputs[0], self.new_tensor(op.inputs[1], name, TT.FLOAT32, None,
                                                   (1 / divisor).astype(np.float32))]
        op.opcodeIndex = opcode_index(self.model, schema.BuiltinOperator.MUL, 1)
        activation = getattr(op.builtinOptions, "fusedActivationFunction", 0)
        op.builtinOptionsType, op.builtinOptions = (schema.BuiltinOptions.MulOptions,
                                                    schema.MulOptionsT())
        op.builtinOptions.fusedActivationFunction = activation

    def rewrite(self, k: int, op, rule: Rule) -> None:
        values = set(self.values[k])
        inputs = list(op.inputs)
        kernel_scales = None
        if rule.kernel is not None:
            kernel_scales = self.kernel(op, rule)
            inputs[rule.kernel] = kernel_scales[0]
        for pos, i in enumerate(op.inputs):
            if i < 0 or i not in values:
                continue
            if self.constant(i):
                inputs[pos] = self.constant_codes(i, self.operand_grid(op, i))
            elif rule.output == SAME and self.grid(i) != self.grid(self.written[k][0]):
                inputs[pos] = self.view(i, self.type, self.grid(self.written[k][0]))
            else:
                inputs[pos] = self.view(i, self.type)
        if op_name(self.model, op) == "DIV" and op.inputs[1] in values and not self.constant(
                op.inputs[1]):
            inputs[1] = self.off_zero(op.inputs[1], inputs[1])
        if rule.bias is not None and rule.bias < len(op.inputs) and op.inputs[rule.bias] >= 0:
            value = op.inputs[(rule.values or (0,))[0]]
            inputs[rule.bias] = self.bias(op.inputs[rule.bias], self.grid(value).scale,
                                          kernel_scales[1])
        op.inputs = inputs

    def off_zero(self, divisor: int, codes: int) -> int:
        """A computed divisor's codes kept off its zero point: TFLite's integer DIV stops the
        whole invocation on a divisor at its zero point, and 8-bit error upstream can take a
        divisor there that is never 0 in float (basic-pitch's peak of a log spectrum, at
        least 57.6 on every calibration clip, was 0 on a quiet one). A divisor calibrated
        positive is read through a MAXIMUM with one step above 0 (a negative one through a
        MINIMUM with one below), on its own grid; one whose grid spans 0 is left alone."""
        grid = self.grid(divisor)
        low, high = LIMITS[self.type]
        if grid.zero_point not in (low, high):
            return codes  # values on both sides of 0
        builtin, step = ((schema.BuiltinOperator.MAXIMUM, 1) if grid.zero_point == low
                         else (schema.BuiltinOperator.MINIMUM, -1))
        name = self.tensor(divisor).name.decode()
        bound = self.new_tensor(codes, f"{name}/one_step", self.type, grid,
                                np.array([grid.zero_point + step], NUMPY[self.type]))
        self.tensor(bound).shape, self.tensor(bound).shapeSignature = [1], None
        kept = self.new_tensor(codes, f"{name}/off_zero", self.type, grid)
        self.emit(builtin, [codes, bound], [kept])
        return kept

    def raise_version(self, op) -> None:
        wanted = VERSIONS[self.type].get(op_name(self.model, op))
        code = self.model.operatorCodes[op.opcodeIndex]
        if wanted and code.version < wanted:
            op.opcodeIndex = opcode_index(self.model, max(code.builtinCode,
                                          code.deprecatedBuiltinCode), wanted, exact=True)

    # --- tensors ---------------------------------------------------------------------------
    def new_tensor(self, like: int, name: str, type_: int, grid: Grid | None,
                   data: np.ndarray | None = None) -> int:
        source = self.tensor(like)
        t = schema.TensorT()
        t.name, t.type = name.encode(), type_
        t.shape = [] if source.shape is None else list(source.shape)
        t.shapeSignature = None if source.shapeSignature is None else list(
            source.shapeSignature)
        t.quantization = grid.params() if grid is not None else None
        buffer = schema.BufferT()
        if data is not None:
            buffer.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
        self.model.buffers.append(buffer)
        t.buffer = len(self.model.buffers) - 1
        self.graph.tensors.append(t)
        return len(self.graph.tensors) - 1

    def view(self, index: int, type_: int, grid: Grid | None = None) -> int:
        """`index` as `type_` (FLOAT32 or the activation type, on `grid` or its own): itself
        when it is stored so, else a QUANTIZE / DEQUANTIZE emitted once before its reader."""
        source = self.tensor(index)
        if source.type == type_ and (grid is None or _same_grid(source, grid)):
            return index
        key = (index, type_, grid)
        if key not in self.views:
            if type_ == TT.FLOAT32:
                name, builtin, target = "dequantized", schema.BuiltinOperator.DEQUANTIZE, None
            else:
                name, builtin = "quantized", schema.BuiltinOperator.QUANTIZE
                target = grid or self.grid(index)
            suffix = f"{name}_{len(self.views)}" if grid is not None else name
            view = self.new_tensor(index, f"{source.name.decode()}/{suffix}", type_, target)
            self.emit(builtin, [index], [view])
            self.views[key] = view
        return self.views[key]

    def emit(self, builtin: int, inputs: list[int], outputs: list[int]) -> None:
        op = schema.OperatorT()
        op.opcodeIndex = opcode_index(self.model, builtin,
                                      VERSIONS[self.type][OP_KEYS[builtin]])
        op.inputs, op.outputs = inputs, outputs
        self.emitted.append(op)

    def kernel(self, op, rule: Rule) -> tuple[int, np.ndarray]:
        """(the int8 copy of `op`'s kernel, its scales per output channel)."""
        index = op.inputs[rule.kernel]
        key = (index, "kernel", rule.axis, self.per_tensor)
        weights = self.value(index)
        axis = rule.axis % weights.ndim
        peak = _peaks(weights, axis, self.per_tensor).astype(np.float64)
        # a channel of next to nothing (denormal weights, a batch norm's zero scale folded
        # in) takes the scale of NEAR_ZERO_PEAK, as TF's quantizer gives it: peak / 127 was
        # a subnormal scale (2.6e-42), which XNNPACK refuses, and the whole conv ran on the
        # reference kernel (two in PP-OCRv4's recognizer: one more partition, 1.02x its time)
        scales = np.where(peak > 0, np.maximum(peak, NEAR_ZERO_PEAK) / KERNEL_LIMIT, 1.0)
        # a bias past 2^30 on scale input x weight widens that channel's scale: the int32
        # accumulator keeps room for the products added to it (TF's quantizer does the same)
        bias = op.inputs[rule.bias] if rule.bias is not None and rule.bias < len(
            op.inputs) else -1
        if bias >= 0 and BIAS_TYPES[self.type] == TT.INT32:
            value = op.inputs[(rule.values or (0,))[0]]
            need = np.abs(self.value(bias).astype(np.float64)) / (
                self.grid(value).scale * BIAS_ROOM)
            scales = np.maximum(scales, need.max() if self.per_tensor else need)
        scales = scales.astype(np.float32)
        key += (scales.tobytes(),)
        if key not in self.constants:
            codes = _kernel_codes(weights, scales, axis)
            q = schema.QuantizationParametersT()
            q.scale = [float(s) for s in scales]
            q.zeroPoint = [0] * len(scales)
            q.quantizedDimension = 0 if self.per_tensor else axis
            t = self.new_tensor(index, self.tensor(index).name.decode(), TT.INT8, None, codes)
            self.tensor(t).quantization = q
            self.constants[key] = t
        return self.constants[key], scales

    def bias(self, index: int, input_scale: float, kernel_scales: np.ndarray) -> int:
        type_ = BIAS_TYPES[self.type]
        scales = (np.float64(input_scale) * kernel_scales.astype(np.float64))
        key = (index, "bias", type_, scales.tobytes())
        if key not in self.constants:
            value = self.value(index).astype(np.float64)
            limit = np.iinfo(NUMPY[type_]).max
            codes = np.clip(np.round(value / scales), -limit, limit).astype(NUMPY[type_])
            q = schema.QuantizationParametersT()
            q.scale = [float(s) for s in scales]
            q.zeroPoint = [0] * len(q.scale)
            t = self.new_tensor(index, self.tensor(index).name.decode(), type_, None, codes)
            self.tensor(t).quantization = q
            self.constants[key] = t
        return self.constants[key]

    def operand_grid(self, op, index: int) -> Grid:
        """A constant operand's grid: its group's, but for an ADD / SUB a step no finer than
        the output's / 2^8: XNNPACK refuses an int8 addition whose operand steps differ from
        the output's by more than 2^10 (a detector's x + 1e-5 on a 0.08 grid), and a finer
        step than that only rounds values the sum does not keep."""
        grid = self.grid(index)
        if op_name(self.model, op) not in ("ADD", "SUB") or self.type != TT.INT8:
            return grid
        floor = self.grid(op.outputs[0]).scale / 2**8
        if grid.scale >= floor:
            return grid
        low = (self.span(index) or (0.0, 0.0))[0]
        qmin, qmax = LIMITS[grid.type]
        zero = int(np.clip(round(qmin - min(low, 0.0) / floor), qmin, qmax))
        return Grid(floor, zero, grid.type)

    def constant_codes(self, index: int, grid: Grid) -> int:
        """The integer copy of a constant read as a value, on its group's grid."""
        value = self.value(index)
        key = (index, "value", grid)
        if key not in self.constants:
            self.constants[key] = self.new_tensor(
                index, self.tensor(index).name.decode(), grid.type, grid, grid.codes(value))
        return self.constants[key]

    def outputs(self) -> None:
        """Each integer signature output read through a DEQUANTIZE, which takes its name."""
        replaced = {}
        self.graph.outputs = [int(i) for i in self.graph.outputs]
        for position, index in enumerate(self.graph.outputs):
            t = self.tensor(index)
            if t.type not in (TT.INT8, TT.INT16) or index not in self.parent:
                continue
            view = self.view(index, TT.FLOAT32)
            t.name, self.tensor(view).name = t.name + b"/" + _type_name(t.type), t.name
            replaced[index] = view
            self.graph.outputs[position] = view
        renumber_signature(self.model, replaced, outputs=True)


def _peaks(weights: np.ndarray, axis: int, per_tensor: bool) -> np.ndarray:
    """max|weights| over the whole tensor (shape (1,)) or per index of `axis`, a block of
    rows at a time past grids.BLOCK_ELEMENTS (the same maxima)."""
    if in_blocks(weights):
        parts = [_peaks(weights[rows], axis, per_tensor) for rows in row_blocks(weights)]
        return np.concatenate(parts) if axis == 0 and not per_tensor else np.max(parts, 0)
    if per_tensor:
        return np.abs(weights).max(keepdims=True).ravel()
    return np.abs(weights).max(axis=tuple(d for d in range(weights.ndim) if d != axis))


def _kernel_codes(weights: np.ndarray, scales: np.ndarray, axis: int) -> np.ndarray:
    """The int8 codes of `weights` on `scales` (one, or one per index of `axis`), a block
    of rows at a time past grids.BLOCK_ELEMENTS (the same codes)."""
    if in_blocks(weights):
        out = np.empty(weights.shape, np.int8)
        for rows in row_blocks(weights):
            part = scales[rows] if axis == 0 and scales.size > 1 else scales
            out[rows] = _kernel_codes(weights[rows], part, axis)
        return out
    shape = [1] * weights.ndim
    shape[axis] = -1
    return np.clip(np.round(weights / scales.reshape(shape)), -KERNEL_LIMIT,
                   KERNEL_LIMIT).astype(np.int8)


def drop_unused(model) -> None:
    """The main subgraph without the tensors no op or signature reads any more (float
    weights whose integer copies replaced them), and the file without their data."""
    graph = model.subgraphs[0]
    read = {int(i) for op in graph.operators
            for i in [*op.inputs, *op.outputs, *(op.intermediates or [])] if i >= 0}
    read |= {int(i) for i in [*graph.inputs, *graph.outputs]}
    kept = sorted(read)
    index = {old: new for new, old in enumerate(kept)}
    graph.tensors = [graph.tensors[i] for i in kept]
    for op in graph.operators:
        op.inputs = [index[int(i)] if i >= 0 else -1 for i in op.inputs]
        op.outputs = [index[int(i)] for i in op.outputs]
        if op.intermediates is not None and len(op.intermediates):
            op.intermediates = [index[int(i)] for i in op.intermediates]
    graph.inputs = [index[int(i)] for i in graph.inputs]
    graph.outputs = [index[int(i)] for i in graph.outputs]
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for entry in [*signature.inputs, *signature.outputs]:
                entry.tensorIndex = index[int(entry.tensorIndex)]
    used = {t.buffer for g in model.subgraphs for t in g.tensors}
    used |= {m.buffer for m in model.metadata or []}
    for k, buffer in enumerate(model.buffers):
        if k not in used and buffer.data is not None and len(buffer.data):
            buffer.data = None


OP_KEYS = {schema.BuiltinOperator.QUANTIZE: "QUANTIZE",
           schema.BuiltinOperator.DEQUANTIZE: "DEQUANTIZE",
           schema.BuiltinOperator.MAXIMUM: "MAXIMUM", schema.BuiltinOperator.MINIMUM: "MINIMUM"}


def _same_grid(tensor, grid: Grid) -> bool:
    q = tensor.quantization
    return (q is not None and q.scale is not None and len(q.scale) == 1
            and np.float32(q.scale[0]) == np.float32(grid.scale)
            and int(q.zeroPoint[0]) == grid.zero_point)


def _general_int16_scales(op) -> None:
    """16-bit ADD / SUB with any scales: their options default to power-of-two scales."""
    kinds = {schema.BuiltinOptions.AddOptions: schema.AddOptionsT,
             schema.BuiltinOptions.SubOptions: schema.SubOptionsT}
    if op.builtinOptionsType in kinds:
        if op.builtinOptions is None:
            op.builtinOptions = kinds[op.builtinOptionsType]()
        op.builtinOptions.potScaleInt16 = False


def _type_name(type_: int) -> bytes:
    return {TT.FLOAT32: b"float32", TT.INT8: b"int8", TT.INT16: b"int16",
            TT.UINT8: b"uint8"}[type_]
