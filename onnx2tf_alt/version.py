"""What is installed: this package's version, and whether its TensorFlow extra is.

TensorFlow is an extra: `pip install "onnx2tf_alt[tf]"`.

Every .tflite file (float32 / float16, -odrqt, -oiqt, -oi4, --signature, --litertlm,
--target micro) is written by the project's own writer and quantizer without it (the
default flags never import it). It is needed for what TensorFlow itself is: the saved_model
(-osm), the
Keras files (-oh5, -okv3), the accuracy check of a Keras model (`onnx2tf_alt.check`,
`pipeline.build`), TF's converter (`--tflite_writer tf`, and a model
whose nodes the direct writer does not cover). Without it (0.23 GiB installed, against 2.16
GiB with it), a conversion writes the same .tflite files; a flag that asks for one of the
others is refused (exit 2), and a node only
TF's converter takes fails the conversion (exit 1), each naming this extra.
"""

from __future__ import annotations

import importlib.util

from onnx2tf_alt.errors import InputError

__version__ = "0.1.0"

INSTALL = 'pip install "onnx2tf_alt[tf]"'


def installed() -> bool:
    """Whether TensorFlow and tf-keras can be imported (without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("tensorflow", "tf_keras"))


def require(what: str) -> None:
    """InputError (exit 2) saying that `what` (flags or outputs) needs TensorFlow, when it
    is not installed."""
    if not installed():
        raise InputError(f"{what}: TensorFlow is needed and not installed: {INSTALL} (the "
                         ".tflite files need only the default install).")


def described_version() -> str:
    """What `onnx2tf-alt -V` prints: the version, and what the install writes."""
    tf = ("TensorFlow installed: every output" if installed() else
          f"TensorFlow not installed: the .tflite files; {INSTALL} for the others")
    return f"onnx2tf-alt {__version__} ({tf})"
