"""-inimc / -onimc: convert only the part of a model between named tensors.

The prepared model (static shapes, every value typed) is cut with onnx's Extractor: the
-inimc tensors become the model's inputs, the -onimc tensors its outputs (defaults: the
model's own). Graph inputs the part still reads stay inputs (after the named ones); an
unknown name, or a named input the outputs do not depend on, is an error.
"""

from __future__ import annotations

import logging

import onnx
from onnx.utils import Extractor

from onnx2tf_alt.errors import InputError, printable

log = logging.getLogger("onnx2tf_alt")

INPUTS_FLAG, OUTPUTS_FLAG = "-inimc", "-onimc"


def extract_subgraph(
    model: onnx.ModelProto, input_names: list[str] | None, output_names: list[str] | None
) -> onnx.ModelProto:
    """The part of `model` computing `output_names` from `input_names` (InputError, exit 2,
    for an unknown or unused name)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    produced = {o for node in graph.node for o in node.output if o}
    typed = {v.name for v in [*graph.value_info, *graph.input, *graph.output]}
    for flag, names in ((INPUTS_FLAG, input_names), (OUTPUTS_FLAG, output_names)):
        unknown = [n for n in names or [] if n not in produced and n not in graph_inputs]
        if unknown:
            raise InputError(
                f"{flag} names tensor(s) {[printable(n) for n in unknown]} that the prepared "
                "model does not compute (a misspelling, a constant folded away, or a value "
                f"inside a fused pattern); its inputs are {graph_inputs} and its node outputs "
                f"include {sorted(produced)[:10]}."
            )
        untyped = [n for n in names or [] if n not in typed]
        if untyped:
            raise InputError(f"{flag}: the shapes of {untyped} cannot be inferred; fix the "
                             "model's input shapes with -ois or -b.")
    inputs = list(input_names or graph_inputs)
    outputs = list(output_names or [o.name for o in graph.output])
    part = Extractor(model).extract_model(inputs, outputs)
    read = {i for node in part.graph.node for i in node.input if i} | set(outputs)
    unread = [n for n in input_names or [] if n not in read]
    if unread:
        raise InputError(f"{INPUTS_FLAG} names {unread}, which the outputs {outputs} do not "
                         "depend on.")
    # the walk back from the outputs stops at the named inputs or reaches graph inputs,
    # which stay inputs of the part
    kept = [n for n in inputs if n in read]
    extra = [n for n in graph_inputs if n in read and n not in kept]
    if extra:
        log.info("the part also reads the model input(s) %s, which stay inputs", extra)
    if kept + extra != inputs:
        part = Extractor(model).extract_model(kept + extra, outputs)
    return part
