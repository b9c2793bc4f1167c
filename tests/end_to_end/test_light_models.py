"""The onnx package's light models (random weights) convert, match onnxruntime through the
TF model and the float32 TFLite, and contain no TRANSPOSE and no GATHER, except one TRANSPOSE
per channel shuffle that no dense Conv can absorb."""

from __future__ import annotations

import os

import pytest

from harness import check_model, count_tflite_ops
from light_models import light_feeds, light_model_paths, randomized_light_model

PATHS = light_model_paths()
SHUFFLES = {"light_shufflenet.onnx": 16}


def test_light_models_present():
    assert len(PATHS) == 9, PATHS


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=[os.path.basename(p)[6:-5] for p in PATHS])
def test_light_model(path):
    model = randomized_light_model(path)
    converted = check_model(model, light_feeds(model))
    census = count_tflite_ops(converted.tflite)
    # light_shufflenet (v1) shuffles between grouped convs: its 16 shuffles stay RESHAPE +
    # TRANSPOSE + RESHAPE, which XNNPACK runs about twice as fast as one GATHER (measured on
    # conv -> shuffle -> conv and on shufflenet_v2_x0_5; see onnx2tf_alt/passes/shuffle.py).
    shuffles = SHUFFLES.get(os.path.basename(path), 0)
    assert census.get("TRANSPOSE", 0) == shuffles and "GATHER" not in census, census
