"""Make a loaded model static and simple before planning: shapes, names, folded constants."""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.ir.index import GraphIndex, default_opset, dims_of
from onnx2tf_alt.ir.weights import add_spilled, to_array, weight_free_copy
from onnx2tf_alt.passes.control_flow import inline_control_flow
from onnx2tf_alt.passes.conv_regions import split_padded_regions
from onnx2tf_alt.passes.conv_taps import cut_dead_taps
from onnx2tf_alt.passes.deconv_phases import split_transposed_convs
from onnx2tf_alt.passes.dense_flatten import flatten_channel_last
from onnx2tf_alt.passes.empty_rows import guard_empty_rows
from onnx2tf_alt.passes.fusion import fuse_patterns
from onnx2tf_alt.passes.neutral import drop_neutral_arithmetic
from onnx2tf_alt.passes.nms_limits import bound_nms_by_slices
from onnx2tf_alt.passes.one_group_norm import rewrite_one_group_norms
from onnx2tf_alt.passes.qdq_pairs import fuse_quant_pairs
from onnx2tf_alt.passes.shape_values import fill_computed_shape_gaps, known_part
from onnx2tf_alt.passes.shuffle import absorb_channel_shuffles

log = logging.getLogger("onnx2tf_alt")

NONDETERMINISTIC_OPS = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
}
MAX_FOLDED_ELEMENTS = 50_000_000


def parse_shape_overrides(specs: list[str] | None) -> dict[str, list[int]]:
    """`['input:1,3,224,224', 'mask:1,224']` -> {'input': [1, 3, 224, 224], ...}."""
    overrides = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            values = [int(d) for d in dims.split(",")]
            if any(v <= 0 for v in values):
                raise ValueError
        except ValueError:
            raise InputError(
                f"Bad -ois/--overwrite_input_shape value '{spec}': expected NAME:D1,D2,... with "
                "positive integers, e.g. 'input:1,3,224,224'."
            ) from None
        overrides[name] = values
    return overrides


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node a unique name (op type + index), recursing into subgraphs."""
    taken = {n.name for n in graph.node if n.name}
    for i, node in enumerate(graph.node):
        if not node.name:
            name, k = f"{node.op_type}_{i}", 1
            while name in taken:
                name, k = f"{node.op_type}_{i}_{k}", k + 1
            node.name = name
            taken.add(name)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                name_nodes(sub)


def set_input_shapes(
    model: onnx.ModelProto, batch_size: int | None, overrides: dict[str, list[int]]
) -> None:
    """Fix symbolic input dims from -b / -ois; a symbol fixed once is fixed everywhere."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    names = {i.name for i in inputs}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise InputError(
            f"-ois names input(s) {unknown} that the model does not have; its inputs are "
            f"{sorted(names)}."
        )
    symbols: dict[str, int] = {}
    for info in inputs:
        dims = info.type.tensor_type.shape.dim
        if info.name in overrides:
            wanted = overrides[info.name]
            if len(wanted) != len(dims):
                raise InputError(
                    f"-ois gives {len(wanted)} dims for input '{info.name}', which has rank "
                    f"{len(dims)}."
                )
            for dim, value in zip(dims, wanted):
                if dim.HasField("dim_param"):
                    symbols[dim.dim_param] = value
                dim.dim_value = value
        elif batch_size is not None and len(dims) > 0:
            if dims[0].HasField("dim_param"):
                symbols[dims[0].dim_param] = batch_size
            dims[0].dim_value = batch_size
    for info in inputs:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                value = symbol_value(dim.dim_param, symbols)
                if value is not None:
                    dim.dim_value = value


def symbol_value(expression: str, symbols: dict[str, int]) -> int | None:
    """The value of a symbolic dim given the fixed `symbols`: a symbol, or a sum, difference
    or product of symbols and integers (`past_sequence + sequence`, `s0 + 1`); None when a
    symbol in it is not fixed or it is anything else."""
    if expression in symbols:
        return symbols[expression]
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None

    def value(node) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return symbols.get(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = value(node.left), value(node.right)
            return None if left is None or right is None else _ARITHMETIC[type(node.op)](
                left, right)
        return None

    found = value(tree)
    return found if found is not None and found > 0 else None


_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
               ast.Mult: lambda a, b: a * b}


