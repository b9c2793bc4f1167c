"""Test inputs for the checker and the failure reports: seeded random values, or the
user's arrays (`-cind NAME FILE.npy`)."""

from __future__ import annotations

import os

import numpy as np

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.ir.graph import Graph

DEFAULT_SEED = 0
SMALL_INT_LIMIT = 8  # random integer inputs lie in [0, 8) unless an index bound is lower
UNKNOWN_DIM = 1  # size used for a dimension the model leaves symbolic
IMAGE_DIM = 224  # ... but an image's height and width (strided windows need room)

# Ops that pass index values through unchanged, so an input's use as indices can be traced.
_INDEX_PASSTHROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
                      "Transpose", "Expand"}
# numpy dtype kinds an input cannot take, as a message names them
_KIND_NAMES = {"U": "text", "S": "bytes", "c": "complex", "O": "Python object",
               "V": "structured", "M": "datetime", "m": "timedelta"}


def load_custom_inputs(pairs) -> dict[str, np.ndarray]:
    """`[[name, file.npy], ...]` (the -cind flag) -> {name: array}; files are read and
    checked now (read_custom_array) so bad data fails before the conversion starts."""
    arrays = {}
    for pair in pairs or []:
        if len(pair) != 2:
            raise InputError(f"-cind takes NAME FILE.npy, got {list(pair)}.")
        name, path = pair
        arrays[name] = read_custom_array(name, path)
    return arrays


def read_custom_array(name: str, path: str) -> np.ndarray:
    """The -cind array of input `name` in `path`: InputError unless it is a .npy file of
    numbers, non-empty and all finite (NaN or inf cannot calibrate nor be compared)."""
    if not os.path.isfile(path):
        raise InputError(f"-cind file '{path}' for input '{name}' does not exist.")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"-cind file '{path}' is not a .npy array ({exc}).") from exc
    where = f"-cind file '{path}' for input '{name}'"
    if array.dtype.kind not in "biuf":
        kind = _KIND_NAMES.get(array.dtype.kind, "non-numeric")
        raise InputError(
            f"{where} holds {kind} values (dtype {array.dtype}); inputs take numbers: save "
            "the array as float32, or as the input's integer type."
        )
    if array.size == 0:
        raise InputError(
            f"{where} is empty (shape {list(array.shape)}): give at least one sample along "
            "axis 0."
        )
    if array.dtype.kind == "f":
        not_finite = ~np.isfinite(array)
        if not_finite.any():
            raise InputError(f"{where} holds {describe_not_finite(array, not_finite)}: every "
                             "value must be finite; replace or drop those samples.")
    return array


def describe_not_finite(array: np.ndarray, not_finite: np.ndarray) -> str:
    """'3 non-finite value(s) of 12 (3 NaN, 0 inf), the first at sample 1 (index [1, 0])'
    for a float array and its mask of non-finite values."""
    nan, bad = int(np.count_nonzero(np.isnan(array))), int(np.count_nonzero(not_finite))
    first = [int(i) for i in np.unravel_index(int(np.argmax(not_finite)), array.shape)]
    at = f"sample {first[0]} (index {first})" if first else "its only value"
    return (f"{bad} non-finite value(s) of {array.size} ({nan} NaN, {bad - nan} inf), "
            f"the first at {at}")


def index_bounds(graph: Graph) -> dict[str, int]:
    """Exclusive upper bound for integer values used as Gather-style indices."""
    bounds: dict[str, int] = {}

    def bound(name: str, limit) -> None:
        if limit:
            bounds[name] = min(bounds.get(name, limit), int(limit))

    for node in reversed(graph.nodes):  # consumers first, so bounds flow back to inputs
        data = graph.shapes.get(node.inputs[0]) if node.inputs else None
        if node.op_type in ("Gather", "GatherElements") and data and len(node.inputs) > 1:
            bound(node.inputs[1], data[node.attrs.get("axis", 0)])
        elif node.op_type == "GatherND" and data and len(node.inputs) > 1:
            depth = (graph.shapes.get(node.inputs[1]) or (None,))[-1]
            first = node.attrs.get("batch_dims", 0)
            dims = data[first:first + depth] if depth else ()
            bound(node.inputs[1], min(dims) if dims and None not in dims else None)
        elif node.op_type in _INDEX_PASSTHROUGH and node.outputs[0] in bounds:
            bound(node.inputs[0], bounds[node.outputs[0]])
    return bounds


