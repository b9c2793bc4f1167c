"""`<stem>_io_layout.json`: how each model input and output relates to its ONNX original."""

from __future__ import annotations

import json

import numpy as np

from onnx2tf_alt import perms as P
from onnx2tf_alt.builder import BuildResult
from onnx2tf_alt.graph import Graph


def io_layout(result: BuildResult, graph: Graph) -> dict:
    def entry(onnx_name: str, tf_name: str, perm) -> dict:
        shape = graph.shapes.get(onnx_name) or ()
        dtype = graph.dtypes.get(onnx_name)
        return {
            "onnx_name": onnx_name,
            "tf_name": tf_name,
            "onnx_shape": list(shape),
            "shape": list(P.physical_shape(shape, perm)) if len(shape) == len(perm) else [],
            "dtype": np.dtype(dtype).name if dtype is not None else None,
            "perm": list(perm),
        }

    return {
        "perm_meaning": "physical axis i of the TF/TFLite tensor holds ONNX axis perm[i]",
        "inputs": [entry(n, result.input_names[n], result.input_perms[n]) for n in graph.inputs],
        "outputs": [
            entry(n, key, result.output_perms[n])
            for n, key in zip(graph.outputs, result.output_keys)
        ],
    }


def save_io_layout(result: BuildResult, graph: Graph, path: str) -> None:
    with open(path, "w") as f:
        json.dump(io_layout(result, graph), f, indent=2)