# (op_type, domain, opset) -> the handler's `infer(node, input types)` for ops ONNX shape
# inference does not know, or None. The translate layer supplies it (translate/registry.py's
# `foreign_inference`): the passes never import the handlers or TensorFlow themselves.
ForeignInference = Callable[[str, str, int], Callable | None]


def infer_shapes(model: onnx.ModelProto, infer_foreign: ForeignInference | None = None,
                 computed: bool = True) -> onnx.ModelProto:
    """ONNX shape inference (with data propagation) plus `fill_same_shape_gaps`,
    `fill_handler_gaps` (with `infer_foreign`), `fill_control_flow_gaps` and, with
    `computed`, `fill_computed_shape_gaps`, on a weight-free copy; the inferred value infos
    and output types are written into `model`."""
    light = weight_free_copy(model)
    declared = _strip_declared_shapes(light)
    light = _infer_rounds(light, infer_foreign, computed)
    if _restore_unknown_shapes(light, declared):  # inference continues from those hints
        light = _infer_rounds(light, infer_foreign, computed)
    _merge_declared_shapes(light, declared)
    graph = model.graph
    del graph.value_info[:]
    graph.value_info.extend(light.graph.value_info)
    del graph.output[:]
    graph.output.extend(light.graph.output)
    return model


def _infer_rounds(light: onnx.ModelProto, infer_foreign: ForeignInference | None,
                  computed: bool = True) -> onnx.ModelProto:
    for _ in range(16):  # each round also infers past one more op ONNX does not know
        try:
            light = shape_inference.infer_shapes(light, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - a partial inference still lets us convert
            log.warning("ONNX shape inference failed (%s); continuing with known shapes", exc)
            break
        if not (fill_same_shape_gaps(light) + fill_handler_gaps(light, infer_foreign)
                + fill_control_flow_gaps(light)
                + (fill_computed_shape_gaps(light) if computed else 0)):
            break
    return light


# Declared value_info and output shapes are hints, not truth: exporters and hand edits leave
# stale ones (e.g. an output declared [1, seqlen] that computes [T, 1, C]). ONNX inference
# keeps a declared shape it cannot merge with and silently propagates it; onnxruntime warns
# ("Error merging shape info") and follows the computation. So inference runs without them,
# and a declared shape only fills what inference leaves unknown.


def _strip_declared_shapes(light: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Clear the shapes of `light`'s value infos and outputs; returns copies of the declared
    ones by value name. Value infos of initializers keep theirs: an initializer's shape is a
    fact, and ONNX's inference reads a Slice whose `axes` has a shapeless value info as if it
    had no `axes` (torch's dynamo exporter declares its constants so: a rotary embedding's
    halves then came out [0, heads, seq, 2 * half])."""
    constants = {i.name for i in light.graph.initializer}
    declared = {}
    for info in [*light.graph.value_info, *light.graph.output]:
        if info.name in constants:
            continue
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            declared[info.name] = onnx.ValueInfoProto()
            declared[info.name].CopyFrom(info)
            info.type.tensor_type.ClearField("shape")
    return declared


def _restore_unknown_shapes(light: onnx.ModelProto,
                            declared: dict[str, onnx.ValueInfoProto]) -> int:
    """Put back the declared shapes of values inference left without one; returns how many."""
    infos = {v.name: v for v in [*light.graph.value_info, *light.graph.output]}
    restored = 0
    for name, hint in declared.items():
        info = infos.get(name)
        if info is None:
            light.graph.value_info.append(hint)
            restored += 1
        elif not info.type.tensor_type.HasField("shape"):
            info.type.tensor_type.shape.CopyFrom(hint.type.tensor_type.shape)
            restored += 1
    return restored


def _merge_declared_shapes(light: onnx.ModelProto,
                           declared: dict[str, onnx.ValueInfoProto]) -> None:
    """Fill the dims inference left unknown from the declared shapes; where a declared shape
    contradicts the inferred one, keep the inferred one and warn (once: the next inference
    reads the merged shapes)."""
    infos = {v.name: v for v in [*light.graph.value_info, *light.graph.output]}
    outputs = {o.name for o in light.graph.output}
    for name, hint in declared.items():
        info = infos.get(name)
        if info is None or not info.type.tensor_type.HasField("shape"):
            continue
        dims, hints = info.type.tensor_type.shape.dim, hint.type.tensor_type.shape.dim
        if len(dims) != len(hints) or any(
                d.HasField("dim_value") and h.HasField("dim_value") and d.dim_value != h.dim_value
                for d, h in zip(dims, hints)):
            log.warning(
                "declared shape %s of %s '%s' contradicts the computed %s; using the computed "
                "one", _dims_text(hints), "output" if name in outputs else "value",
                name, _dims_text(dims))
            continue
        for dim, hinted in zip(dims, hints):
            if not dim.HasField("dim_value") and (hinted.HasField("dim_value")
                                                  or hinted.HasField("dim_param")):
                dim.CopyFrom(hinted)


def _dims_text(dims) -> str:
    return "[" + ", ".join(
        str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in dims) + "]"


# Ops whose first output has the shape and dtype of their first input. Used where ONNX shape
# inference leaves a value unknown (e.g. GroupNormalization-21 has no inference function).
SAME_SHAPE_OPS = {
    "GroupNormalization", "InstanceNormalization", "LayerNormalization", "BatchNormalization",
    "LRN", "MeanVarianceNormalization", "LpNormalization", "Relu", "LeakyRelu", "PRelu", "Elu",
    "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Mish", "Tanh", "Softplus",
    "Softsign", "Gelu", "Erf", "Clip", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs",
    "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softmax", "LogSoftmax", "Identity",
    "Dropout", "ThresholdedRelu", "Shrink", "Hardmax",
    "BiasGelu", "FastGelu", "QuickGelu",  # com.microsoft (onnxruntime's transformers optimizer)
}


def fill_same_shape_gaps(model: onnx.ModelProto) -> int:
    """Give unknown outputs of shape-preserving ops their input's type (in graph order).

    Returns how many values were filled, so inference can run again downstream of them.
    """
    filled = 0
    graph = model.graph
    index = GraphIndex(graph)
    outputs = {o.name: o for o in graph.output}

    def fill(name: str, source, elem_type: int | None = None) -> None:
        target = outputs.get(name)
        if target is None:
            target = graph.value_info.add()
            target.name = name
        target.type.CopyFrom(source.type)
        if elem_type is not None:
            target.type.tensor_type.elem_type = elem_type
        index.infos[name] = target

    for node in graph.node:
        if node.op_type not in SAME_SHAPE_OPS or not node.input or not node.output:
            continue
        source = index.info(node.input[0])
        if _type_of(source) is None:
            continue
        targets = [(node.output[0], None)]
        if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
            targets.append((node.output[1], onnx.TensorProto.BOOL))  # the mask
        for name, elem_type in targets:
            if _type_of(index.info(name)) is None:
                fill(name, source, elem_type)
                filled += 1
    return filled


def fill_handler_gaps(model: onnx.ModelProto, infer_foreign: ForeignInference | None) -> int:
    """Types of the outputs of ops from other domains (com.microsoft, ...), which ONNX shape
    inference does not know, from their handlers' `infer` (in graph order).

    Returns how many values were filled, so inference can run again downstream of them.
    """
    graph = model.graph
    foreign = [n for n in graph.node
               if n.domain not in ("", "ai.onnx") or not onnx.defs.has(n.op_type)]
    if not foreign or infer_foreign is None:
        return 0

    index = GraphIndex(graph)
    declared = {v.name: v for v in [*graph.value_info, *graph.output]}
    opsets = {o.domain: o.version for o in model.opset_import}
    filled = 0
    for node in foreign:
        if all(_type_of(index.info(o)) is not None for o in node.output if o):
            continue
        infer = infer_foreign(node.op_type, node.domain, opsets.get(node.domain, 1))
        types = [_type_of(index.info(i)) if i else None for i in node.input]
        if infer is None or any(t is None for i, t in zip(node.input, types) if i):
            continue
        for name, result in zip(node.output, infer(node, types)):
            if not name or result is None or _type_of(index.info(name)) is not None:
                continue
            info = helper.make_tensor_value_info(name, result[0], list(result[1]))
            target = declared.get(name) or graph.value_info.add()
            target.CopyFrom(info)
            index.infos[name] = target
            filled += 1
    return filled


def fill_control_flow_gaps(model: onnx.ModelProto) -> int:
    """Loop-carried values and If outputs that ONNX inference leaves without any shape
    because their dims differ between iterations or branches (e.g. torchvision's mask and
    keypoint post-processing grows a (0, H, W) constant by concatenation in a Loop). Their
    element type and rank agree, so they are known: dims on which the initial value, body
    output or branches agree are kept, the others unknown.

    Returns how many values were filled, so inference can run again downstream of them.
    """
    graph = model.graph
    index = GraphIndex(graph)
    declared = {v.name: v for v in [*graph.value_info, *graph.output]}  # typed, no shape
    filled = 0
    for node in graph.node:
        for name, sources in _control_flow_sources(node, index):
            if not name or _type_of(index.info(name)) is not None:
                continue
            types = [_type_of(source) for source in sources]
            if not types or None in types or len({(t, len(d)) for t, d in types}) != 1:
                continue
            dims = [d[0] if isinstance(d[0], int) and d.count(d[0]) == len(d) else None
                    for d in zip(*(dims for _, dims in types))]
            info = helper.make_tensor_value_info(name, types[0][0], dims)
            target = declared.get(name) or graph.value_info.add()
            target.CopyFrom(info)
            index.infos[name] = target
            filled += 1
    return filled


def _control_flow_sources(node, index: GraphIndex) -> list[tuple[str, list]]:
    """(output name, value infos it takes its type from) for a Loop's carried outputs (body
    output and initial value) and an If's outputs (both branches)."""
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if node.op_type == "Loop" and "body" in graphs:
        body = graphs["body"].output
        carried = min(len(node.input) - 2, len(body) - 1, len(node.output))
        return [(node.output[k], [body[1 + k], index.info(node.input[2 + k])])
                for k in range(carried)]
    if node.op_type == "If" and {"then_branch", "else_branch"} <= set(graphs):
        branches = graphs["then_branch"].output, graphs["else_branch"].output
        return [(name, [branches[0][k], branches[1][k]]) for k, name in enumerate(node.output)
                if k < min(map(len, branches))]
    return []


def _type_of(info) -> tuple[int, list] | None:
    """(elem_type, dims: int, str or None each) of a value info with both known, else
    None."""
    dims = dims_of(info)
    if dims is None or info.type.tensor_type.elem_type == 0:
        return None
    return info.type.tensor_type.elem_type, dims


def _subgraph_names(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                names.update(i for n in sub.node for i in n.input)
                names.update(_subgraph_names(sub))
    return names


def fold_constants(model: onnx.ModelProto) -> bool:
    """Evaluate nodes whose inputs are all known at conversion time; True if any folded.

    Shape and Size of statically shaped values count as known, so shape subgraphs
    (Shape -> Gather -> Concat -> Reshape) collapse into constant reshape targets.
    """
    graph = model.graph
    known = _KnownValues(graph.initializer)
    index = GraphIndex(graph)
    opset = default_opset(model)
    shapes = _NodeShapes(index, known, opset, model.opset_import)
    folded_nodes = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC_OPS:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        values = _try_fold(node, known, shapes, opset)
        if values is None:
            shapes.infer(node)
            continue
        known.update(values)
        folded_nodes.append(node)
    if not folded_nodes:
        return False
    folded_outputs = {o for n in folded_nodes for o in n.output}
    folded_ids = {id(n) for n in folded_nodes}  # `in` on a list compares whole protos
    remaining = [n for n in graph.node if id(n) not in folded_ids]
    used = {i for n in remaining for i in n.input} | {o.name for o in graph.output}
    used |= _subgraph_names(graph)
    keep_inits = [i for i in graph.initializer if i.name in used]
    del graph.node[:]
    graph.node.extend(remaining)
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
    folded_names = folded_outputs & used
    for name in sorted(folded_names):  # a large one into a temporary file (add_spilled)
        add_spilled(graph.initializer, name, np.asarray(known[name]))
    kept_vi = [v for v in graph.value_info if v.name not in folded_names]
    del graph.value_info[:]
    graph.value_info.extend(kept_vi)
    return True


class _KnownValues(dict):
    """Values known at conversion time by name: the initializers, decoded only when a fold
    reads them (each round of `prepare_model` used to decode every weight of the model),
    and the outputs folded so far."""

    def __init__(self, initializers):
        super().__init__()
        self._tensors = {t.name: t for t in initializers}

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or name in self._tensors

    def __missing__(self, name):
        value = self[name] = to_array(self._tensors[name])
        return value


class _NodeShapes:
    """Static shapes during one `fold_constants` pass: those the graph declares, and those
    of the outputs of nodes left unfolded, inferred node by node (ONNX's inference of the
    op, given its inputs' types and the small constants among them) as the pass walks the
    graph. A Shape downstream of a Reshape whose target was just folded then folds in the
    same pass: swin_t's prepare needed 17 rounds of fold + whole-graph shape inference."""

    def __init__(self, index: GraphIndex, known: _KnownValues, opset: int, opset_import):
        self.index, self.known = index, known
        self.opset, self.opset_import = opset, list(opset_import)
        self.types: dict[str, onnx.TypeProto] = {}  # inferred here, all dims known

    def static_shape(self, name: str) -> list[int] | None:
        found = self.types.get(name)
        if found is not None:
            return [d.dim_value for d in found.tensor_type.shape.dim]
        return self.index.static_shape(name)

    def infer(self, node: onnx.NodeProto) -> None:
        outputs = [o for o in node.output if o]
        if not outputs or all(self.static_shape(o) is not None for o in outputs):
            return
        types, data = {}, {}
        for name in node.input:
            if not name:
                continue
            declared = self.types.get(name)
            if declared is None:
                declared = self._declared(name)
            if declared is None:
                return
            types[name] = declared
            if name in self.known and _elements(declared) <= SHAPE_LIKE_ELEMENTS:
                data[name] = numpy_helper.from_array(np.asarray(self.known[name]), name)
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, node.domain)
            inferred = shape_inference.infer_node_outputs(schema, node, types, data,
                                                          opset_imports=self.opset_import)
        except Exception as exc:  # noqa: BLE001 - whole-graph inference runs after the pass
            log.debug("no node inference for %s (%s): %s", node.name, node.op_type, exc)
            return
        for name, found in inferred.items():
            tensor = found.tensor_type
            if (found.HasField("tensor_type") and tensor.elem_type and tensor.HasField("shape")
                    and all(d.HasField("dim_value") for d in tensor.shape.dim)):
                self.types[name] = found

    def _declared(self, name: str) -> onnx.TypeProto | None:
        info = self.index.info(name)
        if info is None or not info.type.HasField("tensor_type"):
            return None
        return info.type


SHAPE_LIKE_ELEMENTS = 1024  # constants up to this size are given to node inference


def _elements(found: onnx.TypeProto) -> int:
    """The element count of a tensor type, its unknown dims counted as 1."""
    return int(np.prod([d.dim_value if d.HasField("dim_value") else 1
                        for d in found.tensor_type.shape.dim], dtype=np.int64))


def _try_fold(node, known, shapes: _NodeShapes, opset) -> dict[str, np.ndarray] | None:
    if node.op_type in ("Shape", "Size") and node.input[0] not in known:
        shape = shapes.static_shape(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return {node.output[0]: np.array(int(np.prod(shape)), dtype=np.int64)}
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", None)
        return {node.output[0]: np.array(shape[start:end], dtype=np.int64)}
    if node.op_type in ("Gather", "Slice") and node.input[0] not in known:
        part = known_part(node, shapes.index, known, opset)
        return None if part is None else {node.output[0]: part}
    if not all((not i) or i in known for i in node.input):
        return None
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        value = _constant_value(node)
        if value is not None:
            return _folded(node, [value])
    if node.op_type == "Constant" or node.input:
        return _evaluate(node, known, opset)
    return None


def _constant_value(node) -> np.ndarray | None:
    """A Constant's value read from its attribute (a TorchScript export writes one per
    scalar: 70 in MobileNetV2, 0.6 ms each through the reference evaluator); None for the
    forms it does not read (a sparse value), which the evaluator then folds."""
    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    readers = {"value_float": lambda a: np.array(a.f, np.float32),
               "value_floats": lambda a: np.array(list(a.floats), np.float32),
               "value_int": lambda a: np.array(a.i, np.int64),
               "value_ints": lambda a: np.array(list(a.ints), np.int64)}
    return readers[attr.name](attr) if attr.name in readers else None


def _evaluate(node, known, opset) -> dict[str, np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    try:
        feeds = {i: known[i] for i in node.input if i}
        graph = helper.make_graph(
            [node],
            "fold",
            [helper.make_tensor_value_info(i, onnx.TensorProto.UNDEFINED, None) for i in feeds],
            [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o],
        )
        outs = ReferenceEvaluator(graph, opsets={"": opset}).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - folding is an optimization; convert it instead
        log.debug("not folding %s (%s): %s", node.name, node.op_type, exc)
        return None
    return _folded(node, outs)


def _folded(node, outs) -> dict[str, np.ndarray] | None:
    """{output name: value} of a node computed at conversion time, or None where a value
    is not an array, too large to fold or of strings."""
    result = {}
    for name, value in zip(node.output, outs):
        if not name:
            continue
        if not isinstance(value, np.ndarray) and not np.isscalar(value):
            return None
        value = np.asarray(value)
        if value.size > MAX_FOLDED_ELEMENTS or value.dtype == object:
            return None
        result[name] = value
    return result


# Each round folds what shape inference made computable since the previous one, so a chain
# of shape computations takes one round per Reshape it runs through: swin_t needs 16 (3124
# nodes -> 581, unknown-shape values 1330 -> 610; after 8 rounds it still had 1611 and 867).
MAX_FOLD_ROUNDS = 32


def _has_run_time_inputs(model: onnx.ModelProto) -> bool:
    constants = {i.name for i in model.graph.initializer}
    return any(dims is None or not all(isinstance(d, int) for d in dims)
               for dims in (dims_of(i) for i in model.graph.input if i.name not in constants))


def prepare_model(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
    infer_foreign: ForeignInference | None = None,
) -> onnx.ModelProto:
    """Name nodes, fix input shapes, infer shapes and fold constants until nothing changes,
    then run the rewrite passes (in this order). `infer_foreign` types the outputs of ops
    ONNX shape inference does not know (see ForeignInference)."""
    name_nodes(model.graph)
    set_input_shapes(model, batch_size, parse_shape_overrides(overwrite_input_shape))
    # the shapes computed from Shape values: where the inputs' shapes are static, folding
    # them first makes most of those computations constants (Swin-T's first inference 0.3
    # s -> 0.1 s)
    model = infer_shapes(model, infer_foreign, computed=_has_run_time_inputs(model))
    for _ in range(MAX_FOLD_ROUNDS):
        folded = fold_constants(model)
        if not (inline_control_flow(model) or folded):
            break
        model = infer_shapes(model, infer_foreign)
    kept = _subgraph_names(model.graph)
    pairs = fuse_quant_pairs(model, kept)
    if pairs:
        log.info("%d QuantizeLinear -> DequantizeLinear pairs computed in float: the "
                 "float32 .tflite emulates them; -oiqt's _integer_quant.tflite runs them on "
                 "integer kernels (the file to deploy: docs/quantization.md#qdq-models)", pairs)
    dropped = drop_neutral_arithmetic(model, kept)
    if dropped:
        log.info("%d Mul / Div by 1, Add / Sub of 0 removed", dropped)
    if rewrite_one_group_norms(model):
        model = infer_shapes(model, infer_foreign)
    if bound_nms_by_slices(model):
        log.info("NonMaxSuppression: limits lowered to the rows a Slice reads")
    if guard_empty_rows(model):
        model = infer_shapes(model, infer_foreign)
    if split_transposed_convs(model):  # after: a guarded region's rows are never 0 here
        model = infer_shapes(model, infer_foreign)
    flatten_channel_last(model)
    absorb_channel_shuffles(model)
    cut_dead_taps(model)
    if split_padded_regions(model):
        model = infer_shapes(model, infer_foreign)
    return infer_shapes(fuse_patterns(model), infer_foreign)
