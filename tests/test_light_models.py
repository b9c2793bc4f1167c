"""The onnx package's light models (random weights) convert, match onnxruntime through the
TF model and the float32 TFLite, and contain no TRANSPOSE (channel shuffles included)."""

from __future__ import annotations

import os

import pytest

from harness import check_model, count_tflite_ops
from light_models import light_feeds, light_model_paths, randomized_light_model

PATHS = light_model_paths()


def test_light_models_present():
    assert len(PATHS) == 9, PATHS


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=[os.path.basename(p)[6:-5] for p in PATHS])
def test_light_model(path):
    model = randomized_light_model(path)
    converted = check_model(model, light_feeds(model))
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == 0
