"""Optional ops on tensor-typed values only: a plain tensor is a present optional."""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.layout.policies import agnostic
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


@handler("OptionalHasElement", since=15,
         limits="tensor inputs (always present) or no input; no optional-typed values")
def optional_has_element(ctx):
    return np.array(ctx.has(0))


@handler("OptionalGetElement", since=15, layout=agnostic, limits="tensor inputs only")
def optional_get_element(ctx):
    return tf.identity(ctx.x(0))
