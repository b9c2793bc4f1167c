"""The Python entry point: `convert(...)`, with keyword names equal to the CLI's long flags."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import onnx

from onnx2tf_alt import perms as P
from onnx2tf_alt.errors import ConversionError, InputError
from onnx2tf_alt.graph import Graph, graph_from_model
from onnx2tf_alt.interrupts import checkpoint
from onnx2tf_alt.layout import Plan, plan_layouts
from onnx2tf_alt.loader import load_model
from onnx2tf_alt.options import DEFAULT_OPTIONS, ConversionOptions, pseudo_operators
from onnx2tf_alt.prepare import prepare_model
from onnx2tf_alt.progress import Progress
from onnx2tf_alt.validate import check_consistency, check_inference

log = logging.getLogger("onnx2tf_alt")


@dataclass
class Converted:
    """Everything a conversion produced in memory."""

    result: object  # BuildResult
    graph: Graph
    plan: Plan
    model: onnx.ModelProto
    options: ConversionOptions = DEFAULT_OPTIONS
    _tflite_result: object = None

    def rebuild(self, model: onnx.ModelProto) -> Converted:
        """Build `model` (a rewrite of this one) with exactly this conversion's input layouts."""
        keep, force = [], []
        for name, perm in self.result.input_perms.items():
            if len(perm) >= 3:
                (keep if P.is_identity(perm) else force).append(name)
        return build(onnx_graph=model, keep_ncw_or_nchw_or_ncdhw_input_names=keep,
                     keep_nwc_or_nhwc_or_ndhwc_input_names=force, options=self.options)

    def tflite_result(self):
        """The BuildResult the .tflite files are converted from: `result` itself, or for a
        model with float64 or float16 tensors a rebuild computing in float32 (see
        float32_compute.py)."""
        from onnx2tf_alt.float32_compute import compute_in_float32, needs_float32_compute

        if self._tflite_result is None:
            self._tflite_result = self.result
            if needs_float32_compute(self.model):
                log.info("TFLite has few float64/float16 kernels: .tflite files compute in float32")
                self._tflite_result = self.rebuild(compute_in_float32(self.model)).result
        return self._tflite_result


def unsupported_nodes(graph: Graph) -> list:
    from onnx2tf_alt.builder import failure_for
    from onnx2tf_alt.registry import find_handler

    return [
        failure_for(node, graph, "unsupported op: no handler for this op type and opset")
        for node in graph.nodes
        if find_handler(node.op_type, node.domain, graph.opset_of(node.domain)) is None
    ]


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
    are the lowering choices the handlers read (onnx2tf_alt/options.py)."""
    model = load_model(input_onnx_file_path, onnx_graph, allow_newer_opset)
    return build_loaded(
        model, batch_size, overwrite_input_shape, keep_ncw_or_nchw_or_ncdhw_input_names,
        keep_nwc_or_nhwc_or_ndhwc_input_names, show_progress,
        input_names_to_interrupt_model_conversion, output_names_to_interrupt_model_conversion,
        options,
    )


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and batch_size < 1:
        raise InputError(f"-b/--batch_size must be at least 1 (got {batch_size}).")


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
    converted (subgraph.py)."""
    from onnx2tf_alt.builder import ModelBuilder
    from onnx2tf_alt.registry import find_handler
    from onnx2tf_alt.subgraph import extract_subgraph

    _check_batch_size(batch_size)
    options = options or DEFAULT_OPTIONS
    check_inference(model)
    model = prepare_model(model, batch_size, overwrite_input_shape)
    if input_names_to_interrupt_model_conversion or output_names_to_interrupt_model_conversion:
        model = extract_subgraph(model, input_names_to_interrupt_model_conversion,
                                 output_names_to_interrupt_model_conversion)
    graph = graph_from_model(model)
    check_consistency(graph)
    for flag, names in (
        ("-k", keep_ncw_or_nchw_or_ncdhw_input_names),
        ("-kt", keep_nwc_or_nhwc_or_ndhwc_input_names),
    ):
        unknown = sorted(set(names or []) - set(graph.inputs))
        if unknown:
            raise InputError(
                f"{flag} names input(s) {unknown} that the model does not have; its inputs are "
                f"{graph.inputs}."
            )
    missing = unsupported_nodes(graph)
    if missing:
        error = ConversionError(missing, headline=f"{len(missing)} node(s) have unsupported ops:")
        error.prepared_model = model  # replayed by the failure reports (check/repro.py)
        raise error

    def policy_of(node):
        return find_handler(node.op_type, node.domain, graph.opset_of(node.domain)).layout

    plan = plan_layouts(
        graph,
        policy_of,
        keep_channel_first=frozenset(keep_ncw_or_nchw_or_ncdhw_input_names or []),
        force_channel_last=frozenset(keep_nwc_or_nhwc_or_ndhwc_input_names or []),
    )
    progress = Progress(len(graph.nodes), enabled=show_progress)
    try:
        result = ModelBuilder(graph, plan, progress, options).build()
    except ConversionError as error:
        error.prepared_model = model
        raise
    return Converted(result=result, graph=graph, plan=plan, model=model, options=options)


