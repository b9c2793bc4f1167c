"""float32 and float16 .tflite flatbuffers, converted from the serving function."""

from __future__ import annotations

import logging

import tensorflow as tf

from onnx2tf_alt.builder import BuildResult
from onnx2tf_alt.export.saved_model import serving_module

log = logging.getLogger("onnx2tf_alt")


def tflite_bytes(result: BuildResult, float16: bool = False, select_tf_ops: bool = True) -> bytes:
    """The model as a .tflite flatbuffer with a `serving_default` signature.

    TFLite builtins only; when the graph needs ops TFLite lacks, Select TF ops are allowed
    with a warning (the file then needs the Flex delegate) unless `select_tf_ops` is False.
    """
    holder = serving_module(result)
    concrete = holder.serve.get_concrete_function()

    def converter(select_tf_ops: bool):
        conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if select_tf_ops:
            ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
        conv.target_spec.supported_ops = ops
        if float16:
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.target_spec.supported_types = [tf.float16]
        return conv

    try:
        return converter(select_tf_ops=False).convert()
    except Exception as exc:  # retried with TF ops (unless not allowed), then reported
        if not select_tf_ops:
            raise
        message = str(exc).strip().splitlines()
        log.warning(
            "TFLite builtins cannot express this model (%s); using Select TF ops, which need "
            "the Flex delegate at run time",
            message[-1] if message else type(exc).__name__,
        )
        return converter(select_tf_ops=True).convert()
