"""`--signature NAME [MODEL.onnx] INPUT:D1,D2 ...`: one .tflite with a signature per set of
input shapes (a decoder's `prefill` and `decode`, an encoder at several sizes) or per model
(a speech model's encoder and decoder), sharing one copy of the weights.

Each signature is the model planned for its shapes (pipeline.plan_loaded on a copy of the
loaded model, with the shapes as -ois), so every handler, layout and rewrite is the one a
single conversion uses. The direct writer (tflite/direct.write_direct_signatures) writes
them all as subgraphs of one file, a constant equal in several stored once; no TensorFlow.
Where a saved_model or Keras file is asked for, or the direct writer does not cover a node,
each is built with TF, and TF's converter takes all their serving functions at once with
the large weights as inputs (tflite/lowering.late_bound_signatures): a weight equal in
several signatures is one input, bound to one buffer that every subgraph reads. The float16,
dynamic-range and int4 files are made from the float32 one, on either route.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.logs import phase
from onnx2tf_alt.passes.kv_cache import CacheEntry
from onnx2tf_alt.passes.prepare import parse_shape_overrides
from onnx2tf_alt.pipeline import Converted, Planned

log = logging.getLogger("onnx2tf_alt")

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a signature key


@dataclass(frozen=True)
class SignatureSpec:
    """One --signature: the -ois shapes of its inputs, and the ONNX file it is built from
    (None: the -i model)."""

    shapes: tuple[str, ...]
    source: str | None = None


def parse_signatures(specs: list[list[str]]) -> dict[str, SignatureSpec]:
    """[['prefill', 'input_ids:1,64'], ['encode', 'encoder.onnx', 'x:1,80,3000']] ->
    {name: SignatureSpec}; a word ending in .onnx right after the name is its model."""
    found: dict[str, SignatureSpec] = {}
    for spec in specs:
        name, rest = spec[0], list(spec[1:])
        if not NAME.match(name):
            raise InputError(
                f"--signature '{' '.join(spec)}': its first word is the signature's name "
                "(letters, digits, _), then optionally the ONNX file it is made from (default "
                "-i), then NAME:D1,D2,... for each input whose shape it fixes, e.g. "
                "--signature decode input_ids:1,1.")
        if name in found:
            raise InputError(f"--signature {name} is given twice.")
        source = rest.pop(0) if rest and rest[0].lower().endswith(".onnx") else None
        if source is not None and not os.path.isfile(source):
            raise InputError(f"--signature {name}: {source} is not a file.")
        for shape in rest:
            try:
                parse_shape_overrides([shape])
            except InputError:
                raise InputError(
                    f"--signature {name}: bad input shape '{shape}': expected NAME:D1,D2,... "
                    "with positive integers, e.g. input_ids:1,1.") from None
        found[name] = SignatureSpec(tuple(rest), source)
    return found


def _check_input_names(models: dict[str | None, onnx.ModelProto],
                      specs: dict[str, SignatureSpec], shapes: list[str] | None) -> None:
    """InputError naming the flag (--signature NAME, or -ois for the shapes every signature
    takes) when a shape names an input its signature's model (`models[spec.source]`, None:
    the -i one) does not have."""
    for name, spec in specs.items():
        model = models[spec.source]
        weights = {i.name for i in model.graph.initializer}
        inputs = sorted(i.name for i in model.graph.input if i.name not in weights)
        which = "the -i model" if spec.source is None else spec.source
        for flag, given, model_name in ((f"--signature {name}", spec.shapes, which),
                                        ("-ois", shapes or [], f"{which} (signature {name})")):
            unknown = sorted(set(parse_shape_overrides(given)) - set(inputs))
            if unknown:
                raise InputError(f"{flag} names input(s) {unknown} that {model_name} does not "
                                 f"have; its inputs are {inputs}.")


def sources_of(specs: dict[str, SignatureSpec]) -> list[str]:
    """The other ONNX files the signatures read (and their external data): never written."""
    from onnx2tf_alt.ir.loader import external_data_paths

    paths = []
    for spec in specs.values():
        if spec.source is not None:
            paths += [os.path.abspath(spec.source), *external_data_paths(spec.source)]
    return paths


def build_signatures(loaded: onnx.ModelProto, specs: dict[str, SignatureSpec],
                     shapes: list[str] | None, capacity: int | None,
                     load: Callable[[str], onnx.ModelProto],
                     build: Callable[[onnx.ModelProto, list[str]], Converted | Planned],
                     keras: bool = True
                     ) -> dict[str, tuple[Converted | Planned, list[CacheEntry]]]:
    """Each signature built by `build(its model, -ois specs)` (the common -ois `shapes`
    first: a Converted, or Planned for the direct writer with `keras` False), with its KV
    cache of `capacity` positions where its model has one (passes/kv_cache.py), and its
    cache's past/present pairs. InputError when a shape names an input its model lacks, an
    input is left with a dim no shape fixed, or `capacity` is given and no model has a
    cache (or cannot hold it)."""
    from onnx2tf_alt.passes.kv_cache import cache_entries, fixed_capacity, take_cache_branch

    models = {None: loaded}
    for spec in specs.values():
        if spec.source is not None and spec.source not in models:
            models[spec.source] = load(spec.source)
    _check_input_names(models, specs, shapes)
    caches: dict[str | None, list[CacheEntry]] = {}
    for source, model in models.items():
        caches[source] = []
        if capacity is None:
            continue
        take_cache_branch(model)  # a merged decoder: its branch with past
        if cache_entries(model) or len(models) == 1:
            models[source], caches[source] = fixed_capacity(model, capacity)
    if capacity is not None and not any(caches.values()):
        fixed_capacity(loaded, capacity)  # raises, naming the inputs
    built = {}
    if keras:  # Keras models: the weights once, not once per signature
        from onnx2tf_alt.translate.keras_layers import shared_constant_weights
    with shared_constant_weights() if keras else contextlib.nullcontext():
        for name, spec in specs.items():
            model = onnx.ModelProto()
            model.CopyFrom(models[spec.source])
            given = [*(shapes or []), *spec.shapes]
            given += _carried_shapes(name, model, given, caches[spec.source], built)
            with phase(f"signature {name}"):
                converted = build(model, given)
            _require_static(name, converted)
            built[name] = (converted, caches[spec.source])
    return built


def _carried_shapes(name: str, model: onnx.ModelProto, given: list[str],
                    entries: list[CacheEntry],
                    built: dict[str, tuple[Converted, list[CacheEntry]]]) -> list[str]:
    """-ois specs for the past inputs of `model` that no shape in `given` fixes, that are not
    its fixed-capacity caches (`entries`), and that an earlier signature returns, static, as
    a present output (`present.0.encoder.key` for `past_key_values.0.encoder.key`): the
    cross-attention caches a speech decoder's `decode` takes as `prefill` computed them."""
    returned = {}
    for other, (converted, _) in built.items():
        for value in converted.model.graph.output:
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            if dims and all(dims):
                returned[value.name] = (other, dims)
    named = set(parse_shape_overrides(given)) | {e.past for e in entries}
    found = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if (value.name in named or "." not in value.name or not value.name.startswith("past")
                or all(d.dim_value for d in dims)):
            continue
        present = "present" + value.name[value.name.index("."):]
        if present in returned and len(returned[present][1]) == len(dims):
            other, shape = returned[present]
            log.info(f"signature {name}: {value.name} takes the shape of signature {other}'s "
                     f"{present}, {shape}")
            found.append(f"{value.name}:{','.join(map(str, shape))}")
    return found


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


