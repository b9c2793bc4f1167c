"""Run the accuracy check on an in-memory conversion (`pipeline.Converted`)."""

from __future__ import annotations

import glob
import json
import logging
import os

import numpy as np

from onnx2tf_alt import progress
from onnx2tf_alt.check.compare import FAIL, AccuracyReport, BackendReport, compare
from onnx2tf_alt.check.file_values import direct_probe
from onnx2tf_alt.check.inputs import (
    DEFAULT_SEED,
    IMAGE_DIM,
    UNKNOWN_DIM,
    first_sample,
    make_inputs,
)
from onnx2tf_alt.check.observe import (
    debug_tflite,
    ort_values,
    targets,
    tf_values,
    tflite_values,
)
from onnx2tf_alt.check.report import console_table, write_reports
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.pipeline import build, build_direct, stem_of
from onnx2tf_alt.translate.io_layout import io_layout

log = logging.getLogger("onnx2tf_alt")

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 0.0


def check_converted(
    converted,
    full: bool = True,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    custom_inputs: dict[str, np.ndarray] | None = None,
    tflite: bool = True,
    tflite_model: bytes | str | None = None,
    model_name: str = "model",
    seed: int = DEFAULT_SEED,
    more_backends=None,
    direct=None,
) -> AccuracyReport:
    """Compare the converted model with onnxruntime on one set of inputs: its Keras model
    (where one was built: a direct conversion has none) and its .tflite files.

    `full`: every node output (topological order), else only the model outputs. With
    `tflite`, the float32 TFLite is compared as well: a debugging flatbuffer exposing every
    value when `full`, else `tflite_model` (the shipped file: its bytes or its path) or a
    fresh conversion. `direct`: the direct writer's conversion of the same plan, which the
    shipped .tflite files come from; the debugging flatbuffer is then its probe
    (check/file_values.py), else TF's converter's of a Keras probe.
    `more_backends(found, feeds, full)`: further BackendReports to add, e.g. the quantized
    files' (onnx2tf_alt/quant/check.py), given the values under test and the inputs.
    """
    feeds, sources = make_inputs(converted.graph, custom_inputs, seed)
    report = AccuracyReport(
        model=model_name, full=full, atol=atol, rtol=rtol, seed=seed,
        inputs={n: {"shape": list(a.shape), "dtype": a.dtype.name, "source": sources[n]}
                for n, a in feeds.items()},
    )
    found = targets(converted, full)
    try:
        reference = ort_values(converted.model, feeds, [t.onnx_name for t in found])
    except Exception as exc:  # noqa: BLE001 - the report says why there is no reference
        report.error = f"onnxruntime cannot run the model: {_short(exc)}"
        open_dims = [n for n in converted.graph.inputs if sources[n] != "file"
                     and None in (converted.graph.shapes.get(n) or ())]
        if open_dims:  # e.g. an image input of unknown height and width, fed 1 x 1
            report.error += (f" (input(s) {open_dims} have unknown dims, fed as size "
                             f"{UNKNOWN_DIM} (an image's height and width {IMAGE_DIM}): give "
                             "their sizes with -ois, or data with -cind)")
        return report

    def backend(name: str, values: dict, missing=lambda t: "not computed",
                failures: dict[str, str] | None = None) -> BackendReport:
        checks = [
            compare(t, reference[t.onnx_name], values.get(t.onnx_name), atol, rtol, missing(t))
            for t in found
        ]
        for check in checks:
            if failures and check.output_name in failures:
                check.status, check.note = FAIL, failures[check.output_name]
        return BackendReport(name, checks)

    if converted.result.model is not None:  # a Keras model was built: it is checked too
        failures: dict[str, str] = {}
        values = tf_values(converted, found, feeds, failures)
        report.backends["tf"] = backend(
            "tf", values, lambda t: "not computed: an earlier op raised" if failures else
            "not computed", failures)
    if tflite:
        report.backends["tflite"] = _tflite_report(converted, found, feeds, tflite_model, backend,
                                                   direct)
    for extra in more_backends(found, feeds, full) if more_backends is not None else []:
        report.backends[extra.backend] = extra
    return report


def check_and_report(
    converted,
    folder: str,
    stem: str,
    full: bool,
    atol: float,
    rtol: float,
    custom_inputs: dict[str, np.ndarray] | None,
    tflite_path: str | None,
    print_table: bool = True,
    more_backends=None,
    direct=None,
) -> AccuracyReport:
    """The check `convert` runs for -coto / -cotof: the shipped float32 .tflite (when
    written) for the model outputs, a debugging one for all values; table on stdout,
    JSON and HTML in `folder` (the staging folder: reports are published with the model)."""
    tflite_model = tflite_path if not full else None  # run from its file (mapped)
    report = check_converted(
        converted, full=full, atol=atol, rtol=rtol, custom_inputs=custom_inputs,
        tflite=tflite_path is not None, tflite_model=tflite_model, model_name=stem,
        more_backends=more_backends, direct=direct,
    )
    write_reports(report, folder, stem)
    if print_table:
        progress.clear()
        print(console_table(report), flush=True)
    log.log(  # a pass is said once, in the closing summary (export/summary.py)
        logging.DEBUG if report.passed else logging.WARNING,
        "accuracy check %s; report: %s_accuracy_report.json and .html",
        "passed" if report.passed else "FAILED", stem,
    )
    return report


