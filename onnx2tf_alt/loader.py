"""Load an ONNX model from a path or a ModelProto, with errors a user can act on."""

from __future__ import annotations

import logging
import os

import onnx
from google.protobuf.message import DecodeError

from onnx2tf_alt.errors import InputError

log = logging.getLogger("onnx2tf_alt")


def load_model(path: str | os.PathLike | None = None, proto: onnx.ModelProto | None = None):
    """The ModelProto to convert (a copy: the caller's proto and file are never modified).

    External data is read from the model's folder.
    """
    if proto is not None:
        model = onnx.ModelProto()
        model.CopyFrom(proto)
        source = "the given ModelProto"
    else:
        if path is None:
            raise InputError("No model given: pass -i/--input_onnx_file_path (a .onnx file).")
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise InputError(f"Input model '{path}' does not exist or is not a file.")
        try:
            model = onnx.load(path, load_external_data=True)
        except (DecodeError, RuntimeError, ValueError, OSError) as exc:
            raise InputError(
                f"'{path}' could not be read as an ONNX model ({type(exc).__name__}: {exc}). "
                "Check that the file is a complete .onnx export (not truncated, not another "
                "format) and that any external-data files sit beside it."
            ) from exc
        source = f"'{path}'"
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{source} holds no ONNX graph (no nodes and no outputs).")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        if "deprecated" in first:  # e.g. GroupNormalization-18: still well-defined, convert it
            log.warning("onnx.checker: %s", first)
            return model
        raise InputError(
            f"{source} is not a valid ONNX model: {first}. Re-export it, or repair it with "
            "onnx tools before converting."
        ) from exc
    except ValueError:
        pass  # models over 2 GB cannot be checked in memory; the loader already parsed them
    return model