def write_signature_files(built: dict[str, tuple[Converted, list[CacheEntry]]], folder: str,
                          stem: str, dynamic_range: bool, int4: bool = False,
                          saved_model: bool = True) -> list[str]:
    """`<stem>_float32.tflite`, `<stem>_float16.tflite` (with `dynamic_range`
    `<stem>_dynamic_range_quant.tflite`, with `int4` `<stem>_int4_weight_quant.tflite`)
    holding every signature of `build_signatures`, `<stem>_io_layout.json` describing each
    (with its KV cache) and, with `saved_model`, a saved_model with the same signatures.
    Returns the file names."""
    from onnx2tf_alt.export.delegates import write_signature_delegate_report
    from onnx2tf_alt.tflite.direct import DirectResult
    from onnx2tf_alt.translate.io_layout import io_layout

    results = {name: c.tflite_result() for name, (c, _) in built.items()}
    direct = all(isinstance(r, DirectResult) for r in results.values())
    names = [f"{stem}_float32.tflite", f"{stem}_float16.tflite"]
    if saved_model:
        from onnx2tf_alt.export.saved_model import save_signatures_saved_model

        with phase("saved_model"):
            save_signatures_saved_model({name: c.result for name, (c, _) in built.items()},
                                        folder)
    paths = [os.path.join(folder, n) for n in names]
    if direct:
        from onnx2tf_alt.export.direct_files import write_float16, write_float32

        first = next(iter(results.values()))  # every signature's result holds the file
        content, model = write_float32(first, paths[0])
        with phase("tflite float16"):
            write_float16(first, content, model, paths[1])
    else:
        _write_converted_files(results, paths[0], paths[1])
    if dynamic_range:
        with phase("tflite dynamic range"):
            names.append(f"{stem}_dynamic_range_quant.tflite")
            _write_dynamic_range(results, paths[0], os.path.join(folder, names[-1]), direct)
    if int4:
        from onnx2tf_alt.export.names import INT4_SUFFIX
        from onnx2tf_alt.quant.int4 import write_int4_file

        with phase("tflite int4 weights"):
            names.append(f"{stem}_{INT4_SUFFIX}.tflite")
            write_int4_file(None if direct else results, paths[0],
                            os.path.join(folder, names[-1]))
    with phase("delegate report"):
        names.append(write_signature_delegate_report(
            {name: c for name, (c, _) in built.items()}, folder, stem))
    layout = {"signatures": {
        name: {**io_layout(c.tflite_result(), c.graph),
               "kv_cache": [{"past": e.past, "present": e.present, "axis": e.axis}
                            for e in cache]}
        for name, (c, cache) in built.items()}}
    if saved_model:
        names += ["saved_model.pb", "variables"]
    names.append(f"{stem}_io_layout.json")
    with open(os.path.join(folder, names[-1]), "w") as f:
        json.dump(layout, f, indent=2)
    return names


