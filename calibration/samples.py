"""Calibration and held-out samples for every model input, in ONNX layout, one model batch
each: the user's arrays (`-cind NAME FILE.npy [MEAN STD]`), the shipped photographs for
image-like inputs, or (only for measuring, never for calibrating) seeded random values.

An array from -cind holds samples along axis 0: either whole inputs stacked on a new
leading axis (rank + 1), or rows of the input's batch axis (same rank), which are grouped
into batches of the model's batch size.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnx2tf_alt.check.inputs import (
    cast_custom,
    describe_not_finite,
    make_inputs,
    read_custom_array,
)
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.ir.graph import Graph, graph_from_model
from onnx2tf_alt.passes.prepare import parse_shape_overrides, set_input_shapes

HELD_OUT_FRACTION = 0.2
MAX_HELD_OUT = 20  # held-out samples measured per quantized file
RANDOM_SAMPLES = 4
PERTURBATION = 0.01  # relative noise making held-out samples out of a single sample
DEFAULT_IMAGE_SIZE = 224  # for image inputs with symbolic height or width
SEED = 0


@dataclass
class CustomData:
    """One `-cind NAME FILE.npy [MEAN STD]` entry, read and parsed."""

    name: str
    path: str
    array: np.ndarray
    mean: np.ndarray | None = None
    std: np.ndarray | None = None


@dataclass
class Samples:
    """Per-sample feeds {input name: array} in ONNX layout and dtype."""

    calibration: list[dict[str, np.ndarray]] = field(default_factory=list)
    held_out: list[dict[str, np.ndarray]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # input name -> where it came from


def _parse_values(text: str, what: str) -> np.ndarray:
    """'0.5', '0.485,0.456,0.406' or a (nested) list literal -> 1-D float32 values. onnx2tf
    writes per-channel values as a nested list in the input's rank, e.g.
    [[[[0.485,0.456,0.406]]]] or [[[[0.485]],[[0.456]],[[0.406]]]]; numbers may also be
    separated by spaces (numpy's printing)."""
    text = re.sub(r"(?<=[\d.])\s+(?=[-+\d.])", ",", text.strip())
    try:
        value = ast.literal_eval(text if text.startswith("[") else f"[{text}]")
        with np.errstate(over="ignore"):  # 1e39 becomes inf, refused by the caller
            return np.asarray(value, np.float32).reshape(-1)
    except (ValueError, SyntaxError, TypeError):
        raise InputError(
            f"-cind {what} '{text}' is not a number or a list of numbers, e.g. 0.5 or "
            "[0.485,0.456,0.406]."
        ) from None


def _rejoin_lists(entry: list[str]) -> list[str]:
    """A -cind entry whose unquoted list literals the shell split at spaces
    ('[0.485,', '0.456,', '0.406]') with each list joined back into one item."""
    joined: list[str] = []
    depth = 0
    for token in entry:
        if depth > 0:
            joined[-1] += f" {token}"
        else:
            joined.append(token)
        depth += token.count("[") - token.count("]")
    return joined


def parse_custom_data(entries: list[list[str]] | None) -> dict[str, CustomData]:
    """-cind entries (NAME FILE.npy [MEAN STD]) -> {name: CustomData}; files are read and
    checked now (read_custom_array; MEAN finite, STD finite and non-zero), so bad data fails
    before the conversion starts. check_against_inputs checks them against the model."""
    parsed = {}
    for entry in (_rejoin_lists(list(e)) for e in entries or []):
        if len(entry) not in (2, 4):
            raise InputError(f"-cind takes NAME FILE.npy [MEAN STD], got {list(entry)}.")
        name, path = entry[:2]
        array = read_custom_array(name, path)
        mean = std = None
        if len(entry) == 4:
            mean, std = _parse_values(entry[2], "MEAN"), _parse_values(entry[3], "STD")
        parsed[name] = CustomData(name, path, array, mean, std)
        if mean is not None:
            _check_normalization(parsed[name])
    return parsed


def _check_normalization(data: CustomData) -> None:
    where, mean, std = _where(data), data.mean, data.std
    if not np.isfinite(mean).all():
        raise InputError(f"{where}: MEAN {_listed(mean)} is not finite; give finite numbers.")
    if not np.isfinite(std).all() or not std.all():
        raise InputError(
            f"{where}: STD {_listed(std)} must be non-zero and finite, as the data is divided "
            "by it (did you mean 1?)."
        )


def _listed(values: np.ndarray) -> str:
    return str(values[0]) if values.size == 1 else str(values.tolist())


def check_against_inputs(
    custom: dict[str, CustomData],
    model: onnx.ModelProto,
    batch_size: int | None = None,
    overwrite_input_shape: list[str] | None = None,
) -> None:
    """Refuse (InputError), before any conversion work, -cind data that the inputs of the
    loaded `model` cannot take once -b / -ois fix their shapes: the sample shapes, dtypes
    and MEAN / STD counts that plan_samples would refuse, and values that normalization or
    the cast to the input's dtype make infinite. Names that are not inputs of `model` are
    left to the later checks (-inimc makes inner tensors inputs), as are inputs of unknown
    rank."""
    if not custom:
        return
    graph = _input_graph(model, batch_size, overwrite_input_shape)
    for name, data in custom.items():
        shape, dtype = graph.shapes.get(name), graph.dtypes.get(name)
        if name not in graph.inputs or shape is None or dtype is None:
            continue
        with np.errstate(all="ignore"):  # overflow is reported below, not as a warning
            units = _units(data, shape, np.dtype(dtype))
            not_finite = ~np.isfinite(units) if units.dtype.kind == "f" else None
        if not_finite is not None and not_finite.any():
            normalized = data.mean is not None
            raise InputError(
                f"{_where(data)}: {'(x - MEAN) / STD' if normalized else 'the values'} in "
                f"{np.dtype(dtype)}, the input's dtype, give "
                f"{describe_not_finite(units, not_finite)}: they overflow; "
                f"{'check MEAN and STD' if normalized else 'scale the data down'}."
            )


def _input_graph(
    model: onnx.ModelProto, batch_size: int | None, overwrite_input_shape: list[str] | None
) -> Graph:
    """The view of `model`'s inputs alone, their shapes fixed as prepare_model will; -ois
    entries that do not fit are left for it to refuse."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = onnx.ModelProto()
    inputs.graph.input.extend(i for i in model.graph.input if i.name not in initializers)
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in inputs.graph.input}
    overrides = {name: dims for name, dims in parse_shape_overrides(overwrite_input_shape).items()
                 if ranks.get(name) == len(dims)}
    set_input_shapes(inputs, batch_size, overrides)
    return graph_from_model(inputs)


def image_channel_axis(shape, dtype) -> int | None:
    """Channel axis (1: NCHW, 3: NHWC) of an image-like input: float, rank 4, 1 or 3
    channels (height and width may be known only at run time: tf2onnx's [1, ?, ?, 3]);
    None for any other input."""
    if dtype is None or np.dtype(dtype).kind != "f" or shape is None or len(shape) != 4:
        return None
    if shape[1] in (1, 3):
        return 1
    if shape[3] in (1, 3):
        return 3
    return None


def _batch_size(shape) -> int:
    return shape[0] if shape and shape[0] is not None else 1


def _batches(units: np.ndarray, shape) -> list[np.ndarray]:
    """Group units (axis 0) into whole inputs: batches of the model's batch size, cycling
    through the units to fill the last one; rank-0 inputs take one unit each."""
    if len(shape) == 0:
        return list(units)
    size = _batch_size(shape)
    count = max(1, math.ceil(len(units) / size))
    return [units[[(k * size + r) % len(units) for r in range(size)]] for k in range(count)]


def _units(data: CustomData, shape, dtype) -> np.ndarray:
    """The -cind array as units along axis 0, normalized and in the input's dtype."""
    array, rank = data.array, len(shape)
    where = _where(data)
    if rank == 0 and array.ndim == 0:  # one sample of a scalar input
        array = array.reshape(1)
    if array.ndim == rank + 1 and rank > 0:
        array = array.reshape(-1, *array.shape[2:])
    elif array.ndim != max(rank, 1):
        raise InputError(
            f"{where} has shape {list(data.array.shape)}; the input has shape "
            f"{_shown(shape)}: give N samples along axis 0, as (N, ...) of the input's shape "
            "or rows of its batch axis (ONNX layout)."
        )
    if rank and any(d is not None and d != a for d, a in zip(shape[1:], array.shape[1:])):
        raise InputError(
            f"{where} has samples of shape {list(array.shape[1:])}; the input expects "
            f"{_shown(shape[1:])} after the batch axis: save samples of that shape (ONNX "
            "layout, as -ois sets it)."
        )
    if data.mean is not None:
        if np.dtype(dtype).kind != "f":
            raise InputError(f"{where}: MEAN and STD apply to float inputs; '{data.name}' is "
                             f"{dtype}: drop them.")
        array = (array.astype(np.float32) - _per_channel(data.mean, shape, where)) / (
            _per_channel(data.std, shape, where))
    return cast_custom(where, array, dtype)


def _where(data: CustomData) -> str:
    return f"-cind file '{data.path}' for input '{data.name}'"


def _per_channel(values: np.ndarray, shape, where: str) -> np.ndarray:
    """Scalar, or one value per channel broadcast along the input's channel axis (the image
    channel axis, else axis 1, else the last axis)."""
    if values.size == 1:
        return values.reshape(())
    axes = [image_channel_axis(shape, np.float32), 1, len(shape) - 1]
    for axis in axes:
        if axis is not None and 0 < axis < len(shape) and shape[axis] == values.size:
            view = [1] * len(shape)
            view[axis] = -1
            return values.reshape(view)
    raise InputError(
        f"{where}: MEAN / STD have {values.size} values; the input {_shown(shape)} has no "
        "axis of that size: give one value, or one per channel."
    )


def _shown(shape) -> list:
    return [d if d is not None else "?" for d in shape]


def _split(units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, held-out) units: a seeded random fifth held out (the same rows of
    every input with as many samples, so inputs that belong together stay together); a
    single unit is used for calibration and perturbed slightly to give held-out ones."""
    rng = np.random.default_rng(SEED)
    if len(units) == 1:
        if units.dtype.kind != "f":
            return units, units
        scale = PERTURBATION * (float(np.std(units)) or 1.0)
        noise = rng.standard_normal((2, *units.shape[1:])) * scale
        return units, (units + noise).astype(units.dtype)
    order = rng.permutation(len(units))
    held = max(1, round(len(units) * HELD_OUT_FRACTION))
    return units[order[held:]], units[order[:held]]


def _image_units(shape, channel_axis: int, mean, std) -> tuple[np.ndarray, np.ndarray]:
    from calibration.photos import image_samples

    spatial = [1, 2] if channel_axis == 3 else [2, 3]
    height, width = (shape[a] or DEFAULT_IMAGE_SIZE for a in spatial)
    try:
        calibration, held = image_samples(height, width, shape[channel_axis], mean, std)
    except ValueError as exc:
        raise InputError(f"-qnm/-qns: {exc}.") from None
    if channel_axis == 1:
        calibration, held = (np.transpose(a, (0, 3, 1, 2)) for a in (calibration, held))
    return calibration, held


def _random_held_out(graph: Graph, name: str) -> list[np.ndarray]:
    return [make_inputs(graph, seed=SEED + k)[0][name] for k in range(RANDOM_SAMPLES)]


def require_calibration_data(graph: Graph, custom: dict[str, CustomData]) -> None:
    """The InputError plan_samples raises for an input that is not an image and has no
    -cind data, raised before anything is converted (a 2.3 GB model took 12 s to reach it).
    An input with run-time dims is left to the checks of its shape, which come first."""
    for name in graph.inputs:
        shape, dtype = graph.shapes.get(name) or (), np.dtype(graph.dtypes[name])
        if (name not in custom and None not in shape
                and image_channel_axis(shape, dtype) is None):
            raise _no_calibration_data(name, shape, dtype)


def _no_calibration_data(name: str, shape, dtype) -> InputError:
    return InputError(
        f"input '{name}' ({dtype}, shape {_shown(shape)}) is not an image, so INT8 "
        f"calibration (-oiqt) needs data for it: give -cind {name} FILE.npy with N "
        "samples along axis 0 (ONNX layout, optionally followed by MEAN STD).")


def plan_samples(
    graph: Graph,
    custom: dict[str, CustomData],
    mean=None,
    std=None,
    need_calibration: bool = True,
) -> Samples:
    """Calibration and held-out samples for every input of `graph`.

    Inputs without -cind data use the shipped photographs when image-like; otherwise, when
    calibration is needed, this raises an InputError naming the input and the flag.
    """
    unknown = sorted(set(custom) - set(graph.inputs))
    if unknown:
        raise InputError(
            f"-cind names input(s) {unknown} that the model does not have; its inputs are "
            f"{graph.inputs}."
        )
    per_input, sources = {}, {}
    for name in graph.inputs:
        shape, dtype = graph.shapes.get(name) or (), np.dtype(graph.dtypes[name])
        channel_axis = image_channel_axis(shape, dtype)
        if name in custom:
            calibration, held = _split(_units(custom[name], shape, dtype))
            sources[name] = f"-cind {custom[name].path}"
        elif channel_axis is not None:
            calibration, held = _image_units(shape, channel_axis, mean, std)
            sources[name] = "shipped photographs (calibration/)"
        elif need_calibration:
            raise _no_calibration_data(name, shape, dtype)
        else:
            per_input[name] = ([], _random_held_out(graph, name))
            sources[name] = "random (seeded)"
            continue
        per_input[name] = (_batches(calibration, shape), _batches(held, shape))
    return Samples(
        calibration=_combine({n: c for n, (c, _) in per_input.items()}),
        held_out=_combine({n: h for n, (_, h) in per_input.items()})[:MAX_HELD_OUT],
        sources=sources,
    )


def _combine(per_input: dict[str, list[np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Feeds for sample k: every input's k-th sample, cycling through shorter lists."""
    if not per_input or any(not v for v in per_input.values()):
        return []
    count = max(len(v) for v in per_input.values())
    return [{n: v[k % len(v)] for n, v in per_input.items()} for k in range(count)]