def make_inputs(
    graph: Graph, custom: dict[str, np.ndarray] | None = None, seed: int = DEFAULT_SEED
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One array per model input (ONNX order and dtype) and where each came from.

    Floats are standard normal; integers are small and non-negative, below the size of the
    axis they index when they feed a Gather; bools are fair coin flips.
    """
    custom = dict(custom or {})
    unknown = sorted(set(custom) - set(graph.inputs))
    if unknown:
        raise InputError(
            f"-cind names input(s) {unknown} that the model does not have; its inputs are "
            f"{graph.inputs}."
        )
    rng = np.random.default_rng(seed)
    bounds = index_bounds(graph)
    feeds, sources = {}, {}
    for name in graph.inputs:
        dtype = np.dtype(graph.dtypes[name])
        shape = graph.shapes.get(name) or ()
        if name in custom:
            feeds[name] = _checked_custom(name, custom[name], shape, dtype)
            sources[name] = "file"
            continue
        dims = test_dims(shape, dtype)
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind in "iu":
            high = min(SMALL_INT_LIMIT, bounds.get(name, SMALL_INT_LIMIT))
            feeds[name] = rng.integers(0, max(high, 1), dims).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(dims) < 0.5
        else:
            raise InputError(
                f"input '{name}' has dtype {dtype}, for which no random test data exists; "
                "give it with -cind NAME FILE.npy."
            )
        sources[name] = "random"
    return feeds, sources


def test_dims(shape, dtype) -> tuple[int, ...]:
    """The dims random test data takes: UNKNOWN_DIM for each symbolic one, but IMAGE_DIM
    for the height and width of an image (float, rank 4, 1 or 3 channels first or last)."""
    dims = [UNKNOWN_DIM if d is None else d for d in shape]
    if np.dtype(dtype).kind == "f" and len(shape) == 4:
        spatial = (2, 3) if shape[1] in (1, 3) else (1, 2) if shape[3] in (1, 3) else ()
        for axis in spatial:
            if shape[axis] is None:
                dims[axis] = IMAGE_DIM
    return tuple(dims)


def _checked_custom(name: str, array: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    if len(array.shape) != len(shape) or any(
        d is not None and d != a for d, a in zip(shape, array.shape)
    ):
        raise InputError(
            f"-cind array for '{name}' has shape {list(array.shape)}; the model expects "
            f"{[d if d is not None else '?' for d in shape]} (ONNX layout)."
        )
    return cast_custom(f"-cind array for '{name}'", array, dtype)


def cast_custom(what: str, array: np.ndarray, dtype) -> np.ndarray:
    """A -cind array in the input's dtype; a cast across kinds (float data for an integer
    input, bool for a float one, ...) is an InputError whose message starts with `what`
    ("-cind array for 'x'")."""
    if array.dtype == dtype:
        return array
    dtype = np.dtype(dtype)
    # bool -> float is a valid numpy cast, but 0/1 values for a float input are a mix-up
    if not np.can_cast(array.dtype, dtype, casting="same_kind") or (
            array.dtype.kind == "b" and dtype.kind == "f"):
        raise InputError(
            f"{what} has dtype {array.dtype}; the model expects {dtype}: save it as {dtype}."
        )
    return array.astype(dtype)


def first_sample(custom: dict[str, np.ndarray], graph: Graph) -> dict[str, np.ndarray]:
    """The checker's view of -cind arrays that hold several samples: the first one."""
    trimmed = {}
    for name, array in custom.items():
        shape = graph.shapes.get(name)
        if shape is not None and array.ndim == len(shape) + 1:
            array = array[0]
        elif shape and shape[0] is not None and array.ndim == len(shape) and (
                array.shape[0] > shape[0]):
            array = array[: shape[0]]
        trimmed[name] = array
    return trimmed
