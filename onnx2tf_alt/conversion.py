"""What `onnx2tf_alt.convert` and the CLI run: check the output folder, build the model
(pipeline.py), write every requested file into a staging folder, quantize, check, and
publish the folder in one step (export/publish.py). On a conversion error only the failure
reports are published (check/repro.py).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace

import numpy as np
import onnx

from calibration.samples import parse_custom_data
from onnx2tf_alt import progress, startup
from onnx2tf_alt.check.inputs import first_sample, load_custom_inputs
from onnx2tf_alt.check.repro import write_failure_reports
from onnx2tf_alt.errors import ConversionError, InputError
from onnx2tf_alt.export.manifest import Manifest, reports_folder
from onnx2tf_alt.export.names import planned_outputs
from onnx2tf_alt.export.publish import OutputFolder
from onnx2tf_alt.interrupts import checkpoint
from onnx2tf_alt.ir import weights as ir_weights
from onnx2tf_alt.ir.loader import external_data_paths, load_model
from onnx2tf_alt.logs import configure_logging, phase, quiet_native_calls
from onnx2tf_alt.pipeline import (
    Converted,
    Planned,
    check_batch_size,
    check_input_names,
    direct_conversion,
    float32_planned,
    plan_loaded,
    stem_of,
    translate,
)
from onnx2tf_alt.translate.failures import failure_for
from onnx2tf_alt.translate.options import ConversionOptions, pseudo_operators
from onnx2tf_alt.translate.recursion import deep_graphs

log = logging.getLogger("onnx2tf_alt")

# -rtpo lowerings --target micro always takes: ops whose usual TFLite form has no TFLite
# Micro kernel while this one runs there (measured, docs/micro.md)
MICRO_FORMS = ("GeLU", "Pow")


@dataclass(frozen=True)
class CheckRequest:
    """-coto / -cotof: every value (`full`) or the outputs, the tolerances, the inputs."""

    full: bool
    atol: float
    rtol: float
    custom_inputs: dict


# Modules that import TensorFlow are imported where they are used, after the cheap checks of
# the input and the output folder: an unusable -o fails in a fraction of a second.


@quiet_native_calls
@deep_graphs()
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
    disable_model_save: bool = False,
    output_saved_model: bool = False,
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
    calibration_method: str = "auto",
    keep_float: list[str] | None = None,
    keep_float_auto: float | None = None,
    bias_correction: bool = True,
    int8_warn_below: float = 0.99,
    copy_onnx_input_output_names_to_tflite: bool = False,
    input_names_to_interrupt_model_conversion: list[str] | None = None,
    output_names_to_interrupt_model_conversion: list[str] | None = None,
    builtin_only: bool = False,
    disable_group_convolution: bool = False,
    replace_to_pseudo_operators: list[str] | None = None,
    target: str | None = None,
    signatures: list[list[str]] | None = None,
    kv_cache_capacity: int | None = None,
    output_int4_weight_quantized_tflite: bool = False,
    tflite_writer: str = "auto",
    litertlm: bool = False,
    tokenizer: str | None = None,
    litertlm_prefill: list[int] | None = None,
    command_line: list[str] | None = None,
):
    """Convert an ONNX model (path or ModelProto) and write its outputs; returns the Keras model
    (None where no Keras model was built).

    What is written by default is what onnx2tf 2.x writes: `<stem>_float32.tflite` and
    `<stem>_float16.tflite`. `output_saved_model` (-osm, onnx2tf 2.x's -fdosm) adds the
    saved_model, `output_h5` / `output_keras_v3` the Keras files; these need TensorFlow (the
    `[tf]` extra). `disable_model_save` (-dms) is accepted for onnx2tf 1.x's scripts: no
    saved_model is the default.

    Outputs are staged beside `output_folder_path` and published in one step that replaces
    exactly the previous conversion's files (export/publish.py, export/manifest.py); a file
    the converter did not write, or the input itself, is never touched (InputError before
    converting). A failed run publishes only `reports/`: when nodes cannot be converted, it
    holds a one-node repro model and the input values of each (see
    onnx2tf_alt/check/repro.py), and the error names it. `command_line` is recorded in the
    manifest (the CLI passes its argv; Python calls record their keyword arguments).
    `allow_newer_opset` converts an opset newer than the installed onnx knows.
    `calibration_method` picks the INT8 files' activation ranges: "percentile", "mse",
    "minmax" (or its older name "tf") measured on the TFLite graph (calibration/ranges.py), "auto"
    (default) the one of those three whose INT8 file is closest to the float one on the
    calibration samples; "entropy", "ort_minmax", "ort_percentile" by onnxruntime's
    calibrators on the ONNX graph (calibration/ort.py).
    `keep_float` (ONNX node names) and `keep_float_auto` (a target cosine) leave nodes of
    the INT8 files in float (quant/sensitivity.py); `bias_correction` takes the mean output
    error of their convolutions out of the biases (quant/bias_correction.py); each choice
    is kept only when it beats the simpler file beyond noise on samples it did not use.
    `int8_warn_below`: an INT8 file whose held-out pooled cosine is below it is named in a
    warning at the end, with the quantized file beside it that holds best.
    `output_signaturedefs` is accepted for onnx2tf compatibility: the saved_model and the
    .tflite files always carry a `serving_default` signature.

    `check_onnx_tf_outputs_elementwise_close[_full]` compare the model outputs [every node
    output] of the .tflite files (and of the Keras model, where one is built) with
    onnxruntime (pass: |tf - onnx| <= atol + rtol * |onnx|), print a table and write
    `<stem>_accuracy_report.json` / `.html`; a returned Keras model carries the
    `AccuracyReport` (onnx2tf_alt.check.compare) as `model.onnx2tf_alt_report` (None when no
    check ran). Without a Keras model the check needs no TensorFlow and None is returned.
    `custom_input_op_name_np_data_path` ([[name, file.npy], ...], ONNX layout) gives test
    inputs for the check and the failure reports; other inputs are seeded random values.

    `output_dynamic_range_quantized_tflite` / `output_integer_quantized_tflite` also write
    quantized .tflite files and `<stem>_quant_report.json` (see quant/quantize.py):
    calibration uses the shipped photographs for image inputs (normalized with
    `quant_norm_mean` / `quant_norm_std`) and -cind entries `[name, file.npy(, mean,
    std)]` (N samples along axis 0) for the others; a float model input with neither fails
    with an InputError before anything is written. QDQ models need no calibration data.
    `output_integer_quantized_tflite` writes the dynamic range file too, as onnx2tf does.

    `copy_onnx_input_output_names_to_tflite` (-coion) gives every written .tflite's input and
    output tensors and signature keys the ONNX names (tflite/names.py; the check and
    the quantization report run before the renaming, which changes names only).
    `input_names_to_interrupt_model_conversion` / `output_names_to_interrupt_model_conversion`
    (-inimc / -onimc) convert only the part of the graph between those tensors.
    `builtin_only` makes a model that needs Select TF ops (the Flex delegate) a
    ConversionError naming the ONNX nodes responsible; otherwise a warning names them.
    `disable_group_convolution` (-dgc) splits grouped convolutions into one per group;
    `replace_to_pseudo_operators` (-rtpo, onnx2tf's op names) picks ops lowered to the
    simplest builtins GPU/NNAPI delegates take (onnx2tf_alt/translate/options.py).

    `target="micro"` implies `output_integer_quantized_tflite`, `batch_size=1` (unless
    given) and the -rtpo forms of Gelu and Pow (MICRO_FORMS: TFLite Micro has no GELU or
    POW kernel; their MUL/ADD forms run there), and checks
    `<stem>_full_integer_quant.tflite` on TensorFlow Lite for Microcontrollers (the
    tflite-micro package): a file it cannot run is a ConversionError naming the ONNX nodes
    and nothing is published; otherwise `<stem>_micro.json` gives its smallest tensor arena,
    flash size, largest tensors, ops and outputs against ai-edge-litert
    (export/micro.py, docs/micro.md).

    `tflite_writer` (--tflite_writer) picks what writes the float32 and float16 .tflite:
    "tf" TF's converter from the Keras model; "auto" (the default, as on the CLI) the
    direct writer (tflite/direct.py) when it covers every node, else TF's
    converter, said at info level; "direct" the direct writer or a ConversionError naming
    the first node it does not cover. With only .tflite files asked for
    (the default: no saved_model or Keras files) the direct writer needs no TensorFlow and
    no Keras model (None is returned): the float32 and float16 files, the dynamic-range,
    int4, INT8 and INT16 ones made from them (a QDQ model's INT8 files on its own grids, and
    onnxruntime's calibration methods' ranges as grids: quant/qdq_grids.py), micro ones,
    --signature and --litertlm files, and the check of them; with a saved_model or Keras
    files beside them, "auto" writes the .tflite files directly from the plan the Keras model
    was built from (not --signature ones), and the quantized, int4 and micro files and the
    check's TFLite values from that graph as without them; "direct" takes only the first
    case.

    `signatures` ([[name, ('model.onnx',) 'input:D1,D2', ...], ...], --signature) writes
    .tflite files with one signature per entry, built for those input shapes (from that
    model, default the -i one) and sharing one copy of the weights, and (with
    `output_saved_model`) a saved_model with the same signatures
    (generative/signatures.py). `kv_cache_capacity` (--kv_cache_capacity) gives a decoder's
    past key/value inputs that many positions and makes its present outputs the step's new
    entries (passes/kv_cache.py, docs/generative.md).
    `output_int4_weight_quantized_tflite` (-oi4) also writes `<stem>_int4_weight_quant.tflite`:
    int4 FULLY_CONNECTED weights in blocks of 32 inputs, int8 others (quant/int4.py).

    `litertlm` (--litertlm, with `kv_cache_capacity` and `tokenizer`: a tokenizer.json,
    tokenizer.model or the model's folder) writes the decoder in LiteRT-LM's conventions
    (signatures `prefill_<T>` for each of `litertlm_prefill`, default 32, and `decode`) and
    bundles each .tflite written (float32, -odrqt, -oi4) with the tokenizer and its start and
    stop tokens into `<stem>_<variant>.litertlm`, which `litert_lm.Engine` runs
    (generative/litertlm.py, docs/generative.md).
    """
    call = {k: v for k, v in locals().items() if k not in ("onnx_graph", "command_line")}
    del output_signaturedefs  # always on
    configure_logging("error" if non_verbose else verbosity)
    check_batch_size(batch_size)
    signature_specs = _signature_specs(signatures, locals())
    found_tokenizer = None
    if litertlm:
        from onnx2tf_alt.generative import litertlm as litert_lm

        found_tokenizer, signature_specs = _litertlm_specs(locals())
    micro = _check_target(target)
    if micro:  # the forms TFLite Micro has kernels for (docs/micro.md), measured there
        replace_to_pseudo_operators = [*(replace_to_pseudo_operators or []), *MICRO_FORMS]
    options = ConversionOptions(disable_group_convolution,
                                pseudo_operators(replace_to_pseudo_operators))
    stem = stem_of(input_onnx_file_path)
    sources = []
    if onnx_graph is None and input_onnx_file_path is not None:
        sources = [os.path.abspath(input_onnx_file_path),
                   *external_data_paths(input_onnx_file_path)]
    check = check_onnx_tf_outputs_elementwise_close or check_onnx_tf_outputs_elementwise_close_full
    saved_model = _saved_model_asked(output_saved_model, disable_model_save, (
        output_tflite, output_h5, output_keras_v3, check))
    _require_tensorflow(tflite_writer, {"-osm (the saved_model)": saved_model, "-oh5": output_h5,
                                        "-okv3": output_keras_v3})
    output_integer_quantized_tflite = output_integer_quantized_tflite or micro
    if micro and batch_size is None:  # a microcontroller runs one sample at a time
        batch_size = 1
    # -oiqt also writes the dynamic range file, as onnx2tf does: the plan of file names and
    # the writer both take it from here
    dynamic_range = output_dynamic_range_quantized_tflite or output_integer_quantized_tflite
    if signature_specs:
        from onnx2tf_alt.generative.signatures import sources_of

        sources += sources_of(signature_specs)
    folder = OutputFolder(output_folder_path, stem, protected=sources)
    folder.check_usable()
    int4 = output_int4_weight_quantized_tflite
    if int4 and not output_tflite:
        raise InputError("-oi4 makes its file from the float32 .tflite: it needs output_tflite.")
    folder.check_claims(planned_outputs(
        stem, output_h5, output_keras_v3, output_tflite, dynamic_range,
        output_integer_quantized_tflite, check, micro, int4, saved_model=saved_model,
        litertlm=litertlm,
    ))
    command = list(command_line) if command_line is not None else ["onnx2tf_alt.convert", call]
    custom_data = parse_custom_data(custom_input_op_name_np_data_path)
    custom_inputs = load_custom_inputs([e[:2] for e in custom_input_op_name_np_data_path or []])
    # what the direct writer makes without TF: the float32 file and those made from it
    # (float16, -oi4, -odrqt, -oiqt, --target micro)
    direct = _direct_asked(tflite_writer, output_tflite and not any((
        saved_model, output_h5, output_keras_v3)))
    checked = CheckRequest(check_onnx_tf_outputs_elementwise_close_full,
                           check_onnx_tf_outputs_elementwise_close_atol,
                           check_onnx_tf_outputs_elementwise_close_rtol,
                           custom_inputs) if check else None
    spilled_before = set(ir_weights.SPILLED)
    progress.enable(not non_verbose)
    try:
        try:
            with phase("load"):
                loaded = load_model(input_onnx_file_path, onnx_graph, allow_newer_opset)
            # what the ONNX alone can refuse, before TensorFlow loads (2 s)
            if not signature_specs:
                check_input_names(loaded, overwrite_input_shape, None if (
                    input_names_to_interrupt_model_conversion) else {
                    "-k": keep_ncw_or_nchw_or_ncdhw_input_names,
                    "-kt": keep_nwc_or_nhwc_or_ndhwc_input_names})
            from calibration.samples import check_against_inputs

            check_against_inputs(custom_data, loaded, batch_size, overwrite_input_shape)
            if kv_cache_capacity is not None and not signature_specs:
                from onnx2tf_alt.passes.kv_cache import fixed_capacity

                loaded, _ = fixed_capacity(loaded, kv_cache_capacity)
            planned = None
            if not signature_specs:  # an invalid model or an unsupported op: refused here
                planned = plan_loaded(
                    loaded, batch_size, overwrite_input_shape,
                    keep_ncw_or_nchw_or_ncdhw_input_names, keep_nwc_or_nhwc_or_ndhwc_input_names,
                    input_names_to_interrupt_model_conversion,
                    output_names_to_interrupt_model_conversion, options)
            from onnx2tf_alt.quant.options import QuantOptions

            quant_options = QuantOptions(
                    dynamic_range, output_integer_quantized_tflite, quant_type,
                    input_quant_dtype, output_quant_dtype, calibration_method,
                list(keep_float or []), keep_float_auto,
                check_onnx_tf_outputs_elementwise_close_full, bias_correction,
                int8_warn_below, integer_kernels_only=micro,
            )
            if planned is not None and quant_options.integer:
                _calibration_data_given(planned, custom_data)
            if not direct:  # the Keras build's: loaded while collection is still off
                import tensorflow  # noqa: F401
            startup.resume()  # modules loaded: collection back on (onnx2tf_alt/startup.py)
            if signature_specs:
                from onnx2tf_alt.generative.signatures import build_signatures

                keep_first, keep_last, batch = (keep_ncw_or_nchw_or_ncdhw_input_names,
                                                keep_nwc_or_nhwc_or_ndhwc_input_names,
                                                batch_size)
                if litertlm:  # the decoder in LiteRT-LM's conventions, its caches in it
                    from onnx2tf_alt.passes.kv_cache import fixed_capacity

                    loaded = litert_lm.litert_lm_model(
                        *fixed_capacity(loaded, kv_cache_capacity), kv_cache_capacity)
                    # every input as LiteRT-LM lays it out, at the batch of 1 it declares
                    keep_first, keep_last, batch = [i.name for i in loaded.graph.input], None, None

                def build(model, shapes):
                    planned = plan_loaded(model, batch, shapes, keep_first, keep_last,
                                          options=options)
                    return planned if direct else translate(planned, not non_verbose)

                built = build_signatures(
                    loaded, signature_specs, overwrite_input_shape,
                    None if litertlm else kv_cache_capacity,
                    lambda path: load_model(path, None, allow_newer_opset), build,
                    keras=not direct)
                if direct:
                    built = _signatures_written(built, tflite_writer, not non_verbose)
                elif tflite_writer == "auto" and output_tflite:
                    built = _signatures_beside_keras(built)
            else:
                if direct:
                    def beside(converted, stage):  # what the float32 file makes
                        return _made_from_direct(
                            converted, stage, stem, int4, quant_options, custom_data,
                            quant_norm_mean, quant_norm_std, not non_verbose,
                            micro, copy_onnx_input_output_names_to_tflite, checked)

                    written = _write_direct(planned, folder, stem, tflite_writer, sources,
                                            command, copy_onnx_input_output_names_to_tflite,
                                            beside)
                    if written is not None:
                        return None
                converted = translate(planned, show_progress=not non_verbose)
        except ConversionError as error:
            report_failures(error, folder,
                            Manifest.for_failure_report(stem, sources, command), custom_inputs)
            raise
        if signature_specs:
            from onnx2tf_alt.generative.signatures import write_signature_files

            with folder.staging() as stage:
                written = write_signature_files(built, stage, stem, dynamic_range, int4,
                                                saved_model=saved_model)
                if litertlm:
                    with phase("litertlm"):
                        written += litert_lm.write_bundles(stage, stem, written,
                                                           found_tokenizer, kv_cache_capacity)
                folder.publish(stage, Manifest.for_conversion(stem, sources, command))
            from onnx2tf_alt.export.summary import log_written

            log_written(folder.path, stem, written)
            return next(iter(built.values()))[0].result.model
        if micro:
            from onnx2tf_alt.export.micro import check_micro_shapes

            check_micro_shapes(converted.graph, f"{stem}_full_integer_quant.tflite")
        quant_plan = None
        # the .tflite files beside the saved_model / Keras files: the direct writer's where
        # it covers the model (not tried again after a -dms attempt); the quantized, int4
        # and micro files are made from it as with -dms (the same files, no TF converter or
        # calibrator), and -coto / -cotof read their values out of those files
        beside = _direct_conversion(converted) if (
            output_tflite and tflite_writer == "auto" and not direct) else converted
        if quant_options.any:
            from onnx2tf_alt.quant.quantize import plan_quantization

            quant_plan = plan_quantization(
                beside, quant_options, custom_data, quant_norm_mean, quant_norm_std
            )
        model = converted.result.model
        model.onnx2tf_alt_report = None
        with folder.staging() as stage:
            written = write_outputs(converted, stage, stem, output_h5, output_keras_v3, output_tflite,
                                    copy_onnx_input_output_names_to_tflite, builtin_only,
                                    saved_model=saved_model,
                                    direct_result=None if beside is converted else beside.result)
            if int4:
                written.append(_write_int4(None if beside is not converted else {
                    "serving_default": converted.tflite_result()}, stage, stem))
            if quant_plan is not None:
                with phase("quantized files"):
                    written += _write_quantized(beside, stage, stem, quant_plan,
                                                builtin_only, print_table=not non_verbose)
            if micro:
                with phase("micro"):
                    written.append(_check_micro(beside, stage, stem, quant_plan,
                                                copy_onnx_input_output_names_to_tflite))
            if checked is not None:
                model.onnx2tf_alt_report = _checked(
                    converted, stage, stem, checked, output_tflite, not non_verbose,
                    quant_plan, beside)
            if copy_onnx_input_output_names_to_tflite:
                from onnx2tf_alt.tflite.names import copy_onnx_names_in_files

                copy_onnx_names_in_files([os.path.join(stage, n) for n in written
                                          if n.endswith(".tflite")], converted.result,
                                         converted.graph)
            folder.publish(stage, Manifest.for_conversion(stem, sources, command))
        from onnx2tf_alt.export.summary import log_written

        log_written(folder.path, stem, written)
        return model
    finally:  # the temporary weight files of this conversion (ir/weights.spill)
        progress.disable()
        for path in set(ir_weights.SPILLED) - spilled_before:
            ir_weights.remove_spilled_file(path)


TFLITE_WRITERS = ("tf", "auto", "direct")


def _saved_model_asked(output_saved_model: bool, disable_model_save: bool,
                       others: tuple[bool, ...]) -> bool:
    """Whether to write the saved_model: only when asked (-osm), as onnx2tf 2.x writes it
    only with -fdosm; InputError for -osm with -dms, or when nothing would be written
    (`others`: whether each other output is asked for)."""
    if output_saved_model and disable_model_save:
        raise InputError("-osm (output_saved_model) asks for the saved_model and -dms "
                         "(disable_model_save) for none: leave one of them out.")
    if not output_saved_model and not any(others):
        raise InputError("Nothing to write: output_tflite is off and no saved_model (-osm), "
                         ".h5 (-oh5), .keras (-okv3) or accuracy check (-coto) is asked for.")
    return output_saved_model


def _require_tensorflow(tflite_writer: str, keras_outputs: dict[str, bool]) -> None:
    """InputError where TensorFlow is not installed (onnx2tf_alt/version.py) and a flag
    needs it (`keras_outputs`: flag -> asked, or --tflite_writer tf)."""
    from onnx2tf_alt import version

    if version.installed():
        return
    asked = [flag for flag, on in keras_outputs.items() if on]
    if tflite_writer == "tf":
        asked.append("--tflite_writer tf")
    if asked:
        version.require(", ".join(asked))


def _direct_asked(tflite_writer: str, tflite_only: bool) -> bool:
    """Whether to try the direct writer; InputError for an unknown writer, or "direct"
    with outputs it does not write."""
    if tflite_writer not in TFLITE_WRITERS:
        raise InputError(f"--tflite_writer must be one of {list(TFLITE_WRITERS)}, "
                         f"got '{tflite_writer}'.")
    if tflite_writer == "direct" and not tflite_only:
        raise InputError(
            "--tflite_writer direct writes the float32, float16, -odrqt, -oiqt, -oi4 and "
            "--target micro .tflite files (--signature and --litertlm ones too), and checks "
            "them (-coto / -cotof): leave out -osm, -oh5 and -okv3 (or use --tflite_writer "
            "auto).")
    return tflite_writer != "tf" and tflite_only


def _signatures_written(built: dict, tflite_writer: str, show_progress: bool) -> dict:
    """build_signatures' planned signatures ({name: (Planned, cache)}) as Converted holding
    the direct writer's one file of them all (tflite/direct.py), or where it does not cover
    a node built with TF ("auto"; "direct": a ConversionError naming the node)."""
    from onnx2tf_alt.tflite.direct import STREAMED_BYTES, write_direct_signatures

    built = {name: (float32_planned(p), cache) for name, (p, cache) in built.items()}
    with phase("tflite float32 (direct)"):
        found = write_direct_signatures(
            {name: (p.graph, p.plan, p.options) for name, (p, _) in built.items()},
            STREAMED_BYTES)
    if isinstance(found, dict):
        return {name: (Converted(result=found[name], graph=p.graph, plan=p.plan, model=p.model,
                                 options=p.options, _tflite_result=found[name]), cache)
                for name, (p, cache) in built.items()}
    planned = next(p for p, _ in built.values() if found.node is None
                   or any(n is found.node for n in p.graph.nodes))
    _not_covered(found, planned, tflite_writer)
    return {name: (translate(p, show_progress), cache) for name, (p, cache) in built.items()}


def _signatures_beside_keras(built: dict) -> dict:
    """build_signatures' Keras-built signatures ({name: (Converted, cache)}) with the direct
    writer's one file of them all as their .tflite result (the saved_model stays the Keras
    models'), written from their plans computing in float32 (pipeline.float32_planned, as
    -dms writes them; past STREAMED_BYTES of weights as it is packed) where it covers every
    node; else as they are (TF's converter)."""
    from onnx2tf_alt.tflite.direct import STREAMED_BYTES, write_direct_signatures

    planned = {name: float32_planned(Planned(c.graph, c.plan, c.model, c.options))
               for name, (c, _) in built.items()}
    with phase("tflite float32 (direct)"):
        found = write_direct_signatures(
            {name: (p.graph, p.plan, p.options) for name, p in planned.items()},
            STREAMED_BYTES)
    if not isinstance(found, dict):
        log.info("direct TFLite writer: %s: converting with TF", found)
        return built
    return {name: (replace(c, _tflite_result=found[name]), cache)
            for name, (c, cache) in built.items()}


def _not_covered(reason, planned, tflite_writer: str) -> None:
    """A ConversionError naming the node the direct writer did not cover (`reason`, a
    NotCovered) with "direct", or where TensorFlow is not installed; with "auto" said at -v
    info (the caller converts with TF)."""
    from onnx2tf_alt import version

    if tflite_writer == "direct" or not version.installed():
        if tflite_writer == "direct":
            who, fix = ("--tflite_writer direct",
                        "use --tflite_writer auto (TF's converter) for this model")
        else:
            who, fix = ("the direct TFLite writer (TensorFlow is not installed)",
                        f"TF's converter takes this model: {version.INSTALL}")
        error = ConversionError(
            [failure_for(reason.node, planned.graph, str(reason))] if reason.node else [],
            headline=f"{who}: {reason}; {fix}.")
        error.prepared_model = planned.model  # replayed by the failure report
        raise error
    log.info("direct TFLite writer: %s: converting with TF", reason)


def _calibration_data_given(planned, custom_data) -> None:
    """-oiqt on a float model: every input that is not an image has -cind data, said before
    anything is converted (quant.quantize.plan_quantization says it again; a QDQ model
    brings its own ranges and needs none)."""
    from calibration.samples import require_calibration_data
    from onnx2tf_alt.passes.qdq_pairs import FUSED

    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear", FUSED)
               for n in planned.model.graph.node):
        require_calibration_data(planned.graph, custom_data or {})


def _write_direct(planned, folder: OutputFolder, stem: str, tflite_writer: str,
                  sources: list[str], command, onnx_names: bool, beside
                  ) -> list[str] | None:
    """The float32 and float16 .tflite, delegate report and io_layout of the direct writer
    (tflite/direct.py) and what `beside(converted, stage)` makes from them, published;
    None when it does not cover the model ("auto": the caller converts with TF; "direct": a
    ConversionError naming the node). Past STREAMED_BYTES of weights the file is written as
    it is packed."""
    from onnx2tf_alt.tflite.direct import STREAMED_BYTES
    from onnx2tf_alt.translate.io_layout import save_io_layout

    planned, converted = direct_conversion(planned, STREAMED_BYTES)
    if not isinstance(converted, Converted):
        _not_covered(converted, planned, tflite_writer)
        return None
    result = converted.result
    with folder.staging() as stage:
        written = [*_direct_tflite_files(converted, stage, stem), f"{stem}_io_layout.json"]
        save_io_layout(result, planned.graph, os.path.join(stage, written[-1]), onnx_names)
        written += beside(converted, stage)
        if onnx_names:
            from onnx2tf_alt.tflite.names import copy_onnx_names_in_files

            copy_onnx_names_in_files([os.path.join(stage, n) for n in written
                                      if n.endswith(".tflite")], result, planned.graph)
        folder.publish(stage, Manifest.for_conversion(stem, sources, command))
    from onnx2tf_alt.export.summary import log_written

    log_written(folder.path, stem, written, [
        "written by the direct TFLite writer; no saved_model, as onnx2tf 2.x (-osm adds one)"])
    return written


def _direct_tflite_files(converted: Converted, folder: str, stem: str) -> list[str]:
    """The float32 .tflite of `converted`'s DirectResult (its `result` too), its delegate
    report and the float16 file, in `folder`."""
    from onnx2tf_alt.export.delegates import write_delegate_report
    from onnx2tf_alt.export.direct_files import write_float16, write_float32

    names = [f"{stem}_float32.tflite", f"{stem}_float16.tflite"]
    with phase("tflite float32 (write)"):
        content, model = write_float32(converted.result, os.path.join(folder, names[0]))
    with phase("delegate report"):
        report = write_delegate_report(converted, folder, stem, model)
    with phase("tflite float16"):
        write_float16(converted.result, content, model, os.path.join(folder, names[1]))
    return [*names, report]


def _made_from_direct(converted: Converted, stage: str, stem: str, int4: bool, quant_options,
                      custom_data, mean, std, print_table: bool, micro: bool = False,
                      onnx_names: bool = False, checked: CheckRequest | None = None
                      ) -> list[str]:
    """The files made from the direct writer's float32 file in `stage`: -oi4's, -odrqt's
    and -oiqt's with their quant report (quant/quantize.py and the own quantizer need no TF
    for them), --target micro's check of the full-integer file, and -coto / -cotof's
    reports (`checked`: the files against onnxruntime, no Keras model)."""
    written, plan = [], None
    if int4:
        written.append(_write_int4(None, stage, stem))
    if micro:
        from onnx2tf_alt.export.micro import check_micro_shapes

        check_micro_shapes(converted.graph, f"{stem}_full_integer_quant.tflite")
    if quant_options.any:
        from onnx2tf_alt.quant.quantize import plan_quantization, write_quantized

        plan = plan_quantization(converted, quant_options, custom_data, mean, std)
        float32 = os.path.join(stage, f"{stem}_float32.tflite")
        _read_back(converted, float32, plan)
        with phase("quantized files"):
            written += write_quantized(converted, stage, stem, plan, float32,
                                       print_table=print_table)
        if micro:
            with phase("micro"):
                written.append(_check_micro(converted, stage, stem, plan, onnx_names))
    if checked is not None:
        _checked(converted, stage, stem, checked, True, print_table, plan, converted)
    return written


def _checked(converted: Converted, stage: str, stem: str, checked: CheckRequest,
             float32_written: bool, print_table: bool, quant_plan, files: Converted):
    """-coto / -cotof's AccuracyReport of `converted` (check/run.py), its reports written
    into `stage`: the float32 file in `stage` (where written) and the quantized files of
    `quant_plan`, read as `files` wrote them (the conversion the .tflite files come from:
    the direct writer's, or `converted` where TF's converter wrote them)."""
    from onnx2tf_alt.check.run import check_and_report

    with phase("check"):
        return check_and_report(
            converted, stage, stem, checked.full, checked.atol, checked.rtol,
            first_sample(checked.custom_inputs, converted.graph),
            os.path.join(stage, f"{stem}_float32.tflite") if float32_written else None,
            print_table,
            more_backends=None if quant_plan is None else _quantized_check(
                files, quant_plan, stage, stem),
            direct=files if files.result.model is None else None)


def _read_back(converted: Converted, float32: str, quant_plan) -> None:
    """The direct writer's float32 file, written as it was packed (past STREAMED_BYTES of
    weights), read back into its result's `content` where the INT8 files' quantizer reads
    it in memory (-oiqt; past 2 GB its weights lie after the flatbuffer, which
    flatbuffer.unpack_model and pack_model read and write)."""
    result = converted.result
    if result.model is None and not result.content and quant_plan.options.integer:
        with open(float32, "rb") as f:
            result.content = f.read()


def _write_int4(results: dict | None, stage: str, stem: str) -> str:
    """-oi4's file (quant/int4.py), made from the float32 .tflite in `stage` (TF's
    converter's: `results` bound again where they can be; the direct writer's: None)."""
    from onnx2tf_alt.export.names import INT4_SUFFIX
    from onnx2tf_alt.quant.int4 import write_int4_file

    name = f"{stem}_{INT4_SUFFIX}.tflite"
    with phase("tflite int4 weights"):
        count = write_int4_file(results, os.path.join(stage, f"{stem}_float32.tflite"),
                                os.path.join(stage, name))
    if not count:
        log.warning("-oi4: no FULLY_CONNECTED weight has inputs in whole blocks of 32 (and "
                    "1024 elements or more): %s holds int8 weights only", name)
    return name


def _litertlm_specs(call: dict) -> tuple:
    """--litertlm's tokenizer and signatures; InputError for what it needs and lacks, before
    anything is read."""
    from onnx2tf_alt.generative import litertlm as litert_lm

    capacity = call.get("kv_cache_capacity")
    missing = [flag for flag, key in (("--kv_cache_capacity N", "kv_cache_capacity"),
                                      ("--tokenizer PATH", "tokenizer")) if not call.get(key)]
    if missing:
        raise InputError(f"--litertlm needs {' and '.join(missing)}: the cache's positions "
                         "and the tokenizer (tokenizer.json, tokenizer.model or the model's "
                         "folder) go into the .litertlm.")
    if call.get("signatures"):
        raise InputError("--litertlm writes its own signatures (prefill_<T> for each "
                         "--litertlm_prefill T, and decode): drop --signature.")
    _refuse_beside_signatures("--litertlm", call)
    tokenizer = litert_lm.find_tokenizer(call["tokenizer"])
    lengths = litert_lm.prefill_lengths(call.get("litertlm_prefill"), capacity)
    return tokenizer, litert_lm.signature_specs(lengths)


def _signature_specs(signatures: list[list[str]] | None, call: dict) -> dict:
    """--signature's parsed specs; InputError when combined with an output that does not
    have several signatures yet."""
    if not signatures:
        return {}
    from onnx2tf_alt.generative.signatures import parse_signatures

    specs = parse_signatures(signatures)
    _refuse_beside_signatures("--signature", call)
    return specs


def _refuse_beside_signatures(flag: str, call: dict) -> None:
    """InputError when `call` asks, beside the signatures `flag` makes, for an output that
    does not have several signatures yet."""
    refused = [flag for flag, key in (
        ("-oh5", "output_h5"), ("-okv3", "output_keras_v3"),
        ("-oiqt", "output_integer_quantized_tflite"), ("--target", "target"),
        ("-coion", "copy_onnx_input_output_names_to_tflite"),
        ("-coto", "check_onnx_tf_outputs_elementwise_close"),
        ("-cotof", "check_onnx_tf_outputs_elementwise_close_full"),
        ("-inimc", "input_names_to_interrupt_model_conversion"),
        ("-onimc", "output_names_to_interrupt_model_conversion")) if call.get(key)]
    if refused or not call.get("output_tflite", True):
        raise InputError(
            f"{flag} writes the saved_model and the float32, float16, (-odrqt) "
            f"dynamic-range and (-oi4) int4 .tflite files; it cannot be combined with {', '.join(refused) or 'output_tflite=False'} "
            "yet: convert once per input shape for those outputs.")


def _write_quantized(converted: Converted, stage: str, stem: str, quant_plan, builtin_only: bool,
                     print_table: bool) -> list[str]:
    """The quantized .tflite files and their report, checked for Flex ops like the float ones."""
    from onnx2tf_alt.export.tflite import check_builtin_only_files
    from onnx2tf_alt.quant.quantize import write_quantized

    float32 = (os.path.join(stage, f"{stem}_float32.tflite") if converted.result.model is None
               else _float32_tflite(converted, stage, stem))  # the direct writer's: its path
    _read_back(converted, float32, quant_plan)
    quantized = write_quantized(converted, stage, stem, quant_plan, float32,
                                print_table=print_table)
    check_builtin_only_files([os.path.join(stage, n) for n in quantized if n.endswith(".tflite")],
                             converted, builtin_only)
    return quantized


def _check_target(target: str | None) -> bool:
    """Whether --target asks for the micro check (InputError for an unknown target, or when
    the tflite-micro package is missing)."""
    from onnx2tf_alt.export.names import TARGETS

    if target is None:
        return False
    if target not in TARGETS:
        raise InputError(f"--target must be one of {list(TARGETS)}, got '{target}'.")
    from onnx2tf_alt.export.micro import require_tflite_micro

    require_tflite_micro()
    return True


def _check_micro(converted: Converted, stage: str, stem: str, quant_plan,
                 onnx_names: bool) -> str:
    """Check the full-integer file on TFLite Micro and write `<stem>_micro.json` (see
    export/micro.py); a file the quantizer could not write is a ConversionError with its
    reason. With `onnx_names` (-coion) the file is checked as it will be published."""
    from onnx2tf_alt.export.micro import check_micro

    name = f"{stem}_full_integer_quant.tflite"
    source = quant_plan.made_from.get("full_integer_quant")
    if source is None:
        with open(os.path.join(stage, f"{stem}_quant_report.json")) as f:
            entries = json.load(f)["files"]
        why = next((e.get("error") for e in entries if e["variant"] == "full_integer_quant"),
                   None)
        raise ConversionError([], headline=(
            f"--target micro: {name} was not written ({why}); TFLite Micro needs every op "
            "in integers: replace the ops the quantizer could not take in the ONNX graph."))
    with open(os.path.join(stage, name), "rb") as f:
        content = f.read()
    published = None
    if onnx_names:
        from onnx2tf_alt.tflite.names import copy_onnx_names

        published = copy_onnx_names(content, converted.result, converted.graph)
    report = check_micro(content, name, source, quant_plan.samples.held_out, published)
    return report.write(stage, stem)


def _quantized_check(converted: Converted, quant_plan, stage: str, stem: str):
    """The accuracy check's extra backends: the quantized files written into `stage`."""
    from onnx2tf_alt.quant.check import quantized_backends

    def backends(found, feeds, full: bool):
        return quantized_backends(converted, quant_plan, found, feeds, full, stage, stem)

    return backends


def write_outputs(
    converted: Converted,
    folder: str,
    stem: str,
    output_h5: bool,
    output_keras_v3: bool,
    output_tflite: bool = True,
    onnx_names_in_tflite: bool = False,
    builtin_only: bool = False,
    saved_model: bool = True,
    direct_result=None,
) -> list[str]:
    """Write every requested format into `folder` (expected to be empty). Returns file names.
    `onnx_names_in_tflite` is what <stem>_io_layout.json records of the .tflite names (the
    caller renames the files, -coion); `builtin_only`: see check_builtin_only;
    `saved_model` False (-dms): no saved_model; `direct_result`: the direct writer's
    DirectResult (tflite/direct.py) the .tflite files are made from; None: TF's converter."""
    from onnx2tf_alt.export.keras_files import save_h5, save_keras_v3
    from onnx2tf_alt.export.saved_model import save_saved_model
    from onnx2tf_alt.translate.io_layout import save_io_layout

    result = converted.result
    written = []
    if saved_model:
        with phase("saved_model"):
            save_saved_model(result, folder)
        written += ["saved_model.pb", "variables"]
    if output_tflite:
        written += _write_tflite_files(converted, folder, stem, builtin_only, saved_model,
                                       direct_result)
    checkpoint()
    if output_h5:
        with phase("h5"):
            save_h5(result, os.path.join(folder, f"{stem}.h5"))
        written.append(f"{stem}.h5")
    if output_keras_v3:
        with phase("keras"):
            save_keras_v3(result, os.path.join(folder, f"{stem}.keras"))
        written.append(f"{stem}.keras")
    save_io_layout(result, converted.graph, os.path.join(folder, f"{stem}_io_layout.json"),
                   onnx_names_in_tflite)
    written.append(f"{stem}_io_layout.json")
    return written


def _direct_conversion(converted: Converted) -> Converted:
    """The direct writer's conversion (pipeline.direct_conversion) of the plan
    `converted`'s Keras model was built from; `converted` itself where the direct writer
    does not cover it (said at -v info). Past STREAMED_BYTES of weights the file is
    written as it is packed, the weights beside the Keras model's never all in memory a
    second time."""
    from onnx2tf_alt.tflite.direct import STREAMED_BYTES

    _, found = direct_conversion(Planned(converted.graph, converted.plan, converted.model,
                                         converted.options), STREAMED_BYTES)
    if not isinstance(found, Converted):
        log.info("direct TFLite writer: %s: converting with TF", found)
        return converted
    return found


def _write_tflite_files(converted: Converted, folder: str, stem: str,
                        builtin_only: bool, saved_model: bool = True,
                        direct_result=None) -> list[str]:
    """`<stem>_float32.tflite`, `<stem>_float16.tflite` and the float32 file's
    `<stem>_delegates.json` in `folder`.

    With `direct_result`, the direct writer's DirectResult of the plan the Keras model was
    built from (_direct_conversion), they are made from it (the same outputs and ops as TF's
    converter's file, in a fraction of its time: docs/direct_writer.md). Otherwise:

    The float32 file has its large weights bound after conversion (tflite/late_weights.py),
    written one weight at a time; where that does not apply, TF's converter reads the
    saved_model just written (unless the .tflite files compute in float32 a model the
    saved_model keeps in float64 / float16: passes/float32_compute.py). The float16 file is
    the float32 one with float16 constants (export/float16.py), else TF's converter's. The
    float32 file is unpacked once, for the delegate report and then the float16 file (which
    changes it): an unrolled 2-layer LSTM's 4,400 ops take 0.45 s to unpack."""
    from onnx2tf_alt.export.delegates import write_delegate_report
    from onnx2tf_alt.export.float16 import float16_from_float32, float16_model
    from onnx2tf_alt.export.tflite import check_builtin_only
    from onnx2tf_alt.tflite.flatbuffer import unpack_model
    from onnx2tf_alt.tflite.late_weights import mapped
    from onnx2tf_alt.tflite.lowering import late_bound, tflite_bytes, tflite_flat

    tflite_result = converted.tflite_result()
    if direct_result is not None:
        return _direct_tflite_files(replace(converted, result=direct_result,
                                            _tflite_result=direct_result), folder, stem)
    saved = folder if saved_model and tflite_result is converted.result else None
    names = [f"{stem}_float32.tflite", f"{stem}_float16.tflite"]
    paths = [os.path.join(folder, name) for name in names]
    checkpoint()
    model = None  # the float32 file unpacked (not for a bound one: its buffers are lazy)
    with phase("tflite float32"):
        bound = late_bound(tflite_result)
        if bound is not None:
            bound.write(paths[0])
            content = mapped(paths[0])
        else:
            flat = tflite_flat(tflite_result, saved_model=saved, late=False)
            content, model = flat.content, flat.model
            _write_bytes(paths[0], content)
        check_builtin_only(content, names[0], converted, builtin_only)
    checkpoint()
    if bound is None and model is None:
        model = unpack_model(content)
    with phase("delegate report"):
        report = write_delegate_report(converted, folder, stem, model)
    checkpoint()
    with phase("tflite float16"):
        if bound is not None and float16_model(bound.model):
            bound.write(paths[1])
            half = mapped(paths[1])
        else:
            half = float16_from_float32(content, model) or tflite_bytes(
                tflite_result, float16=True, saved_model=saved)
            _write_bytes(paths[1], half)
        check_builtin_only(half, names[1], converted, builtin_only)
    return [*names, report]


def _write_bytes(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def _float32_tflite(converted: Converted, folder: str, stem: str) -> bytes:
    """The float32 .tflite written into `folder`, or a fresh conversion when none was."""
    from onnx2tf_alt.tflite.late_weights import mapped
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    path = os.path.join(folder, f"{stem}_float32.tflite")
    if not os.path.isfile(path):
        return tflite_bytes(converted.tflite_result())
    return mapped(path)


def report_failures(
    exc: ConversionError,
    output: OutputFolder,
    manifest: Manifest,
    custom_inputs: dict[str, np.ndarray] | None,
) -> str | None:
    """Publish `<output>/reports/` for a ConversionError raised by `pipeline.build` (which
    attaches the prepared model as `exc.prepared_model`), replacing only an earlier failure
    report, and name the folder in the error's message. Returns the folder, or None when
    there is nothing to report or it could not be written (said in the message)."""
    model = getattr(exc, "prepared_model", None)
    if model is None or not exc.failures:
        return None
    reports = reports_folder(output.stem)
    folder = os.path.join(output.path, reports)
    try:
        with output.staging() as stage:
            write_failure_reports(model, exc.failures, os.path.join(stage, reports),
                                  custom_inputs)
            output.publish(stage, manifest, reports_only=True)
    except (OSError, InputError) as err:
        exc.args = (f"{exc}\nThe failure reports were not written: {err}",)
        return None
    note = f"Repro models and input values of the failing nodes: {folder} " \
           "(conversion_errors.json lists them)."
    exc.args = (f"{exc}\n{note}",)
    return folder
