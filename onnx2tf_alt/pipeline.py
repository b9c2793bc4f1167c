"""The conversion pipeline, in one place: load -> prepare -> find unsupported ops -> plan the
layouts -> build the Keras model. `build` runs it for a model; `run_subgraph_model` for the
body of an If / Loop / Scan on TF tensors (ops/control.py). Nothing here writes a file: the
callers (onnx2tf_alt/conversion.py, check/, the tests) decide what becomes of the result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from onnx2tf_alt import progress
from onnx2tf_alt.errors import ConversionError, InputError, NodeFailure
from onnx2tf_alt.ir.graph import Graph, Node, graph_from_model
from onnx2tf_alt.ir.loader import load_model
from onnx2tf_alt.ir.validate import check_consistency, check_inference
from onnx2tf_alt.ir.weights import spill
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.explain import describe
from onnx2tf_alt.layout.plan import Plan, plan_layouts
from onnx2tf_alt.layout.policies import LayoutPolicy
from onnx2tf_alt.logs import phase
from onnx2tf_alt.passes.prepare import parse_shape_overrides, prepare_model
from onnx2tf_alt.translate.failures import failure_for
from onnx2tf_alt.translate.lazy import stand_in
from onnx2tf_alt.translate.options import DEFAULT_OPTIONS, ConversionOptions
from onnx2tf_alt.translate.recursion import deep_graphs
from onnx2tf_alt.translate.registry import find_handler, foreign_inference

log = logging.getLogger("onnx2tf_alt")


@dataclass
class Converted:
    """Everything a conversion produced in memory."""

    result: object  # builder.BuildResult
    graph: Graph
    plan: Plan
    model: onnx.ModelProto
    options: ConversionOptions = DEFAULT_OPTIONS
    _tflite_result: object = None

    def rebuild(self, model: onnx.ModelProto, for_quantization: bool = False) -> Converted:
        """Build `model` (a rewrite of this one) with exactly this conversion's input layouts,
        as this one was built: by TF, or by the direct writer (no Keras model; with
        `for_quantization`, the graph a quantizer starts from: ConversionOptions)."""
        keep, force = _input_layouts(self.result.input_perms)
        if self.result.model is None:
            from dataclasses import replace

            from onnx2tf_alt.tflite.direct import DirectResult, write_direct

            options = replace(self.options, for_quantization=for_quantization)
            planned = float32_planned(plan_loaded(model, None, None, keep, force,
                                                  options=options))
            result = write_direct(planned.graph, planned.plan, planned.options)
            if not isinstance(result, DirectResult):
                raise ConversionError(f"the direct writer does not cover the model rewritten "
                                      f"for quantization: {result}")
            return Converted(result=result, graph=planned.graph, plan=planned.plan,
                             model=planned.model, options=planned.options,
                             _tflite_result=result)
        return build(onnx_graph=model, keep_ncw_or_nchw_or_ncdhw_input_names=keep,
                     keep_nwc_or_nhwc_or_ndhwc_input_names=force, options=self.options)

    def tflite_result(self):
        """The BuildResult the .tflite files are converted from: `result` itself, or for a
        model with float64 or float16 tensors a rebuild computing in float32 (see
        passes/float32_compute.py)."""
        from onnx2tf_alt.passes.float32_compute import compute_in_float32, needs_float32_compute

        if self._tflite_result is None:
            self._tflite_result = self.result
            if needs_float32_compute(self.model):
                log.info("TFLite has few float64/float16 kernels: .tflite files compute in float32")
                self._tflite_result = self.rebuild(compute_in_float32(self.model)).result
        return self._tflite_result


def _input_layouts(input_perms: dict) -> tuple[list[str], list[str]]:
    """The -k and -kt names that give a model's inputs of rank 3 or more these perms."""
    keep, force = [], []
    for name, perm in input_perms.items():
        if len(perm) >= 3:
            (keep if P.is_identity(perm) else force).append(name)
    return keep, force


def stem_of(input_onnx_file_path: str | None) -> str:
    """The base name the output files get: the ONNX file's name without extension."""
    if not input_onnx_file_path:
        return "model"
    return os.path.splitext(os.path.basename(os.fspath(input_onnx_file_path)))[0]


def check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and batch_size < 1:
        raise InputError(f"-b/--batch_size must be at least 1 (got {batch_size}).")


def unsupported_nodes(graph: Graph) -> list[NodeFailure]:
    """A failure for each node no handler converts at the graph's opset."""
    return [
        failure_for(node, graph, "unsupported op: no handler for this op type and opset")
        for node in graph.nodes
        if find_handler(node.op_type, node.domain, graph.opset_of(node.domain)) is None
    ]


def policy_of(graph: Graph) -> Callable[[Node], LayoutPolicy]:
    """The layout policy of each node: its handler's, at the graph's opset."""

    def policy(node: Node) -> LayoutPolicy:
        return find_handler(node.op_type, node.domain, graph.opset_of(node.domain)).layout

    return policy


