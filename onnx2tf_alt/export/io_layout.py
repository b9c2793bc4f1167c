"""`<stem>_io_layout.json`: how each model input and output relates to its ONNX original."""

from __future__ import annotations

import json

import numpy as np

from onnx2tf_alt import perms as P
from onnx2tf_alt.builder import BuildResult
from onnx2tf_alt.graph import Graph


def io_layout(result: BuildResult, graph: Graph, onnx_names_in_tflite: bool = False) -> dict:
    """`tf_name` is the saved_model's signature key, `tflite_name` the .tflite files' (the
    ONNX name with -coion, see tflite_names.py)."""
    from onnx2tf_alt.export.tflite_names import tflite_keys

    tflite_inputs, tflite_outputs = tflite_keys(result, graph, onnx_names_in_tflite)

    def entry(onnx_name: str, tf_name: str, perm, tflite_name: str) -> dict:
        shape = graph.shapes.get(onnx_name) or ()
        dtype = graph.dtypes.get(onnx_name)
        return {
            "onnx_name": onnx_name,
            "tf_name": tf_name,
            "tflite_name": tflite_name,
            "onnx_shape": list(shape),
            "shape": list(P.physical_shape(shape, perm)) if len(shape) == len(perm) else [],
            "dtype": np.dtype(dtype).name if dtype is not None else None,
            "perm": list(perm),
        }

    return {
        "perm_meaning": "physical axis i of the TF/TFLite tensor holds ONNX axis perm[i]",
        "inputs": [
            entry(n, result.input_names[n], result.input_perms[n], tflite_inputs[n])
            for n in graph.inputs
        ],
        "outputs": [
            entry(n, key, result.output_perms[n], tflite_key)
            for n, key, tflite_key in zip(graph.outputs, result.output_keys, tflite_outputs)
        ],
    }


def save_io_layout(result: BuildResult, graph: Graph, path: str,
                   onnx_names_in_tflite: bool = False) -> None:
    with open(path, "w") as f:
        json.dump(io_layout(result, graph, onnx_names_in_tflite), f, indent=2)