def _stem(input_onnx_file_path: str | None) -> str:
    if not input_onnx_file_path:
        return "model"
    return os.path.splitext(os.path.basename(os.fspath(input_onnx_file_path)))[0]


def write_outputs(
    converted: Converted,
    folder: str,
    stem: str,
    output_h5: bool,
    output_keras_v3: bool,
    output_tflite: bool = True,
    onnx_names_in_tflite: bool = False,
    builtin_only: bool = False,
) -> list[str]:
    """Write every requested format into `folder` (expected to be empty). Returns file names.
    `onnx_names_in_tflite` is what <stem>_io_layout.json records of the .tflite names (the
    caller renames the files, -coion); `builtin_only`: see check_builtin_only."""
    from onnx2tf_alt.export.delegates import write_delegate_report
    from onnx2tf_alt.export.io_layout import save_io_layout
    from onnx2tf_alt.export.keras_files import save_h5, save_keras_v3
    from onnx2tf_alt.export.saved_model import save_saved_model
    from onnx2tf_alt.export.tflite import check_builtin_only, tflite_bytes

    result = converted.result
    save_saved_model(result, folder)
    written = ["saved_model.pb", "variables"]
    if output_tflite:
        for suffix, float16 in (("float32", False), ("float16", True)):
            checkpoint()
            name = f"{stem}_{suffix}.tflite"
            content = tflite_bytes(converted.tflite_result(), float16=float16)
            check_builtin_only(content, name, converted, builtin_only)
            with open(os.path.join(folder, name), "wb") as f:
                f.write(content)
            written.append(name)
        written.append(write_delegate_report(converted, folder, stem))
    checkpoint()
    if output_h5:
        save_h5(result, os.path.join(folder, f"{stem}.h5"))
        written.append(f"{stem}.h5")
    if output_keras_v3:
        save_keras_v3(result, os.path.join(folder, f"{stem}.keras"))
        written.append(f"{stem}.keras")
    save_io_layout(result, converted.graph, os.path.join(folder, f"{stem}_io_layout.json"),
                   onnx_names_in_tflite)
    written.append(f"{stem}_io_layout.json")
    return written


def _float32_tflite(converted: Converted, folder: str, stem: str) -> bytes:
    """The float32 .tflite written into `folder`, or a fresh conversion when none was."""
    from onnx2tf_alt.export.tflite import tflite_bytes

    path = os.path.join(folder, f"{stem}_float32.tflite")
    if not os.path.isfile(path):
        return tflite_bytes(converted.tflite_result())
    with open(path, "rb") as f:
        return f.read()