def _write_converted_files(results: dict, float32_path: str, float16_path: str) -> None:
    """TF's converter's file of every signature, its weights bound after conversion where it
    can (tflite/lowering.late_bound_signatures), and its float16 form."""
    from onnx2tf_alt.export.float16 import float16_from_float32, float16_model
    from onnx2tf_alt.tflite.lowering import late_bound_signatures, signatures_bytes

    with phase("tflite float32"):
        bound = late_bound_signatures(results)
        if bound is None:
            log.info("no weight is bound after conversion: each signature has its own copy "
                     "of the weights")
            _write(float32_path, signatures_bytes(results))
        else:
            bound.write(float32_path)
    with phase("tflite float16"):
        if bound is not None and float16_model(bound.model):
            bound.write(float16_path)
        else:
            with open(float32_path, "rb") as f:
                half = float16_from_float32(f.read())
            if half is None:
                raise InputError("the float16 .tflite of several signatures could not be made")
            _write(float16_path, half)


def _write_dynamic_range(results: dict, float32_path: str, path: str, direct: bool) -> None:
    """The -odrqt file at `path`: int8 weights (quant/weight_only.py) in TF's converter's
    file with the signatures' weights bound again where they can be, else (`direct`, no
    weight of LATE_ELEMENTS, or an op late binding does not take) in the float32 file at
    `float32_path`."""
    from onnx2tf_alt.quant.weight_only import dynamic_range_file, dynamic_range_weights

    bound = None
    if not direct:
        from onnx2tf_alt.tflite.lowering import late_bound_signatures

        bound = late_bound_signatures(results)
    if bound is None:
        _write(path, dynamic_range_file(float32_path, os.path.basename(path)))
        return
    dynamic_range_weights(bound.model, os.path.basename(path))
    bound.write(path)


def _write(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)
