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

# Ops that pass index values through unchanged, so an input's use as indices can be traced.
_INDEX_PASSTHROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
                      "Transpose", "Expand"}


def load_custom_inputs(pairs) -> dict[str, np.ndarray]:
    """`[[name, file.npy], ...]` (the -cind flag) -> {name: array}; files are read now so a
    bad path fails before the conversion starts."""
    arrays = {}
    for pair in pairs or []:
        if len(pair) != 2:
            raise InputError(f"-cind takes NAME FILE.npy, got {list(pair)}.")
        name, path = pair
        if not os.path.isfile(path):
            raise InputError(f"-cind file '{path}' for input '{name}' does not exist.")
        try:
            arrays[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"-cind file '{path}' is not a .npy array ({exc}).") from exc
    return arrays


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
        dims = tuple(UNKNOWN_DIM if d is None else d for d in shape)
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


def _checked_custom(name: str, array: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    if len(array.shape) != len(shape) or any(
        d is not None and d != a for d, a in zip(shape, array.shape)
    ):
        raise InputError(
            f"-cind array for '{name}' has shape {list(array.shape)}; the model expects "
            f"{[d if d is not None else '?' for d in shape]} (ONNX layout)."
        )
    return cast_custom(name, array, dtype)


def cast_custom(name: str, array: np.ndarray, dtype) -> np.ndarray:
    """A -cind array in the input's dtype; a cast across kinds (float data for an integer
    input, ...) is an InputError."""
    if array.dtype == dtype:
        return array
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise InputError(
            f"-cind array for '{name}' has dtype {array.dtype}; the model expects {dtype}."
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
