"""onnx2tf_alt: ONNX to TensorFlow / TFLite / Keras with layouts planned, not guessed.

The public functions are those of onnx2tf_alt/api.py; they load their modules when called.
"""

from onnx2tf_alt.check import check  # import-light; loads the checker when called
from onnx2tf_alt.translate.recursion import deep_graphs  # import-light (sys, contextlib)
from onnx2tf_alt.version import __version__


def convert(*args, **kwargs):
    """Convert an ONNX model; see `onnx2tf_alt.conversion.convert` for the keyword arguments."""
    from onnx2tf_alt.api import convert as _convert

    return _convert(*args, **kwargs)


def batch(*args, **kwargs):
    """Convert many models, each in its own process; see `onnx2tf_alt.batching.batch`."""
    from onnx2tf_alt.api import batch as _batch

    return _batch(*args, **kwargs)


def custom_objects() -> dict:
    """The custom Keras layers converted models may contain, for tf_keras.models.load_model:

    `tf_keras.models.load_model("model.keras", custom_objects=onnx2tf_alt.custom_objects())`
    """
    from onnx2tf_alt.api import custom_objects as _custom_objects

    return _custom_objects()


__all__ = ["__version__", "batch", "check", "convert", "custom_objects", "deep_graphs"]
