"""Room on Python's stack for deep Keras graphs.

tf_keras walks a functional model recursively, one Python frame per layer on the longest
path (building the Model, saving and loading .h5 / .keras files). Every TF op of a converted
node is a layer, so an unrolled recurrence (a 2-layer bidirectional GRU of 100 steps has
about 2,400 ops in a row) or a deep transformer goes past Python's default limit of 1,000
frames. Those walks are plain Python calls, which since Python 3.11 do not grow the C stack,
so a higher limit is safe for them.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

# Python frames a conversion may use: a chain of about 100,000 TF ops.
DEEP_GRAPH_FRAMES = 100_000


@contextmanager
def deep_graphs(frames: int = DEEP_GRAPH_FRAMES):
    """Raise the recursion limit to at least `frames` while the block (or the decorated
    function) runs; the previous limit comes back afterwards."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)
