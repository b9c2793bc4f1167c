"""The ONNX backend node test cases of the installed onnx package, loaded once and cached.

onnx generates these cases (a one-node model, input and expected output arrays, tolerances)
from its own operator definitions; building them takes ~15 s, so the result is pickled per
onnx version and reused by every pytest worker.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np
import onnx

CACHE_DIR = os.environ.get(
    "ONNX2TF_ALT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "onnx2tf_alt")
)


@dataclass
class NodeCase:
    name: str
    model_bytes: bytes
    inputs: list
    outputs: list
    rtol: float
    atol: float

    @property
    def model(self) -> onnx.ModelProto:
        return onnx.load_from_string(self.model_bytes)


def _collect() -> list[NodeCase]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    result = []
    for case in cases:
        if not case.data_sets:
            continue
        inputs, outputs = case.data_sets[0]
        result.append(
            NodeCase(
                name=case.name,
                model_bytes=case.model.SerializeToString(),
                inputs=list(inputs),
                outputs=list(outputs),
                rtol=case.rtol,
                atol=case.atol,
            )
        )
    return sorted(result, key=lambda c: c.name)


def load_cases() -> list[NodeCase]:
    path = os.path.join(CACHE_DIR, f"node_cases_onnx_{onnx.__version__}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    cases = _collect()
    os.makedirs(CACHE_DIR, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE_DIR)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(cases, f)
    os.replace(tmp, path)  # atomic: concurrent workers never read a partial file
    return cases
