"""How each TFLite builtin is quantized: TFLite's quantization spec as one table.

The own quantizer (quant/integer.py) reads a rule per builtin; a builtin without one stays
float in the quantized files, behind a DEQUANTIZE and before a QUANTIZE. A rule says which
inputs carry values (quantized with the activation grid), which input is a kernel
(symmetric int8 weights, per output channel on `axis`) and which its bias (int32, or int64
beside 16-bit activations, on the scale input x weight), and how the output's grid is
chosen:
- FREE: from the output's own calibrated range (the kernel rescales);
- SAME: the grid of its value inputs (the kernel moves or compares values: a reshape, a
  pool, a concatenation; TFLite's int8 kernels demand it). Its output's range is all such
  an op needs of an input (values outside it are dropped: a max pool's lows, what a
  minimum clips), but where the op `mixes` them (an average, an interpolation);
- FIXED: the grid the kernel was written for (a sigmoid's output is [0, 1) on 1/256 steps).
A kernel that exists for 8-bit activations only is `int16=False`: the INT16-activation
files keep it in float.
"""

from __future__ import annotations

from dataclasses import dataclass

FREE, SAME, FIXED, READS = "free", "same", "fixed", "reads"


@dataclass(frozen=True)
class Rule:
    """How one builtin is quantized (module docstring)."""

    output: str  # FREE, SAME, FIXED, or READS (integer outputs: only its inputs are quantized)
    values: tuple[int, ...] | None = None  # inputs that carry values; None: every float input
    kernel: int | None = None  # the input of constant weights, symmetric per channel
    axis: int = 0  # the kernel's output-channel axis
    bias: int | None = None  # the input of the kernel's bias
    fixed8: tuple[float, int] | None = None  # FIXED: (scale, zero point) of int8 outputs
    fixed16: tuple[float, int] | None = None  # FIXED: of int16 outputs
    int16: bool = True  # TFLite has a kernel for 16-bit activations
    mixes: bool = False  # SAME: the output mixes input values, whose whole range counts


_CONV = Rule(FREE, values=(0,), kernel=1, axis=0, bias=2)
_MOVE = Rule(SAME, values=(0,))

RULES: dict[str, Rule] = {
    "CONV_2D": _CONV,
    "DEPTHWISE_CONV_2D": Rule(FREE, values=(0,), kernel=1, axis=3, bias=2),
    "FULLY_CONNECTED": _CONV,
    "TRANSPOSE_CONV": Rule(FREE, values=(2,), kernel=1, axis=0, bias=3),
    "BATCH_MATMUL": Rule(FREE, int16=False),
    "ADD": Rule(FREE),
    "SUB": Rule(FREE),
    "MUL": Rule(FREE),
    "SQUARED_DIFFERENCE": Rule(FREE, int16=False),
    "MEAN": Rule(FREE, values=(0,)),
    "SUM": Rule(FREE, values=(0,)),
    "HARD_SWISH": Rule(FREE, int16=False),
    "LEAKY_RELU": Rule(FREE),
    "PRELU": Rule(FREE, int16=False),
    "RELU": Rule(FREE),
    "RELU6": Rule(FREE),
    "RELU_N1_TO_1": Rule(FREE),
    "RSQRT": Rule(FREE, int16=False),
    "SQRT": Rule(FREE, int16=False),
    "DIV": Rule(FREE, int16=False),  # quant/sensitivity.unsafe_divisions keeps some float
    "ABS": Rule(FREE),
    "EXP": Rule(FREE, int16=False),
    "ELU": Rule(FREE, int16=False),
    "GELU": Rule(FREE),
    "LOGISTIC": Rule(FIXED, fixed8=(1 / 256, -128), fixed16=(1 / 32768, 0)),
    "TANH": Rule(FIXED, fixed8=(1 / 128, 0), fixed16=(1 / 32768, 0)),
    "SOFTMAX": Rule(FIXED, fixed8=(1 / 256, -128), fixed16=(1 / 32768, 0)),
    "LOG_SOFTMAX": Rule(FIXED, fixed8=(16 / 256, 127), int16=False),
    "L2_NORMALIZATION": Rule(FIXED, fixed8=(1 / 128, 0), int16=False),
    "RESHAPE": _MOVE,
    "SQUEEZE": _MOVE,
    "EXPAND_DIMS": _MOVE,
    "TRANSPOSE": _MOVE,
    "SLICE": _MOVE,
    "STRIDED_SLICE": _MOVE,
    "GATHER": _MOVE,
    "GATHER_ND": _MOVE,
    "TILE": _MOVE,
    "BROADCAST_TO": _MOVE,
    "DEPTH_TO_SPACE": _MOVE,
    "SPACE_TO_DEPTH": _MOVE,
    "BATCH_TO_SPACE_ND": _MOVE,
    "SPACE_TO_BATCH_ND": _MOVE,
    "REVERSE_V2": _MOVE,
    "PAD": _MOVE,
    "PADV2": Rule(SAME, values=(0, 2), int16=False),
    "MIRROR_PAD": _MOVE,
    "MAX_POOL_2D": _MOVE,
    "AVERAGE_POOL_2D": Rule(SAME, values=(0,), mixes=True),
    "RESIZE_BILINEAR": Rule(SAME, values=(0,), mixes=True),
    "RESIZE_NEAREST_NEIGHBOR": _MOVE,
    "REDUCE_MAX": _MOVE,
    "REDUCE_MIN": _MOVE,
    "UNPACK": _MOVE,
    "SPLIT": Rule(SAME, values=(1,)),
    "SPLIT_V": _MOVE,
    "CONCATENATION": Rule(SAME),
    "PACK": Rule(SAME),
    "MAXIMUM": Rule(SAME),
    "MINIMUM": Rule(SAME),
    "SELECT_V2": Rule(SAME, values=(1, 2), int16=False),
    "TOPK_V2": Rule(SAME, values=(0,), int16=False),
    "ARG_MAX": Rule(READS, values=(0,)),
    "ARG_MIN": Rule(READS, values=(0,)),
}