def plan_graph(
    graph: Graph,
    keep_channel_first: frozenset[str] = frozenset(),
    force_channel_last: frozenset[str] = frozenset(),
) -> Plan:
    """The layout plan of a graph whose ops are all supported (see unsupported_nodes)."""
    return plan_layouts(graph, policy_of(graph), keep_channel_first, force_channel_last)


def build(
    input_onnx_file_path: str | None = None,
    onnx_graph: onnx.ModelProto | None = None,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
    keep_ncw_or_nchw_or_ncdhw_input_names: list[str] | None = None,
    keep_nwc_or_nhwc_or_ndhwc_input_names: list[str] | None = None,
    show_progress: bool = False,
    allow_newer_opset: bool = False,
    input_names_to_interrupt_model_conversion: list[str] | None = None,
    output_names_to_interrupt_model_conversion: list[str] | None = None,
    options: ConversionOptions | None = None,
) -> Converted:
    """Load, prepare, plan and build the Keras model without writing any file; `options`
    are the lowering choices the handlers read (onnx2tf_alt/translate/options.py)."""
    model = load_model(input_onnx_file_path, onnx_graph, allow_newer_opset)
    return build_loaded(
        model, batch_size, overwrite_input_shape, keep_ncw_or_nchw_or_ncdhw_input_names,
        keep_nwc_or_nhwc_or_ndhwc_input_names, show_progress,
        input_names_to_interrupt_model_conversion, output_names_to_interrupt_model_conversion,
        options,
    )


@deep_graphs()
def build_loaded(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
    keep_ncw_or_nchw_or_ncdhw_input_names: list[str] | None = None,
    keep_nwc_or_nhwc_or_ndhwc_input_names: list[str] | None = None,
    show_progress: bool = False,
    input_names_to_interrupt_model_conversion: list[str] | None = None,
    output_names_to_interrupt_model_conversion: list[str] | None = None,
    options: ConversionOptions | None = None,
) -> Converted:
    """`build` for a model `load_model` returned (which this takes over and modifies).
    With -inimc / -onimc names, only the prepared graph's part between those tensors is
    converted (ir/subgraph.py)."""
    planned = plan_loaded(
        model, batch_size, overwrite_input_shape, keep_ncw_or_nchw_or_ncdhw_input_names,
        keep_nwc_or_nhwc_or_ndhwc_input_names, input_names_to_interrupt_model_conversion,
        output_names_to_interrupt_model_conversion, options)
    return translate(planned, show_progress)


def build_direct(input_onnx_file_path: str | None = None,
                 onnx_graph: onnx.ModelProto | None = None, show_progress: bool = False,
                 allow_newer_opset: bool = False, **plan_options) -> Converted:
    """`build` (the same keywords) without TensorFlow: the direct writer's float32 .tflite
    of the same plan (direct_conversion), with no Keras model (`result.model` is None).
    ConversionError naming the first node the direct writer does not cover."""
    del show_progress  # the direct writer is quick: no progress bar
    model = load_model(input_onnx_file_path, onnx_graph, allow_newer_opset)
    planned, found = direct_conversion(plan_loaded(model, **plan_options))
    if not isinstance(found, Converted):
        raise ConversionError(
            [failure_for(found.node, planned.graph, str(found))] if found.node else [],
            headline=f"the direct TFLite writer: {found}; check it with TensorFlow "
                     "installed (keras=True).")
    return found


def direct_conversion(planned: Planned, bound_bytes: int | None = None):
    """(`planned` computing in float32 (float32_planned: a float64 / float16 model's
    rewrite, as the CLI writes it), and the direct writer's conversion of it (tflite/
    direct.py) as a Converted with no Keras model, or the NotCovered saying why not).
    `bound_bytes`: past these weight bytes the file is written as it is packed
    (default: direct.BOUND_BYTES)."""
    from onnx2tf_alt.tflite.direct import BOUND_BYTES, DirectResult, write_direct

    planned = float32_planned(planned)
    with phase("tflite float32 (direct)"):
        result = write_direct(planned.graph, planned.plan, planned.options,
                              BOUND_BYTES if bound_bytes is None else bound_bytes)
    if not isinstance(result, DirectResult):
        return planned, result
    return planned, Converted(result=result, graph=planned.graph, plan=planned.plan,
                              model=planned.model, options=planned.options,
                              _tflite_result=result)


@dataclass
class Planned:
    """A prepared model, its graph view and its layout plan: what the TF build and the
    direct TFLite writer (tflite/direct.py) start from."""

    graph: Graph
    plan: Plan
    model: onnx.ModelProto
    options: ConversionOptions = DEFAULT_OPTIONS


