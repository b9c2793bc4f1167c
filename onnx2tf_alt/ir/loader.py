"""Load an ONNX model from a path or a ModelProto, with errors a user can act on."""

from __future__ import annotations

import logging
import os

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from onnx2tf_alt.errors import InputError, printable
from onnx2tf_alt.ir.in_place import read_in_place
from onnx2tf_alt.ir.weights import keep_on_disk, spill, weight_free_copy

log = logging.getLogger("onnx2tf_alt")

MAX_CHECKED_BYTES = 2**31 - 1  # protobuf's limit: onnx.checker cannot serialize a larger model
# Ops onnxruntime runs in the ONNX domain beyond the ONNX spec (its transformers optimizer
# writes them): LayerNormalization below opset 17, SimplifiedLayerNormalization.
ORT_ONNX_DOMAIN_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")


def load_model(
    path: str | os.PathLike | None = None,
    proto: onnx.ModelProto | None = None,
    allow_newer_opset: bool = False,
) -> onnx.ModelProto:
    """The ModelProto to convert (a copy: the caller's proto and file are never modified).

    External data is read from the model's folder: small tensors into the model, large ones
    left on disk and read as needed (ir/weights.py); large inline weights are left in the
    model file itself and read the same way (ir/in_place.py). An opset newer than the installed onnx
    package knows is refused unless `allow_newer_opset` (then it converts as the newest).
    """
    checked, in_place = False, 0
    if proto is not None:
        model = onnx.ModelProto()
        model.CopyFrom(proto)
        source = "the given ModelProto"
    else:
        if path is None:
            raise InputError("No model given: pass -i/--input_onnx_file_path (a .onnx file).")
        path = os.fspath(path)
        model, in_place = _read(path)
        source = f"'{path}'"
        external = external_data_paths(path, model)  # every file present and readable
        if external and not in_place:  # by path: the data stays on disk
            _run_checker(path, source, allow_newer_opset)
            checked = True
        if external or in_place:
            try:
                on_disk = keep_on_disk(model, os.path.dirname(os.path.abspath(path)))
            except (OSError, ValueError) as exc:
                raise InputError(
                    f"The external data of {source} could not be read ({type(exc).__name__}: "
                    f"{exc}). Keep the model's data files beside it, complete and unchanged."
                ) from exc
            log.info("%s: %.1f MB of weights read from disk as needed", source, on_disk / 2**20)
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{source} holds no ONNX graph (no nodes and no outputs).")
    _check_opset(model, source, allow_newer_opset)
    if not checked:  # the weights left in the file are the model's inputs to the checker
        _run_checker(weight_free_copy(model) if in_place else model, source, allow_newer_opset)
    _check_has_inputs(model, source)  # after the checker, which names what is invalid
    try:
        model, moved = spill(model)
    except OSError as exc:  # no room for the file: the weights stay in the proto
        log.info("%s: weights kept in memory (%s)", source, exc)
    else:
        if moved:
            log.info("%s: %.1f MB of weights read from a temporary file as needed", source,
                     moved / 2**20)
    return model


def _run_checker(model: onnx.ModelProto | str, source: str, allow_newer_opset: bool) -> None:
    """onnx's checker (on a model, or on a file by its path, which never loads its external
    data): what it rejects is an InputError, except what converts all the same (deprecated
    ops, onnxruntime's ops in the ONNX domain, newer opsets when allowed)."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = printable(str(exc).strip().splitlines()[0])
        if "deprecated" in first:  # e.g. GroupNormalization-18: still well-defined, convert it
            log.warning("onnx.checker: %s", first)
            return
        if any(f"No Op registered for {op} " in first for op in ORT_ONNX_DOMAIN_OPS):
            log.warning("onnx.checker: %s (an onnxruntime op; converting anyway)", first)
            return
        if allow_newer_opset and "opset" in first.lower():
            log.warning("onnx.checker: %s (converting anyway: --allow_newer_opset)", first)
            return
        raise InputError(
            f"{source} is not a valid ONNX model: {first}. Re-export it, or repair it with "
            "onnx tools before converting."
        ) from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{source} is corrupt: a name or string in it is not valid UTF-8 ({exc.reason} at "
            f"byte {exc.start}). Re-export the model."
        ) from exc
    except ValueError:
        if isinstance(model, str) or model.ByteSize() <= MAX_CHECKED_BYTES:
            raise
        # models over 2 GB cannot be checked in memory; the loader already parsed them


def _check_has_inputs(model: onnx.ModelProto, source: str) -> None:
    """A Keras, TF or TFLite model is called on at least one input; a graph without runtime
    inputs computes constants, which onnxruntime (or onnx.reference) evaluates directly."""
    constants = {i.name for i in model.graph.initializer}
    if all(i.name in constants for i in model.graph.input):
        outputs = ", ".join(f"'{printable(o.name)}'" for o in model.graph.output)
        raise InputError(
            f"{source} has no runtime inputs: its outputs ({outputs}) are constants, and a "
            "TF / TFLite model needs at least one input. Evaluate it with onnxruntime or "
            "onnx.reference instead, or give the graph an input."
        )


def _read(path: str) -> tuple[onnx.ModelProto, int]:
    """(the model at `path` without its external data, its inline weights left in the file
    as external data of the file itself (ir/in_place.py), the bytes so left)."""
    if not os.path.isfile(path):
        raise InputError(f"Input model '{path}' does not exist or is not a file.")
    try:
        return read_in_place(path)
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise InputError(
            f"'{path}' could not be read as an ONNX model ({type(exc).__name__}: "
            f"{printable(str(exc))}). Check that the file is a complete .onnx export (not "
            "truncated, not another format) and that any external-data files sit beside it."
        ) from exc


def external_data_paths(path: str, model: onnx.ModelProto | None = None) -> list[str]:
    """The external-data files `path` refers to (absolute paths), the model file itself
    never among them (its inline weights read in place point at it); InputError when one is
    missing, unreadable or outside the model's folder. `model`: the file loaded without its
    external data (read again when omitted)."""
    if model is None:
        model, _ = _read(path)
    base = os.path.dirname(os.path.abspath(path))
    itself = os.path.normpath(os.path.abspath(path))
    found = []
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        location = os.path.normpath(os.path.join(base, info.location))
        if not location.startswith(base + os.sep):
            raise InputError(
                f"Tensor '{printable(tensor.name)}' of '{path}' points at external data "
                f"outside the model's folder ('{printable(info.location)}'); refusing to read it."
            )
        if not os.path.isfile(location) or not os.access(location, os.R_OK):
            raise InputError(
                f"External-data file '{location}' of tensor '{printable(tensor.name)}' is "
                f"missing or unreadable. Keep the files that '{os.path.basename(path)}' was "
                "saved with beside it."
            )
        if location != itself and location not in found:
            found.append(location)
    return found


def _check_opset(model: onnx.ModelProto, source: str, allow_newer_opset: bool) -> None:
    known = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and entry.version > known:
            if allow_newer_opset:
                log.warning(
                    "%s uses opset %d; the installed onnx %s knows up to %d: converting with "
                    "opset-%d semantics (--allow_newer_opset)",
                    source, entry.version, onnx.__version__, known, known,
                )
                entry.version = known
                return
            raise InputError(
                f"{source} uses ONNX opset {entry.version}, newer than the installed onnx "
                f"{onnx.__version__} knows (up to {known}). Upgrade onnx, re-export with "
                f"opset <= {known}, or pass --allow_newer_opset to convert it with opset-{known} "
                "semantics."
            )
