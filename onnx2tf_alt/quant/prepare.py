"""The models the calibrated quantized files are built from (the float files keep the
original model):

- INT16-activation files: the float model rewritten for quantization
  (onnx2tf_alt/passes/quant_rewrites.py, exact in float), then its Conv weights rounded with error
  feedback (quant/weight_rounding.py; after the rewrites, whose folds would move weights off
  TFLite's grid).
- INT8 files (per-channel weights): the channel ranges of each Conv -> [hard-swish] -> Conv
  chain equalized on the calibration samples, then the same rewrites (which fold the
  per-channel scales the equalization leaves into the next Conv)."""

from __future__ import annotations

import logging

import numpy as np
import onnx

from onnx2tf_alt.passes.quant_rewrites import (
    channel_peaks,
    equalizable_chains,
    equalize_channels,
    rewrite_for_quantization,
)
from onnx2tf_alt.quant.notes import Note
from onnx2tf_alt.quant.weight_rounding import round_conv_weights

log = logging.getLogger("onnx2tf_alt")

REWRITE_NAMES = {"affine_into_conv": "constant Mul/Add chain(s) folded into the next Conv",
                 "gated_residual": "gated residual(s) x + x*s factored to x*(1+s)"}


def prepare_for_quantization(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                             round_weights: bool = True) -> tuple[onnx.ModelProto, list[str]]:
    """(model for the calibrated quantized files, report notes on what changed); `model`
    itself when nothing did. `round_weights`: GPTQ for per-channel weights. A step that
    fails (e.g. an op onnxruntime lacks) is skipped with a note."""
    notes, counts, convs = [], {}, 0
    try:
        rewritten, counts = rewrite_for_quantization(model)
    except Exception as exc:  # noqa: BLE001 - an optimization: go on without it
        rewritten = model
        notes.append(f"INT16-activation files: no rewrites for quantization ({_short(exc)})")
    try:
        rounded, convs = round_conv_weights(rewritten, samples) if round_weights else (
            rewritten, 0)
    except Exception as exc:  # noqa: BLE001 - an optimization: nearest rounding then
        rounded = rewritten
        notes.append(f"INT16-activation files: Conv weights rounded to nearest, not by GPTQ "
                     f"({_short(exc)})")
    done = [f"{counts[k]} {REWRITE_NAMES[k]}" for k in REWRITE_NAMES if counts.get(k)]
    if done:
        notes.append(Note("INT16-activation files: built from the model rewritten for "
                          f"quantization (exact in float): {'; '.join(done)}",
                          f"INT16 files: rewritten for quantization: {'; '.join(done)}"))
    if convs:
        notes.append(Note(f"INT16-activation files: the weights of {convs} Conv(s) rounded to "
                          "the int8 grid with error feedback (GPTQ) on the calibration samples",
                          f"INT16 files: {convs} Conv weights rounded by GPTQ"))
    for note in notes:  # the quantization report's table shows them
        log.debug("%s", note)
    if not done and not convs:
        return model, notes
    return rounded, notes


def prepare_for_int8(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]
                     ) -> tuple[onnx.ModelProto, list[str]]:
    """(model for the per-channel INT8 files, report notes); `model` itself when no chain
    equalizes or a step fails (e.g. an op onnxruntime lacks)."""
    try:
        chains = equalizable_chains(model)
        peaks = channel_peaks(model, samples, [c.value for c in chains]) if chains else {}
        equalized, count = equalize_channels(model, peaks)
        if count:
            equalized, _ = rewrite_for_quantization(equalized)
    except Exception as exc:  # noqa: BLE001 - an optimization: go on without it
        note = f"INT8 files: channel ranges not equalized ({_short(exc)})"
        log.debug("%s", note)
        return model, [note]
    if not count:
        return model, []
    note = Note(f"INT8 files: built from the model with the channel ranges of {count} "
                "Conv -> [hard-swish] -> Conv chain(s) equalized (exact in float), then "
                "rewritten for quantization",
                f"INT8 files: {count} Conv chain(s) equalized")
    log.debug("%s", note)
    return equalized, [note]


def _short(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"
