"""The 'light' models shipped inside the onnx package, with real weights restored.

They ship their weights as ConstantOfShape nodes filling zeros (to stay small). We replace
each with a seeded random initializer of a sensible scale for its role (He-scaled conv and
FC weights, BatchNorm statistics near identity), so the networks compute non-trivial values.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_model_paths() -> list[str]:
    return sorted(glob.glob(os.path.join(LIGHT_DIR, "light_*.onnx")))


def _random_for(role: tuple[str, int] | None, shape, rng) -> np.ndarray:
    op, index = role or ("", -1)
    if op in ("Conv", "Gemm") and index == 1:
        fan_in = int(np.prod(shape[1:])) if op == "Conv" else int(shape[-1])
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
    if op == "BatchNormalization":
        if index in (1, 4):  # scale, variance
            return rng.uniform(0.5, 1.5, shape)
        return rng.standard_normal(shape) * 0.1
    return rng.standard_normal(shape) * 0.05


def randomized_light_model(path: str, seed: int = 0) -> onnx.ModelProto:
    model = onnx.load(path)
    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, (node.op_type, index))
    new_inits, kept = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = [int(d) for d in inits[node.input[0]]]
            value = _random_for(consumers.get(node.output[0]), shape, rng).astype(np.float32)
            new_inits.append(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(new_inits)
    used = {i for n in graph.node for i in n.input}
    constant = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name in used and i.name not in constant]
    del graph.input[:]
    graph.input.extend(inputs)
    keep_inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
    model.ir_version = max(model.ir_version, 4)  # initializers need not be graph inputs
    return model


def light_feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name not in inits:
            shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