def convert(
    input_onnx_file_path: str | None = None,
    onnx_graph: onnx.ModelProto | None = None,
    output_folder_path: str = "saved_model",
    output_signaturedefs: bool = False,
    output_h5: bool = False,
    output_keras_v3: bool = False,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
    keep_ncw_or_nchw_or_ncdhw_input_names: list[str] | None = None,
    keep_nwc_or_nhwc_or_ndhwc_input_names: list[str] | None = None,
    verbosity: str = "info",
    non_verbose: bool = False,
    output_tflite: bool = True,
    check_onnx_tf_outputs_elementwise_close: bool = False,
    check_onnx_tf_outputs_elementwise_close_full: bool = False,
    check_onnx_tf_outputs_elementwise_close_atol: float = 1e-4,
    check_onnx_tf_outputs_elementwise_close_rtol: float = 0.0,
    custom_input_op_name_np_data_path: list[list[str]] | None = None,
    output_dynamic_range_quantized_tflite: bool = False,
    output_integer_quantized_tflite: bool = False,
    quant_type: str = "per-channel",
    input_quant_dtype: str = "int8",
    output_quant_dtype: str = "int8",
    quant_norm_mean: list[float] | None = None,
    quant_norm_std: list[float] | None = None,
    allow_newer_opset: bool = False,
    calibration_method: str = "tf",
    keep_float: list[str] | None = None,
    keep_float_auto: float | None = None,
    copy_onnx_input_output_names_to_tflite: bool = False,
    input_names_to_interrupt_model_conversion: list[str] | None = None,
    output_names_to_interrupt_model_conversion: list[str] | None = None,
    builtin_only: bool = False,
    disable_group_convolution: bool = False,
    replace_to_pseudo_operators: list[str] | None = None,
    command_line: list[str] | None = None,
):
    """Convert an ONNX model (path or ModelProto) and write its outputs; returns the Keras model.

    Outputs are staged beside `output_folder_path` and published in one step that replaces
    exactly the previous conversion's files (export/publish.py, export/manifest.py); a file
    the converter did not write, or the input itself, is never touched (InputError before
    converting). A failed run publishes only `reports/`: when nodes cannot be converted, it
    holds a one-node repro model and the input values of each (see
    onnx2tf_alt/check/repro.py), and the error names it. `command_line` is recorded in the
    manifest (the CLI passes its argv; Python calls record their keyword arguments).
    `allow_newer_opset` converts an opset newer than the installed onnx knows.
    `calibration_method` ("tf", "minmax", "percentile", "entropy") picks where the INT8
    files' activation ranges come from (export/calibrate.py). `keep_float` (ONNX node
    names) and `keep_float_auto` (a target cosine) leave nodes of the INT8 files in float
    (export/sensitivity.py).
    `output_signaturedefs` is accepted for onnx2tf compatibility: the saved_model and the
    .tflite files always carry a `serving_default` signature.

    `check_onnx_tf_outputs_elementwise_close[_full]` compare the model outputs [every node
    output] of the Keras model and the float32 TFLite with onnxruntime (pass: |tf - onnx| <=
    atol + rtol * |onnx|), print a table and write `<stem>_accuracy_report.json` / `.html`;
    the returned model then carries the `AccuracyReport` (onnx2tf_alt.check.compare) as
    `model.onnx2tf_alt_report` (None when no check ran). `custom_input_op_name_np_data_path`
    ([[name, file.npy], ...], ONNX layout) gives test inputs for the check and the failure
    reports; other inputs are seeded random values.

    `output_dynamic_range_quantized_tflite` / `output_integer_quantized_tflite` also write
    quantized .tflite files and `<stem>_quant_report.json` (see export/quantize.py):
    calibration uses the shipped photographs for image inputs (normalized with
    `quant_norm_mean` / `quant_norm_std`) and -cind entries `[name, file.npy(, mean,
    std)]` (N samples along axis 0) for the others; a float model input with neither fails
    with an InputError before anything is written. QDQ models need no calibration data.
    `output_integer_quantized_tflite` writes the dynamic range file too, as onnx2tf does.

    `copy_onnx_input_output_names_to_tflite` (-coion) gives every written .tflite's input and
    output tensors and signature keys the ONNX names (export/tflite_names.py; the check and
    the quantization report run before the renaming, which changes names only).
    `input_names_to_interrupt_model_conversion` / `output_names_to_interrupt_model_conversion`
    (-inimc / -onimc) convert only the part of the graph between those tensors.
    `builtin_only` makes a model that needs Select TF ops (the Flex delegate) a
    ConversionError naming the ONNX nodes responsible; otherwise a warning names them.
    `disable_group_convolution` (-dgc) splits grouped convolutions into one per group;
    `replace_to_pseudo_operators` (-rtpo, onnx2tf's op names) picks ops lowered to the
    simplest builtins GPU/NNAPI delegates take (onnx2tf_alt/options.py).
    """
    call = {k: v for k, v in locals().items() if k not in ("onnx_graph", "command_line")}
    del output_signaturedefs  # always on
    from calibration.samples import first_sample, parse_custom_data
    from onnx2tf_alt.check.inputs import load_custom_inputs
    from onnx2tf_alt.export.manifest import Manifest
    from onnx2tf_alt.export.names import planned_outputs
    from onnx2tf_alt.export.publish import OutputFolder
    from onnx2tf_alt.loader import external_data_paths
    from onnx2tf_alt.logs import configure_logging

    configure_logging("error" if non_verbose else verbosity)
    _check_batch_size(batch_size)
    options = ConversionOptions(disable_group_convolution,
                                pseudo_operators(replace_to_pseudo_operators))
    stem = _stem(input_onnx_file_path)
    sources = []
    if onnx_graph is None and input_onnx_file_path is not None:
        sources = [os.path.abspath(input_onnx_file_path),
                   *external_data_paths(input_onnx_file_path)]
    check = check_onnx_tf_outputs_elementwise_close or check_onnx_tf_outputs_elementwise_close_full
    # -oiqt also writes the dynamic range file, as onnx2tf does: the plan of file names and
    # the writer both take it from here
    dynamic_range = output_dynamic_range_quantized_tflite or output_integer_quantized_tflite
    folder = OutputFolder(output_folder_path, protected=sources)
    folder.check_usable()
    folder.check_claims(planned_outputs(
        stem, output_h5, output_keras_v3, output_tflite, dynamic_range,
        output_integer_quantized_tflite, check,
    ))
    command = list(command_line) if command_line is not None else ["onnx2tf_alt.convert", call]
    custom_data = parse_custom_data(custom_input_op_name_np_data_path)
    custom_inputs = load_custom_inputs([e[:2] for e in custom_input_op_name_np_data_path or []])

    from onnx2tf_alt.export.quantize import QuantOptions, plan_quantization, write_quantized

    quant_options = QuantOptions(
        dynamic_range, output_integer_quantized_tflite, quant_type,
        input_quant_dtype, output_quant_dtype, calibration_method, list(keep_float or []),
        keep_float_auto, check_onnx_tf_outputs_elementwise_close_full,
    )
    try:
        converted = build_loaded(
            load_model(input_onnx_file_path, onnx_graph, allow_newer_opset),
            batch_size=batch_size,
            overwrite_input_shape=overwrite_input_shape,
            keep_ncw_or_nchw_or_ncdhw_input_names=keep_ncw_or_nchw_or_ncdhw_input_names,
            keep_nwc_or_nhwc_or_ndhwc_input_names=keep_nwc_or_nhwc_or_ndhwc_input_names,
            show_progress=not non_verbose,
            input_names_to_interrupt_model_conversion=input_names_to_interrupt_model_conversion,
            output_names_to_interrupt_model_conversion=output_names_to_interrupt_model_conversion,
            options=options,
        )
    except ConversionError as error:
        from onnx2tf_alt.check.repro import report_failures

        report_failures(error, folder, Manifest.for_failure_report(sources, command),
                        custom_inputs)
        raise
    custom_inputs = first_sample(custom_inputs, converted.graph)
    quant_plan = None
    if quant_options.any:
        quant_plan = plan_quantization(
            converted, quant_options, custom_data, quant_norm_mean, quant_norm_std
        )
    model = converted.result.model
    model.onnx2tf_alt_report = None
    with folder.staging() as stage:
        written = write_outputs(converted, stage, stem, output_h5, output_keras_v3, output_tflite,
                                copy_onnx_input_output_names_to_tflite, builtin_only)
        if quant_plan is not None:
            quantized = write_quantized(
                converted, stage, stem, quant_plan, _float32_tflite(converted, stage, stem),
                print_table=not non_verbose,
            )
            written += quantized
            from onnx2tf_alt.export.tflite import check_builtin_only_files

            check_builtin_only_files([os.path.join(stage, n) for n in quantized
                                      if n.endswith(".tflite")], converted, builtin_only)
        if check:
            from onnx2tf_alt.check.run import check_and_report

            model.onnx2tf_alt_report = check_and_report(
                converted, stage, stem,
                full=check_onnx_tf_outputs_elementwise_close_full,
                atol=check_onnx_tf_outputs_elementwise_close_atol,
                rtol=check_onnx_tf_outputs_elementwise_close_rtol,
                custom_inputs=custom_inputs,
                tflite_path=os.path.join(stage, f"{stem}_float32.tflite")
                if output_tflite else None,
                print_table=not non_verbose,
                quant_plan=quant_plan,
            )
        if copy_onnx_input_output_names_to_tflite:
            from onnx2tf_alt.export.tflite_names import copy_onnx_names_in_files

            copy_onnx_names_in_files([os.path.join(stage, n) for n in written
                                      if n.endswith(".tflite")], converted.result,
                                     converted.graph)
        folder.publish(stage, Manifest.for_conversion(stem, sources, command))
    log.info("wrote %s to %s", ", ".join(written), folder.path)
    return model
