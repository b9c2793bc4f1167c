"""OptionalHasElement and OptionalGetElement on tensors (ops/optional.py)."""

from onnx import helper

from harness import Rng, check_model, make_model

rng = Rng(0)


def test_optional_ops_on_tensors():
    """A plain tensor is a present optional: HasElement is true, GetElement returns it."""
    x = rng.randn(2, 3, 4)
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("OptionalGetElement", ["x"], ["got"]),
             helper.make_node("Relu", ["got"], ["y"])]
    model = make_model(nodes, {"x": x}, ["has", "y"], opset=18)
    check_model(model, {"x": x})
