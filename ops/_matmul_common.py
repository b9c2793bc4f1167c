"""Shared helpers of matrix products (MatMul, Gemm, FusedMatMul): an operand whose layout
only swaps its last two logical axes is used as it arrived, with the transpose flag set."""

from __future__ import annotations


def swaps_last_two(perm) -> bool:
    """Does `perm` only swap the last two axes?"""
    n = len(perm)
    return n >= 2 and tuple(perm) == (*range(n - 2), n - 1, n - 2)


def operand(ctx, i: int):
    """(input i as it arrived, whether its last two axes are physically swapped)."""
    return ctx.x(i), swaps_last_two(ctx.perm(i))