def plan_loaded(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
    keep_ncw_or_nchw_or_ncdhw_input_names: list[str] | None = None,
    keep_nwc_or_nhwc_or_ndhwc_input_names: list[str] | None = None,
    input_names_to_interrupt_model_conversion: list[str] | None = None,
    output_names_to_interrupt_model_conversion: list[str] | None = None,
    options: ConversionOptions | None = None,
) -> Planned:
    """Prepare and plan a loaded model (the stages before the build; no TensorFlow)."""
    from onnx2tf_alt.ir.subgraph import extract_subgraph

    check_batch_size(batch_size)
    options = options or DEFAULT_OPTIONS
    with phase("prepare"):
        check_inference(model)
        model = prepare_model(model, batch_size, overwrite_input_shape,
                              infer_foreign=foreign_inference)
        model, _ = spill(model)  # the weights constant folding made (ir/weights.py)
    if input_names_to_interrupt_model_conversion or output_names_to_interrupt_model_conversion:
        model = extract_subgraph(model, input_names_to_interrupt_model_conversion,
                                 output_names_to_interrupt_model_conversion)
    graph = graph_from_model(model)
    check_consistency(graph)
    keep = _known_inputs(graph, "-k", keep_ncw_or_nchw_or_ncdhw_input_names)
    force = _known_inputs(graph, "-kt", keep_nwc_or_nhwc_or_ndhwc_input_names)
    missing = unsupported_nodes(graph)
    if missing:
        error = ConversionError(missing, headline=f"{len(missing)} node(s) have unsupported ops:")
        error.prepared_model = model  # replayed by the failure reports (check/repro.py)
        raise error
    with phase("plan"):
        plan = plan_graph(graph, keep, force)
    if log.isEnabledFor(logging.DEBUG):
        for line in describe(graph, plan):
            log.debug("layout plan: %s", line)
    return Planned(graph, plan, model, options)


def float32_planned(planned: Planned) -> Planned:
    """What the .tflite files are written from: `planned` itself, or for a model with
    float64 or float16 tensors its rewrite computing in float32 (passes/float32_compute.py),
    planned with the same input layouts (as Converted.tflite_result rebuilds it)."""
    from onnx2tf_alt.passes.float32_compute import compute_in_float32, needs_float32_compute

    if not needs_float32_compute(planned.model):
        return planned
    log.info("TFLite has few float64/float16 kernels: .tflite files compute in float32")
    keep, force = _input_layouts({n: planned.plan.perms[n] for n in planned.graph.inputs})
    return plan_loaded(compute_in_float32(planned.model),
                       keep_ncw_or_nchw_or_ncdhw_input_names=keep,
                       keep_nwc_or_nhwc_or_ndhwc_input_names=force, options=planned.options)


@deep_graphs()
def translate(planned: Planned, show_progress: bool = False) -> Converted:
    """Build the Keras model of a planned model, node by node."""
    from onnx2tf_alt import version

    version.require("the TF / Keras model (saved_model, -oh5, -okv3, -coto / -cotof, "
                     "onnx2tf_alt.check, pipeline.build)")
    from onnx2tf_alt.translate.builder import ModelBuilder

    graph, plan, model = planned.graph, planned.plan, planned.model
    try:
        with phase("translate"), progress.counting("translating", len(graph.nodes)) as nodes:
            result = ModelBuilder(graph, plan, nodes if show_progress else None,
                                  planned.options).build()
    except ConversionError as error:
        error.prepared_model = model
        raise
    return Converted(result=result, graph=graph, plan=plan, model=model,
                     options=planned.options)


def check_input_names(model: onnx.ModelProto, overwrite_input_shape: list[str] | None,
                      keep: dict[str, list[str] | None] | None) -> None:
    """-ois names, and those of `keep` ({flag: names}: -k, -kt; None when -inimc makes other
    tensors inputs), against the inputs of the loaded `model`: InputError as prepare and
    the plan would raise it, on the ONNX alone (before TensorFlow loads)."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    _refuse_unknown("-ois", parse_shape_overrides(overwrite_input_shape), sorted(inputs))
    for flag, names in (keep or {}).items():
        _refuse_unknown(flag, names, inputs)


def _known_inputs(graph: Graph, flag: str, names: list[str] | None) -> frozenset[str]:
    _refuse_unknown(flag, names, graph.inputs)
    return frozenset(names or [])


def _refuse_unknown(flag: str, names, inputs: list[str]) -> None:
    unknown = sorted(set(names or []) - set(inputs))
    if unknown:
        raise InputError(f"{flag} names input(s) {unknown} that the model does not have; its "
                         f"inputs are {inputs}.")


def run_subgraph_model(prepared: onnx.ModelProto, feeds: dict) -> list:
    """Convert a prepared subgraph model (an If / Loop / Scan body) and run it on `feeds`
    (TF tensors, or arrays for constants, by input name); its inputs stay in ONNX order.
    Returns its outputs in ONNX order and layout."""
    graph = graph_from_model(prepared)
    missing = unsupported_nodes(graph)
    if missing:
        raise ConversionError(missing, headline="a subgraph has unsupported ops:")
    plan = plan_graph(graph, keep_channel_first=frozenset(graph.inputs))
    recorder = stand_in()
    if recorder is not None:  # the direct writer's Recorder (tflite/recorder.py)
        return recorder.run_subgraph(graph, plan, feeds)
    from onnx2tf_alt.translate.builder import ModelBuilder

    return ModelBuilder(graph, plan).run(feeds)
