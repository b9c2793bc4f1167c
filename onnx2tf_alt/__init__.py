"""onnx2tf_alt: ONNX to TensorFlow / TFLite / Keras with layouts planned, not guessed."""

from onnx2tf_alt.version import __version__


def convert(*args, **kwargs):
    """Convert an ONNX model; see `onnx2tf_alt.api.convert` for the keyword arguments."""
    from onnx2tf_alt.api import convert as _convert

    return _convert(*args, **kwargs)


__all__ = ["__version__", "convert"]
