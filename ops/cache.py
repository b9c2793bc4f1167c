"""`DynamicUpdateSlice` (domain onnx2tf_alt): not an ONNX op. The `.litertlm` export
(onnx2tf_alt/generative/litertlm.py) writes one per KV cache: the step's new entries go into
the whole cache at the step's first position, and the updated cache is returned, as
LiteRT-LM's executor expects (it binds one buffer as a cache input and output). TFLite's
DYNAMIC_UPDATE_SLICE does it in place; ONNX has no such op (ScatterND writes row by row).

Inputs: the cache, the update (same rank, each dim at most the cache's), the start index
of each axis (int32 or int64, [rank]); output: the cache with the update written at the
start (clamped so that the update fits, as XLA's DynamicUpdateSlice does).
"""

from __future__ import annotations

from onnx2tf_alt.ops._infer import dtype_of, infer_as
from onnx2tf_alt.ops.quant import FAKE_QUANT_DOMAIN

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


@handler("DynamicUpdateSlice", domain=FAKE_QUANT_DOMAIN,
         limits="internal: a KV cache's in-graph update, written by the .litertlm export",
         infer=infer_as("Identity", [0], dtype_of(0)))
def dynamic_update_slice(ctx):
    from tensorflow.compiler.tf2xla.python import xla

    start = tf.cast(ctx.x(2), tf.int32)
    return xla.dynamic_update_slice(ctx.x(0), tf.cast(ctx.x(1), ctx.x(0).dtype), start)
