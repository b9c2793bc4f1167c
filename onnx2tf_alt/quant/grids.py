"""Integer grids of the quantized files: value = scale * (code - zero point).

One place for the grids the own quantizer (quant/integer.py) gives tensors and for their
codes: asymmetric 8-bit grids with 0 on a code, symmetric 16-bit ones, uint8 codes 128
above int8's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

TT = schema.TensorType
IO_TYPES = {"float32": TT.FLOAT32, "int8": TT.INT8, "uint8": TT.UINT8, "int16": TT.INT16}
NUMPY = {TT.INT8: np.int8, TT.UINT8: np.uint8, TT.INT16: np.int16, TT.INT32: np.int32,
         TT.INT64: np.int64}
LIMITS = {TT.INT8: (-128, 127), TT.UINT8: (0, 255), TT.INT16: (-32767, 32767)}


# a constant past this many elements is quantized a block of leading rows at a time: its
# float temporaries (quotient, rounding, clipping: 3-4 times the weight) stay at a block's
# (a 2.3 GB model's 1 GiB weights took 2.3 GB more at once)
BLOCK_ELEMENTS = 1 << 24


def in_blocks(value: np.ndarray) -> bool:
    """Whether `value` is quantized a block of rows at a time (row_blocks)."""
    return value.ndim > 0 and len(value) > 1 and value.size > BLOCK_ELEMENTS


def row_blocks(value: np.ndarray):
    """Slices of `value`'s leading axis covering about BLOCK_ELEMENTS elements each."""
    step = max(1, BLOCK_ELEMENTS // max(1, value[0].size))
    for start in range(0, value.shape[0], step):
        yield slice(start, min(value.shape[0], start + step))


@dataclass(frozen=True)
class Grid:
    """An integer grid: value = scale * (code - zero_point)."""

    scale: float
    zero_point: int
    type: int  # schema.TensorType

    def params(self) -> schema.QuantizationParametersT:
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint = [float(self.scale)], [int(self.zero_point)]
        return q

    def codes(self, value: np.ndarray) -> np.ndarray:
        if in_blocks(value):
            out = np.empty(value.shape, NUMPY[self.type])
            for rows in row_blocks(value):
                out[rows] = self.codes(value[rows])
            return out
        low, high = LIMITS[self.type]
        return np.clip(np.round(value / self.scale) + self.zero_point, low, high).astype(
            NUMPY[self.type])

    def retyped(self, type_: int) -> Grid:
        """The same values on `type_` (uint8 codes sit 128 above int8's)."""
        shift = 128 if type_ == TT.UINT8 and self.type == TT.INT8 else 0
        return Grid(self.scale, self.zero_point + shift, type_)


def activation_grid(low: float, high: float, type_: int) -> Grid:
    """The grid of a tensor whose values span [low, high]: asymmetric 8-bit with 0 on a
    code, or symmetric 16-bit."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if type_ == TT.INT16:
        return Grid(max(-low, high) / 32767 or 1.0, 0, type_)
    qmin, qmax = LIMITS[type_]
    scale = (high - low) / (qmax - qmin)
    if scale <= 0 or not np.isfinite(scale):
        return Grid(1.0, qmin if low == 0 else 0, type_)
    return Grid(scale, int(np.clip(round(qmin - low / scale), qmin, qmax)), type_)


def centred_grid(low: float, high: float) -> Grid:
    """The int8 grid of [low, high] with its zero point at 0 (symmetric, [-127, 127]): the
    second operand of a BATCH_MATMUL, which XNNPACK takes only so (an attention's K and V:
    on TFLite's reference kernel the PP-OCRv4 recognizer's two took 0.15 ms of its 9.9)."""
    peak = max(-float(low), float(high), 0.0)
    return Grid(peak / 127 if peak > 0 and np.isfinite(peak) else 1.0, 0, TT.INT8)


def given_grid(tensor) -> Grid | None:
    """The 8-bit grid a float tensor of a file to quantize was given: a QDQ pair's
    (quant/qdq_grids.py); None for a calibrated range alone."""
    q = tensor.quantization
    if tensor.type != TT.FLOAT32 or q is None or q.scale is None or len(q.scale) != 1 or (
            q.zeroPoint is None or len(q.zeroPoint) != 1):
        return None
    return Grid(float(q.scale[0]), int(q.zeroPoint[0]), TT.INT8)


def fits(grid: Grid, span: tuple | None) -> bool:
    """Whether values over `span` fit on `grid` (within a step)."""
    if span is None:
        return True
    low, high = LIMITS[grid.type]
    return (span[0] >= grid.scale * (low - grid.zero_point - 1)
            and span[1] <= grid.scale * (high - grid.zero_point + 1))
