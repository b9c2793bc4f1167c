"""The activation-range methods of the INT8 files (`--calibration_method`), in one table.

A method's ranges are measured by one of two measurers:
- TFLITE_GRAPH (ranges.py): every activation of the calibrated flatbuffer is measured again
  over the calibration samples, its min-max range clipped by the row's `algorithm`;
- ONNXRUNTIME (ort.py): onnxruntime's calibrator `algorithm` measures the ONNX graph; its
  ranges become FakeQuantize nodes, and the flatbuffer's remaining ranges are MINMAX ones.
`auto` measures each of AUTO_CANDIDATES and keeps the one whose INT8 file is closest to the
float model (quant/quantize.py). The command line's choices and help (cli/args.py, hence
docs/cli_flags.md), both measurers and the quantizer read METHODS: a new method is one row.
"""

from __future__ import annotations

from dataclasses import dataclass

TFLITE_GRAPH = "tflite_graph"
ONNXRUNTIME = "onnxruntime"

# TFLITE_GRAPH algorithms (ranges.py)
MINMAX, PERCENTILE, MSE = "minmax", "percentile", "mse"
AUTO_METHOD = "auto"
AUTO_CANDIDATES = (MINMAX, PERCENTILE, MSE)  # in this order in auto's note; ties: the first
AUTO_SAMPLES = 16  # calibration samples "auto" scores each candidate's INT8 file on, at most
AUTO_FOLDS = 4  # with fewer than 8 samples, "auto" scores fold by fold (ranges from the others)
DEFAULT_METHOD = AUTO_METHOD


@dataclass(frozen=True)
class RangeMethod:
    """One --calibration_method."""

    name: str
    measurer: str  # TFLITE_GRAPH or ONNXRUNTIME
    # TFLITE_GRAPH: MINMAX, PERCENTILE, MSE (or AUTO_METHOD: the best of AUTO_CANDIDATES);
    # ONNXRUNTIME: the member of onnxruntime's CalibrationMethod
    algorithm: str
    description: str  # one line of --help (and so of docs/cli_flags.md)
    tail: float | None = None  # PERCENTILE: the share of values clipped at each end, at most
    percentile: float | None = None  # onnxruntime's Percentile: the central percent kept


_TAIL = 2.5e-5
_ORT_PERCENTILE = 99.999

METHODS = (
    RangeMethod(AUTO_METHOD, TFLITE_GRAPH, AUTO_METHOD,
                f"the one of {', '.join(AUTO_CANDIDATES)} whose INT8 file is closest to the "
                "float model on the calibration samples"),
    RangeMethod(PERCENTILE, TFLITE_GRAPH, PERCENTILE,
                f"min-max without the {_TAIL:.4%} most extreme values at each end", tail=_TAIL),
    RangeMethod(MSE, TFLITE_GRAPH, MSE, "the range of least 8-bit quantization error"),
    RangeMethod(MINMAX, TFLITE_GRAPH, MINMAX, "the lowest and the highest value"),
    RangeMethod("tf", TFLITE_GRAPH, MINMAX, "the older name of minmax"),
    RangeMethod("entropy", ONNXRUNTIME, "Entropy",
                "the range of least KL divergence between the quantized and the float histograms"),
    RangeMethod("ort_minmax", ONNXRUNTIME, "MinMax", "the lowest and the highest value"),
    RangeMethod("ort_percentile", ONNXRUNTIME, "Percentile",
                f"the central {_ORT_PERCENTILE:g}% of the values", percentile=_ORT_PERCENTILE),
)
BY_NAME = {m.name: m for m in METHODS}
NAMES = tuple(BY_NAME)
