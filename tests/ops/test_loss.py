"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (ops/loss.py) against onnxruntime."""

import numpy as np
import pytest

from harness import Rng, check_node

rng = Rng(0)


LOSS_CASES = [
    ((3, 5), "mean", None, False), ((3, 5), "sum", None, True), ((3, 5), "none", None, True),
    ((2, 4, 3, 2), "mean", 1, True), ((2, 4, 3, 2), "none", 2, False),
    ((2, 4, 3), "mean", -1, False), ((2, 4, 3), "sum", 0, True),
]


def _loss_inputs(shape, ignore_index):
    target = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    if ignore_index is not None:
        target.flat[::3] = ignore_index
    return target


@pytest.mark.parametrize("shape, reduction, ignore_index, weighted", LOSS_CASES)
def test_negative_log_likelihood_loss(shape, reduction, ignore_index, weighted):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = {"x": rng.randn(*shape), "target": _loss_inputs(shape, ignore_index)}
    if weighted:
        inputs["weight"] = rng.random(shape[1]).astype(np.float32)
    check_node("NegativeLogLikelihoodLoss", inputs, attrs, opset=22)


@pytest.mark.parametrize("shape, reduction, ignore_index, weighted", LOSS_CASES)
def test_softmax_cross_entropy_loss(shape, reduction, ignore_index, weighted):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = {"x": 2 * rng.randn(*shape), "target": _loss_inputs(shape, ignore_index)}
    if weighted:
        inputs["weight"] = rng.random(shape[1]).astype(np.float32)
    check_node("SoftmaxCrossEntropyLoss", inputs, attrs, num_outputs=2, opset=13)
