"""Permutation algebra for the layout contract.

A value's `perm` says where its logical (ONNX) axes live physically: physical axis i of the
TF tensor holds logical axis perm[i]. An NCHW tensor kept in NHWC has perm (0, 2, 3, 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Perm = tuple[int, ...]


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def channel_last(rank: int) -> Perm:
    """(0, 2, ..., rank-1, 1): channel axis moved last; identity below rank 3."""
    if rank < 3:
        return identity(rank)
    return (0, *range(2, rank), 1)


def is_identity(perm: Sequence[int]) -> bool:
    return all(a == i for i, a in enumerate(perm))


def inverse(perm: Sequence[int]) -> Perm:
    inv = [0] * len(perm)
    for i, a in enumerate(perm):
        inv[a] = i
    return tuple(inv)


def to_physical_order(array: np.ndarray, perm: Sequence[int]) -> np.ndarray:
    """ONNX order -> the physical layout `perm` describes."""
    return np.transpose(array, perm)


def to_onnx_order(array: np.ndarray, perm: Sequence[int]) -> np.ndarray:
    """Physical layout `perm` -> ONNX order. A rank that disagrees with the perm is left as
    it is (a comparison then reports the shape mismatch)."""
    array = np.asarray(array)
    return np.transpose(array, np.argsort(perm)) if array.ndim == len(perm) else array


def to_physical_axis(perm: Sequence[int], logical_axis: int) -> int:
    """Physical position of a logical axis (negative axes allowed)."""
    return list(perm).index(logical_axis % len(perm))


def transpose_between(src: Sequence[int], dst: Sequence[int]) -> Perm:
    """tf.transpose permutation that turns a tensor laid out as `src` into layout `dst`."""
    return tuple(list(src).index(a) for a in dst)


def physical_shape(logical_shape: Sequence, perm: Sequence[int]) -> tuple:
    return tuple(logical_shape[a] for a in perm)


def logical_shape(phys_shape: Sequence, perm: Sequence[int]) -> tuple:
    return physical_shape(phys_shape, inverse(perm))


def moves_only_unit_axes(phys_shape: Sequence, transpose: Sequence[int]) -> bool:
    """True when a transpose only moves size-1 axes, so a reshape does the same job.

    Unknown dimensions (None) count as larger than one.
    """
    moved = [a for a in transpose if phys_shape[a] != 1]
    return moved == sorted(moved)


def drop_axes(perm: Sequence[int], axes: Sequence[int]) -> Perm:
    """Perm of a value after the logical `axes` are removed (Squeeze, Reduce keepdims=0)."""
    removed = set(axes)
    return tuple(a - sum(1 for r in removed if r < a) for a in perm if a not in removed)


def insert_axes(perm: Sequence[int], axes: Sequence[int]) -> Perm:
    """Perm after new size-1 logical `axes` (output numbering) are inserted (Unsqueeze).

    Each new axis is placed physically just before the logical axis that follows it, so an
    identity perm stays identity.
    """
    out_rank = len(perm) + len(axes)
    new = sorted(a % out_rank for a in axes)
    kept = [a for a in range(out_rank) if a not in new]  # output axis of each input axis
    order = [kept[a] for a in perm]
    for axis in new:
        later = [i for i, a in enumerate(order) if a > axis and a not in new]
        order.insert(min(later) if later else len(order), axis)
    return tuple(order)


def compose_transpose(in_perm: Sequence[int], onnx_perm: Sequence[int]) -> Perm:
    """Perm of the output of an ONNX Transpose(onnx_perm) applied with no data movement."""
    inv = inverse(onnx_perm)
    return tuple(inv[a] for a in in_perm)


def constant_in_perm(array: np.ndarray, perm: Perm | None) -> np.ndarray:
    """An ONNX-order constant as a handler reads it in `perm`: rank-aligned with leading 1s
    when perm is longer, transposed, contiguous."""
    if perm is not None:
        if array.ndim < len(perm):
            array = array.reshape((1,) * (len(perm) - array.ndim) + array.shape)
        array = np.transpose(array, perm)
    return np.ascontiguousarray(array).reshape(array.shape)
