"""saved_model with a `serving_default` signature named after the ONNX inputs and outputs."""

from __future__ import annotations

import tensorflow as tf

from onnx2tf_alt.builder import BuildResult


def serving_function(result: BuildResult):
    """A tf.function with named TensorSpecs, returning a dict of named outputs."""
    model = result.model
    specs = [
        tf.TensorSpec(t.shape, t.dtype, name=name)
        for t, name in zip(model.inputs, result.input_names.values())
    ]

    @tf.function(input_signature=specs)
    def serve(*args):
        outputs = model(list(args), training=False)
        return {name: tf.identity(outputs[name]) for name in result.output_names.values()}

    return serve


def save_saved_model(result: BuildResult, folder: str) -> None:
    serve = serving_function(result)
    tf.saved_model.save(result.model, folder, signatures={"serving_default": serve})
