"""Activation ranges of a calibrated flatbuffer, measured again without in-place ops.

TF's calibrator (the converter's calibrate-only step) runs the float model in an
interpreter that lets an elementwise op write its output over an input nobody else reads,
and it records each tensor's min and max after the op that reads it has run. An input
overwritten that way gets the reader's range. Every hard-swish written as x * relu6(x + 3)
shows it: the relu6 output, truly in [0, 6], is recorded with the product's range (up to
[-2, 650] on a PP-OCR detector), so its INT8 grid keeps a handful of the 256 levels. Here
each recorded tensor's range is measured again on the same samples in an interpreter that
keeps every tensor (`experimental_preserve_all_tensors`, which turns buffer sharing off),
and written back into the flatbuffer the MLIR quantizer reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import flatbuffers
import numpy as np

from onnx2tf_alt.tflite_names import FILE_IDENTIFIER, SIGNATURE

# Keeping every tensor costs their sum at once: about 420 MiB for a 640x640 PP-OCR detector
# (1.3 GB resident). Above this, TF's records are kept (calibrated_tflite warns).
MAX_KEPT_BYTES = 2 << 30


def _recorded(tensor) -> bool:
    q = tensor.quantization
    return q is not None and q.min is not None and len(q.min) == 1 and q.max is not None


def measured_ranges(content: bytes, feeds: Iterable[dict[str, np.ndarray]]) -> dict[int, tuple]:
    """{tensor index: (min, max)} over `feeds` (signature inputs, physical layout) of the
    finite values of every float tensor of the main subgraph that an op writes or the
    subgraph takes as input."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # Reference kernels: a delegate would hide the tensors inside its partitions.
    interpreter = Interpreter(
        model_content=content, experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    runner = interpreter.get_signature_runner(SIGNATURE)
    watched = sorted({t for op in interpreter._get_ops_details() for t in op["outputs"]}
                     | {d["index"] for d in interpreter.get_input_details()})
    ranges: dict[int, tuple] = {}
    for feed in feeds:
        runner(**feed)
        for index in watched:
            value = interpreter.get_tensor(index)
            if value.dtype != np.float32:
                continue
            value = value[np.isfinite(value)]  # a -inf attention mask has no range
            if value.size == 0:
                continue
            low, high = float(value.min()), float(value.max())
            if index in ranges:
                low, high = min(low, ranges[index][0]), max(high, ranges[index][1])
            ranges[index] = low, high
    return ranges


def remeasured(content: bytes, feeds: Iterable[dict[str, np.ndarray]]) -> tuple[bytes, int]:
    """(`content` with the recorded range of each tensor of its main subgraph replaced by
    the one measured on `feeds`, how many ranges changed by more than 1%). Tensors the
    interpreter cannot show (an op's intermediates, other subgraphs) keep their range.
    ValueError when keeping every tensor at once would take more than MAX_KEPT_BYTES."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    kept = _activation_bytes(model)
    if kept > MAX_KEPT_BYTES:
        raise ValueError(f"its tensors need {kept / 2**30:.1f} GiB at once, more than the "
                         f"{MAX_KEPT_BYTES / 2**30:.0f} GiB allowed")
    ranges = measured_ranges(content, feeds)
    changed = 0
    for index, tensor in enumerate(model.subgraphs[0].tensors):
        if index not in ranges or not _recorded(tensor):
            continue
        low, high = ranges[index]
        q = tensor.quantization
        old = float(q.max[0]) - float(q.min[0])
        changed += abs((high - low) - old) > 0.01 * max(old, 1e-12)
        q.min, q.max = [low], [high]
    builder = flatbuffers.Builder(len(content) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output()), changed


def _activation_bytes(model) -> int:
    """Bytes of the main subgraph's non-constant tensors, dynamic dims counted as 1."""
    constant = {i for i, b in enumerate(model.buffers) if b.data is not None and len(b.data)}
    return sum(4 * math.prod(int(d) for d in t.shape)
               for t in model.subgraphs[0].tensors
               if t.buffer not in constant and t.shape is not None)
