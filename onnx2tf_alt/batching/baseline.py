"""Regressions against a previous batch's results: newly failing, slower to convert, less
accurate, slower to run (TFLite against onnxruntime)."""

from __future__ import annotations

from dataclasses import dataclass

GOOD = ("ok", "expected-failure")


@dataclass
class Thresholds:
    """When a change counts as a regression."""

    time_ratio: float = 1.5  # wall time more than this many times the baseline's ...
    time_min_s: float = 2.0  # ... and more than this many seconds longer (children vary)
    error_ratio: float = 10.0  # check error more than this many times the baseline's ...
    error_min: float = 1e-5  # ... and above this absolute error
    latency_ratio: float = 1.25  # TFLite/onnxruntime ratio more than this many times the
    latency_min_ms: float = 0.1  # baseline's, and the TFLite run this many ms longer


def regressions(records: list[dict], baseline: list[dict], limits: Thresholds) -> list[dict]:
    """One {"name", "kind", "why"} per regression of `records` against `baseline` (matched
    by name; models new in this batch or gone from it are not regressions)."""
    before = {r.get("name"): r for r in baseline}
    found = []
    for record in records:
        old = before.get(record["name"])
        if old is not None:
            found += [{"name": record["name"], "kind": kind, "why": why}
                      for kind, why in _compare(record, old, limits)]
    return found


def _compare(new: dict, old: dict, limits: Thresholds) -> list[tuple[str, str]]:
    if old.get("outcome") in GOOD and new["outcome"] not in GOOD:
        return [("failing", f"was {old['outcome']}, now {new['outcome']}"
                 + (f" ({new['error_kind']})" if new.get("error_kind") else ""))]
    found = []
    if new["outcome"] == "ok" and old.get("outcome") == "ok" and not new.get("resumed"):
        t_new, t_old = new.get("wall_s"), old.get("wall_s")
        if _number(t_new) and _number(t_old) and t_new > t_old * limits.time_ratio \
                and t_new - t_old > limits.time_min_s:
            found.append(("slower", f"wall time {t_old:.1f} s -> {t_new:.1f} s"))
    e_new = (new.get("check") or {}).get("max_abs_err")
    e_old = (old.get("check") or {}).get("max_abs_err")
    if _number(e_new) and _number(e_old) and e_new > max(e_old * limits.error_ratio,
                                                         limits.error_min):
        found.append(("accuracy", f"max abs error {e_old:.3g} -> {e_new:.3g}"))
    if _slower_runtime(new, old, limits):
        ratios = f"{old['latency_ratio']:.2f} -> {new['latency_ratio']:.2f}"
        found.append(("latency", f"TFLite/onnxruntime latency ratio {ratios}"))
    return found


def _slower_runtime(new: dict, old: dict, limits: Thresholds) -> bool:
    # The ratio cancels a faster or busier machine; the floor in ms keeps the jitter of
    # tiny models' microsecond runs from counting.
    r_new, r_old = new.get("latency_ratio"), old.get("latency_ratio")
    ms_new = (new.get("latency_ms") or {}).get("tflite")
    ms_old = (old.get("latency_ms") or {}).get("tflite")
    return (_number(r_new) and _number(r_old) and r_new > r_old * limits.latency_ratio
            and _number(ms_new) and _number(ms_old) and ms_new - ms_old > limits.latency_min_ms)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
