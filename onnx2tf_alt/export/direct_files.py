"""The direct writer's float32 .tflite (tflite/direct.py) and the float16 one made from it,
for one signature or several: a file packed in memory is written as it is; one past
direct.BOUND_BYTES of weights is written by its late_weights.Bound, each weight made from
its array as it goes (past 2 GB after the flatbuffer), and its float16 file likewise."""

from __future__ import annotations

from onnx2tf_alt.export.float16 import float16_from_float32, float16_model
from onnx2tf_alt.tflite.flatbuffer import unpack_model
from onnx2tf_alt.tflite.late_weights import mapped


def write_float32(result, path: str) -> tuple[object, object]:
    """Writes `result`'s (a DirectResult's) file at `path`; returns its content (bytes, or a
    map of the written file) and its unpacked model (None for a bound one: its buffers are
    its arrays)."""
    if result.bound is not None:
        result.bound.write(path)
        return mapped(path), None
    _write(path, result.content)
    return result.content, unpack_model(result.content)


def write_float16(result, content, model, path: str) -> None:
    """The float16 file of write_float32's (`content`, `model`, which this changes) at
    `path`; a file without float32 weights is the float32 one."""
    if result.bound is not None:
        float16_model(result.bound.model)  # in place: the float32 file is written already
        result.bound.write(path)
        return
    _write(path, float16_from_float32(content, model) or content)


def _write(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)
