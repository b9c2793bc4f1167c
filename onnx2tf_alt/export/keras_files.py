"""Keras .h5 and .keras (keras_v3) files; weights stay layer weights, configs stay small."""

from __future__ import annotations

from onnx2tf_alt.builder import BuildResult


def save_h5(result: BuildResult, path: str) -> None:
    result.model.save(path, save_format="h5")


def save_keras_v3(result: BuildResult, path: str) -> None:
    result.model.save(path, save_format="keras_v3")
