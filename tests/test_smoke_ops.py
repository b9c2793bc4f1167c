import numpy as np
import pytest
from harness import check_node

rng = np.random.default_rng(0)


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 2, 1]])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_conv2d(pads, group):
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    w = rng.standard_normal((8, 4 // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal((8,)).astype(np.float32)
    check_node("Conv", {"x": x}, {"pads": pads, "group": group}, {"w": w, "b": b})


def test_add_broadcast():
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    check_node("Add", {"a": a, "b": b})
