"""Elementwise ops: layout-agnostic, so they run on whatever layout their inputs arrive in."""

from __future__ import annotations

import tensorflow as tf

from onnx2tf_alt.layout import agnostic
from onnx2tf_alt.registry import handler


def unary(op_type: str, fn, since: int = 1) -> None:
    """Register an attribute-free one-input op as `fn(x)`."""
    handler(op_type, since=since, layout=agnostic)(lambda ctx: fn(ctx.x(0)))


def binary(op_type: str, fn, since: int = 1) -> None:
    """Register a two-input broadcasting op as `fn(a, b)`."""
    handler(op_type, since=since, layout=agnostic)(lambda ctx: fn(ctx.x(0), ctx.x(1)))


unary("Relu", tf.nn.relu)
unary("Identity", tf.identity)
binary("Add", tf.add)
binary("Sub", tf.subtract)
binary("Mul", tf.multiply)
