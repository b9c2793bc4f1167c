"""How a quantized file is judged against the float model: one place for every figure the
quantization report shows and every choice it makes.

Per output, over a named set of samples:
- `cosine_pooled`: the cosine of all samples' outputs concatenated, and `sqnr_db`, the
  signal-to-quantization-noise ratio over the same values. Pooled figures weigh each sample
  by its signal, so a sample whose float output is (near-)empty (a detector that finds
  nothing) neither counts as a perfect 1 nor as a failing 0.
- `cosine` / `cosine_min` / `cosine_per_sample`: the per-sample cosines of the samples
  whose float output is not empty; `empty_samples` counts the others (below EMPTY_FRACTION
  of the largest |value| any sample has on that output).
- `top1_agreement` for classifier-shaped outputs (rank 2, last dim >= 2), `iou` of the maps
  thresholded at 0.5 for probability maps (rank >= 3, values in [0, 1]).

`figure(metrics)` is the one number a file is ranked by: the lowest pooled cosine over its
outputs. `gain(new, old)` says whether `new` beats `old` on the same samples by more than
the noise of the comparison (the spread of the per-sample differences), so that a choice
made on a handful of samples is kept only when it is real.
"""

from __future__ import annotations

import numpy as np

EMPTY_FRACTION = 1e-3  # of an output's largest |value| over the samples: an "empty" sample
MAP_THRESHOLD = 0.5  # probability maps are compared as the masks above this
NOISE_SIGMAS = 2.0  # a gain must exceed this many standard errors of the paired differences


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / norms)


def sqnr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    """10 log10(signal power / error power); inf when exact."""
    reference = reference.astype(np.float64)
    noise = float(np.sum((actual.astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference ** 2))
    if noise == 0:
        return float("inf")
    return 10.0 * np.log10(signal / noise) if signal > 0 else float("-inf")


def empty_samples(references: list[np.ndarray]) -> list[bool]:
    """Which samples' float outputs are (near-)empty next to the others'."""
    peaks = [float(np.abs(r).max(initial=0.0)) for r in references]
    top = max(peaks, default=0.0)
    return [p <= EMPTY_FRACTION * top for p in peaks]


def compare_output(references: list[np.ndarray], actuals: list[np.ndarray]) -> dict:
    """The figures of one output over paired samples (see the module docstring)."""
    ref = np.concatenate([r.astype(np.float64).ravel() for r in references])
    act = np.concatenate([a.astype(np.float64).ravel() for a in actuals])
    empty = empty_samples(references)
    kept = [(r, a) for r, a, e in zip(references, actuals, empty) if not e] or list(
        zip(references, actuals))
    cosines = [cosine(a, r) for r, a in kept]
    entry = {
        "cosine_pooled": round(cosine(act, ref), 6),
        "sqnr_db": round(sqnr_db(ref, act), 2),
        "cosine": float(np.mean(cosines)),
        "cosine_min": float(np.min(cosines)),
        "cosine_per_sample": [round(float(c), 6) for c in cosines],
        "empty_samples": int(sum(empty)),
        "max_abs_error": float(np.abs(act - ref).max(initial=0.0)),
    }
    first = references[0]
    if first.ndim == 2 and first.shape[-1] >= 2:
        agree = [np.argmax(a, -1) == np.argmax(r, -1) for r, a in zip(references, actuals)]
        entry["top1_agreement"] = float(np.mean(np.concatenate(agree)))
    elif first.ndim >= 3 and ref.size and ref.min() >= 0 and ref.max() <= 1 and ref.max() > 0:
        mask_ref, mask_act = ref > MAP_THRESHOLD, act > MAP_THRESHOLD
        union = int(np.sum(mask_ref | mask_act))
        entry["iou"] = round(float(np.sum(mask_ref & mask_act) / union), 6) if union else 1.0
    return entry


def compare_outputs(reference: list[dict], actual: list[dict]) -> dict[str, dict]:
    """{output name: figures} for paired per-sample outputs {name: array}."""
    return {name: compare_output([r[name] for r in reference], [a[name] for a in actual])
            for name in reference[0]}


def figure(metrics: dict[str, dict]) -> float:
    """The number a file is ranked by: its lowest pooled cosine over the outputs."""
    return min(m["cosine_pooled"] for m in metrics.values())


def gain(new: dict[str, dict], old: dict[str, dict]) -> tuple[bool, float, float]:
    """(whether `new` beats `old` beyond noise, the gain in `figure`, the noise): both
    measured on the same samples; the noise is NOISE_SIGMAS standard errors of the per-sample
    cosine differences on the output that decides `figure`."""
    worst = min(old, key=lambda name: old[name]["cosine_pooled"])
    delta = figure(new) - figure(old)
    diffs = np.subtract(new[worst]["cosine_per_sample"], old[worst]["cosine_per_sample"])
    noise = NOISE_SIGMAS * float(np.std(diffs, ddof=1) / np.sqrt(len(diffs))) if (
        len(diffs) > 1) else abs(delta)
    return delta > noise, float(delta), noise
