"""saved_model with a `serving_default` signature named after the ONNX inputs and outputs."""

from __future__ import annotations

import hashlib
import os

import tensorflow as tf

from onnx2tf_alt.tflite.lowering import serving_module
from onnx2tf_alt.translate.builder import BuildResult
from onnx2tf_alt.translate.node_layer import serving_weights


def save_saved_model(result: BuildResult, folder: str) -> None:
    """A saved_model with the `serving_default` signature, for tf.saved_model.load, TF
    Serving and the TF.js / CoreML converters (the Keras files are -oh5 / -okv3)."""
    holder = serving_module(result)
    tf.saved_model.save(holder, folder, signatures={"serving_default": holder.serve})
    if os.environ.get("SOURCE_DATE_EPOCH"):
        _content_uuid(os.path.join(folder, "fingerprint.pb"))


def save_signatures_saved_model(results: dict[str, BuildResult], folder: str) -> None:
    """A saved_model with one signature per entry of `results` ({key: the model built for
    it}). The models share their weight variables (translate/keras_layers.py's
    shared_constant_weights), so each weight is saved once."""
    from onnx2tf_alt.tflite.lowering import signature_function

    holder = tf.Module()
    weights = {}
    for result in results.values():
        weights.update({w.ref(): w for w in serving_weights(result.model)})
    holder.weights = list(weights.values())
    signatures = {}
    for key, result in results.items():
        serve = signature_function(result.model, list(result.input_names.values()), name=key)
        setattr(holder, f"signature_{len(signatures)}", serve)
        signatures[key] = serve
    tf.saved_model.save(holder, folder, signatures=signatures)
    if os.environ.get("SOURCE_DATE_EPOCH"):
        _content_uuid(os.path.join(folder, "fingerprint.pb"))


def _content_uuid(path: str) -> None:
    """Reproducible builds (SOURCE_DATE_EPOCH set): the fingerprint's random uuid becomes a
    digest of its content hashes, so equal models get byte-identical saved_models."""
    from tensorflow.core.protobuf import fingerprint_pb2

    if not os.path.isfile(path):
        return
    fingerprint = fingerprint_pb2.FingerprintDef()
    with open(path, "rb") as f:
        fingerprint.ParseFromString(f.read())
    fingerprint.uuid = ""
    digest = hashlib.sha256(fingerprint.SerializeToString(deterministic=True)).digest()
    fingerprint.uuid = str(int.from_bytes(digest[:16], "big"))
    with open(path, "wb") as f:
        f.write(fingerprint.SerializeToString(deterministic=True))
