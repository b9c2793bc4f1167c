"""Shared registration of elementwise ops (math, logic, activations): one layout-agnostic
handler per op from a TF function of its widened inputs. Calling these registers; importing
this module does not."""

from __future__ import annotations

from onnx2tf_alt.layout.policies import agnostic
from onnx2tf_alt.translate.registry import handler

from ._dtypes import widen


def unary(op_type: str, fn, since: int = 1, limits: str = "") -> None:
    """Register an attribute-free one-input op as `fn(x)` on the widened input."""
    handler(op_type, since=since, layout=agnostic, limits=limits)(
        lambda ctx: fn(widen(ctx.x(0)))
    )


def binary(op_type: str, fn, since: int = 1, limits: str = "", prepare=widen) -> None:
    """Register a two-input broadcasting op as `fn(a, b)` on the inputs made ready by
    `prepare` (default: widened)."""
    handler(op_type, since=since, layout=agnostic, limits=limits)(
        lambda ctx: fn(prepare(ctx.x(0)), prepare(ctx.x(1)))
    )
