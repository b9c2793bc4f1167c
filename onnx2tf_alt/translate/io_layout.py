"""`<stem>_io_layout.json`: how each model input and output relates to its ONNX original.

A `result` here is the builder's BuildResult or the direct writer's DirectResult
(tflite/direct.py, whose `model` is None): their names and perms.
"""

from __future__ import annotations

import json
import keyword
import re

import numpy as np

from onnx2tf_alt.ir.graph import Graph
from onnx2tf_alt.layout import perms as P


class SignatureIO:
    """Feeds and outputs between ONNX order and a converted model's signature, from its
    `input_names` / `output_names` (ONNX name -> key) and `input_perms` / `output_perms`."""

    def to_physical(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs by ONNX name in ONNX layout -> by signature name in the model's physical
        layout, in the model's input order."""
        return {key: P.to_physical_order(feeds[name], self.input_perms[name])
                for name, key in self.input_names.items()}

    def to_onnx(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by signature key in the physical layout -> by ONNX name in ONNX order
        (those `outputs` holds)."""
        return {name: P.to_onnx_order(outputs[key], self.output_perms[name])
                for name, key in self.output_names.items() if key in outputs}


def keras_name(onnx_name: str, taken: set[str]) -> str:
    """A valid, unique TF name for an ONNX value name."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", onnx_name) or "value"
    if not name[0].isalpha():
        name = "v_" + name
    if keyword.iskeyword(name):  # signature keys become Python keyword arguments
        name += "_"
    base, k = name, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def tflite_keys(result, graph: Graph, onnx_names: bool) -> tuple[dict, list]:
    """The .tflite signature keys: ({ONNX input name: key}, [key per graph output, in
    order]). With `onnx_names` a key is the ONNX name itself, except for an output listed
    twice, whose repeats keep their TF key (signature keys must be unique)."""
    inputs = {n: (n if onnx_names else result.input_names[n]) for n in graph.inputs}
    outputs, seen = [], set()
    for name, key in zip(graph.outputs, result.output_keys):
        outputs.append(name if onnx_names and name not in seen else key)
        seen.add(name)
    return inputs, outputs


def io_layout(result, graph: Graph, onnx_names_in_tflite: bool = False) -> dict:
    """`tf_name` is the saved_model's signature key, `tflite_name` the .tflite files' (the
    ONNX name with -coion, see tflite/names.py)."""
    tflite_inputs, tflite_outputs = tflite_keys(result, graph, onnx_names_in_tflite)

    def entry(onnx_name: str, tf_name: str, perm, tflite_name: str, output: bool) -> dict:
        shape = graph.shapes.get(onnx_name)
        shape = _known_shape(shape, result, tf_name, perm) if output else tuple(shape or ())
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
            entry(n, result.input_names[n], result.input_perms[n], tflite_inputs[n], False)
            for n in graph.inputs
        ],
        "outputs": [
            entry(n, key, result.output_perms[n], tflite_key, True)
            for n, key, tflite_key in zip(graph.outputs, result.output_keys, tflite_outputs)
        ],
    }


def _known_shape(onnx_shape, result, tf_name: str, perm) -> tuple:
    """The ONNX shape, with the dims inference left unknown taken from the static shape the
    TF model computes (declared shapes are only hints; see prepare.py)."""
    shape = tuple(onnx_shape or ())
    if onnx_shape is not None and None not in shape:
        return shape
    if result.model is None:
        return shape
    outputs = result.model.output
    tensor = outputs.get(tf_name) if isinstance(outputs, dict) else None
    if tensor is None or tensor.shape.rank is None or tensor.shape.rank != len(perm):
        return shape
    computed = P.logical_shape(tuple(tensor.shape), perm)
    if onnx_shape is None or len(shape) != len(computed):
        return tuple(computed)
    return tuple(c if d is None else d for d, c in zip(shape, computed))


def save_io_layout(result, graph: Graph, path: str,
                   onnx_names_in_tflite: bool = False) -> None:
    with open(path, "w") as f:
        json.dump(io_layout(result, graph, onnx_names_in_tflite), f, indent=2)
