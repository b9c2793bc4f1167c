"""`--signature NAME INPUT:D1,D2 ...`: one .tflite with a signature per set of input shapes
(a decoder's `prefill` and `decode`, an encoder at several sizes), sharing one copy of the
weights.

Each signature is the model built for its shapes (pipeline.build_loaded on a copy of the
loaded model, with the shapes as -ois), so every handler, layout and rewrite is the one a
single conversion uses. TF's converter then takes all their serving functions at once with
the large weights as inputs (tflite/lowering.late_bound_signatures): a weight equal in
several signatures is one input, bound to one buffer that every subgraph reads. The float16
and dynamic-range files are made from that bound model as for one signature.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable

import onnx

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.logs import phase
from onnx2tf_alt.passes.kv_cache import CacheEntry
from onnx2tf_alt.pipeline import Converted

log = logging.getLogger("onnx2tf_alt")

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_signatures(specs: list[list[str]]) -> dict[str, list[str]]:
    """[['prefill', 'input_ids:1,64'], ['decode', 'input_ids:1,1']] -> {name: -ois specs}."""
    found: dict[str, list[str]] = {}
    for spec in specs:
        name, shapes = spec[0], list(spec[1:])
        if not NAME.match(name) or ":" in name:
            raise InputError(
                f"--signature '{' '.join(spec)}': its first word is the signature's name "
                "(letters, digits, _), then NAME:D1,D2,... for each input whose shape it "
                "fixes, e.g. --signature decode input_ids:1,1.")
        if name in found:
            raise InputError(f"--signature {name} is given twice.")
        found[name] = shapes
    return found


def build_signatures(loaded: onnx.ModelProto, signatures: dict[str, list[str]],
                     shapes: list[str] | None,
                     build: Callable[[onnx.ModelProto, list[str]], Converted]
                     ) -> dict[str, Converted]:
    """Each signature built by `build(copy of loaded, -ois specs)`, the common -ois `shapes`
    first; InputError when an input is left with a dim no shape fixed."""
    from onnx2tf_alt.translate.keras_layers import shared_constant_weights

    built = {}
    with shared_constant_weights():  # the weights once, not once per signature
        for name, specs in signatures.items():
            model = onnx.ModelProto()
            model.CopyFrom(loaded)
            with phase(f"signature {name}"):
                built[name] = build(model, [*(shapes or []), *specs])
            _require_static(name, built[name])
    return built


def _require_static(name: str, converted: Converted) -> None:
    open_dims = [
        f"{i.name} {[d.dim_value or d.dim_param or '?' for d in i.type.tensor_type.shape.dim]}"
        for i in converted.model.graph.input
        if any(not d.dim_value for d in i.type.tensor_type.shape.dim)]
    if open_dims:
        raise InputError(
            f"--signature {name}: the shapes given leave input dims open: "
            f"{'; '.join(open_dims)}. Give those inputs' shapes in the signature "
            f"(NAME:D1,D2,...).")


def write_signature_files(built: dict[str, Converted], folder: str, stem: str,
                          dynamic_range: bool, cache: list[CacheEntry]) -> list[str]:
    """`<stem>_float32.tflite`, `<stem>_float16.tflite` (and with `dynamic_range`
    `<stem>_dynamic_range_quant.tflite`) holding every signature, and
    `<stem>_io_layout.json` describing each. Returns the file names."""
    from onnx2tf_alt.export.float16 import float16_from_float32, float16_model
    from onnx2tf_alt.quant.weight_only import dynamic_range_model
    from onnx2tf_alt.tflite.lowering import late_bound_signatures, signatures_bytes
    from onnx2tf_alt.translate.io_layout import io_layout

    results = {name: c.tflite_result() for name, c in built.items()}
    names = [f"{stem}_float32.tflite", f"{stem}_float16.tflite"]
    with phase("tflite float32"):
        bound = late_bound_signatures(results)
        if bound is None:
            log.info("no weight is bound after conversion: each signature has its own copy "
                     "of the weights")
            content = signatures_bytes(results)
            _write(os.path.join(folder, names[0]), content)
        else:
            bound.write(os.path.join(folder, names[0]))
    with phase("tflite float16"):
        if bound is not None and float16_model(bound.model):
            bound.write(os.path.join(folder, names[1]))
        else:
            with open(os.path.join(folder, names[0]), "rb") as f:
                half = float16_from_float32(f.read())
            if half is None:
                raise InputError("the float16 .tflite of several signatures could not be made")
            _write(os.path.join(folder, names[1]), half)
    if dynamic_range:
        with phase("tflite dynamic range"):
            bound = late_bound_signatures(results)
            if bound is None or not dynamic_range_model(bound.model):
                raise InputError("-odrqt with --signature needs weights bound after "
                                 "conversion; this model has none large enough")
            names.append(f"{stem}_dynamic_range_quant.tflite")
            bound.write(os.path.join(folder, names[-1]))
    layout = {
        "signatures": {name: io_layout(c.tflite_result(), c.graph) for name, c in built.items()},
        "kv_cache": [{"past": e.past, "present": e.present, "axis": e.axis} for e in cache],
    }
    names.append(f"{stem}_io_layout.json")
    with open(os.path.join(folder, names[-1]), "w") as f:
        json.dump(layout, f, indent=2)
    return names


def _write(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)