def _tflite_report(converted, found, feeds, tflite_model, backend, direct=None
                   ) -> BackendReport:
    """The float32 TFLite's values: from a debugging flatbuffer exposing every target (the
    direct writer's probe where `direct` is its conversion and it covers the probe, else
    TF's converter's), or, when only model outputs are checked, from `tflite_model` (the
    shipped file)."""
    outputs_only = all(t.onnx_name in converted.result.output_names for t in found)
    try:
        perms = {t.onnx_name: t.perm for t in found}
        probe = None if outputs_only or direct is None else direct_probe(direct, found)
        if outputs_only:
            content = tflite_model
            if content is None and converted.result.model is None:
                content = converted.result.content  # the direct writer's file
            elif content is None:  # TF's converter (the Keras model's check)
                from onnx2tf_alt.tflite.lowering import tflite_bytes

                content = tflite_bytes(converted.tflite_result())
            keys = {t.onnx_name: converted.result.output_names[t.onnx_name] for t in found}
        elif probe is not None:
            content, converted = probe
            keys, perms = dict(converted.result.output_names), converted.result.output_perms
        else:
            content, keys = debug_tflite(converted, found)
        values = tflite_values(converted, content, keys, perms, feeds)
    except Exception as exc:  # noqa: BLE001 - reported, with every value unobserved
        reason = f"TFLite conversion or run failed: {_short(exc)}"
        failed = backend("tflite", {}, lambda t: reason)
        failed.error = reason
        return failed

    def missing(t) -> str:
        if t.const is not None:
            return "constant at conversion time: no TFLite tensor holds it"
        return "the TFLite converter did not keep this tensor"

    return backend("tflite", values, missing)


def _short(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def check_files(
    input_onnx_file_path: str,
    converted_path: str | None = None,
    full: bool = True,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    inputs: dict[str, np.ndarray] | None = None,
    tflite: bool = True,
    report_folder: str | None = None,
    seed: int = DEFAULT_SEED,
    keras: bool = True,
    **build_kwargs,
) -> AccuracyReport:
    """`onnx2tf_alt.check`: rebuild the conversion in memory and check it (see there);
    without `keras`, the direct writer's conversion alone (no TensorFlow)."""
    stem = stem_of(input_onnx_file_path)
    recorded, tflite_model = None, None
    if converted_path is not None:
        recorded, layout_stem = _read_io_layout(converted_path, stem)
        for key, value in _options_from_layout(recorded).items():
            build_kwargs.setdefault(key, value)
        shipped = os.path.join(converted_path, f"{layout_stem}_float32.tflite")
        if os.path.isfile(shipped):
            with open(shipped, "rb") as f:
                tflite_model = _with_tf_names(f.read(), recorded)
    converted = (build if keras else build_direct)(
        input_onnx_file_path=input_onnx_file_path, **build_kwargs)
    if recorded is not None:
        _verify_layout(converted, recorded, converted_path)
    report = check_converted(
        converted, full=full, atol=atol, rtol=rtol, tflite=tflite,
        custom_inputs=first_sample(inputs or {}, converted.graph),
        tflite_model=tflite_model, model_name=stem, seed=seed,
        direct=converted,  # as the CLI writes the files: the direct writer where it covers
    )
    if report_folder is not None:
        os.makedirs(report_folder, exist_ok=True)
        write_reports(report, report_folder, stem)
    return report


def _with_tf_names(content: bytes, layout: dict) -> bytes:
    """A -coion .tflite (ONNX names, see tflite_names.py) renamed back to the
    signature keys the checker feeds (`tf_name`); other files as they are."""
    from onnx2tf_alt.tflite.names import rename_io

    names = {side: {e["tflite_name"]: e["tf_name"] for e in layout.get(side, [])
                    if e.get("tflite_name", e["tf_name"]) != e["tf_name"]}
             for side in ("inputs", "outputs")}
    return rename_io(content, names["inputs"], names["outputs"]) if any(names.values()) else (
        content)


def _read_io_layout(folder: str, stem: str) -> tuple[dict, str]:
    path = os.path.join(folder, f"{stem}_io_layout.json")
    found = [path] if os.path.isfile(path) else glob.glob(os.path.join(folder, "*_io_layout.json"))
    if len(found) != 1:
        raise InputError(
            f"'{folder}' holds {len(found)} *_io_layout.json files; expected the one a "
            "conversion writes beside its outputs."
        )
    with open(found[0]) as f:
        layout = json.load(f)
    return layout, os.path.basename(found[0])[: -len("_io_layout.json")]


def _options_from_layout(layout: dict) -> dict:
    """The -k / -kt / -ois options that reproduce the recorded input layouts and shapes."""
    keep, force, shapes = [], [], []
    for entry in layout.get("inputs", []):
        perm, shape = tuple(entry["perm"]), entry["onnx_shape"]
        if 3 <= len(perm) <= 5:
            (keep if P.is_identity(perm) else force).append(entry["onnx_name"])
        if shape and all(isinstance(d, int) and d > 0 for d in shape):
            shapes.append(f"{entry['onnx_name']}:{','.join(map(str, shape))}")
    options = {}
    if keep:
        options["keep_ncw_or_nchw_or_ncdhw_input_names"] = keep
    if force:
        options["keep_nwc_or_nhwc_or_ndhwc_input_names"] = force
    if shapes:
        options["overwrite_input_shape"] = shapes
    return options


def _verify_layout(converted, recorded: dict, folder: str) -> None:
    """The rebuilt conversion must lay out inputs and outputs as the files in `folder` do."""
    fresh = io_layout(converted.result, converted.graph)
    keys = ("onnx_name", "perm", "shape", "dtype")
    for side in ("inputs", "outputs"):
        a = [{k: e.get(k) for k in keys} for e in recorded.get(side, [])]
        b = [{k: e.get(k) for k in keys} for e in fresh[side]]
        if a != b:
            raise InputError(
                f"the {side} of the conversion in '{folder}' ({a}) differ from a fresh "
                f"conversion of the model ({b}); pass the options it was converted with."
            )
