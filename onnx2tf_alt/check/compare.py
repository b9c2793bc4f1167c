"""Elementwise comparison of converted values with onnxruntime's, and the report's data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

PASS, FAIL, UNOBSERVED = "pass", "fail", "unobserved"
REL_FLOOR = 1e-12  # |ref| below this counts as this in the relative error


@dataclass
class ValueCheck:
    """One ONNX value compared in one runtime."""

    node_name: str
    op_type: str
    output_name: str
    shape: list  # the ONNX reference's shape
    status: str  # PASS, FAIL or UNOBSERVED
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    cosine: float | None = None
    note: str = ""


@dataclass
class BackendReport:
    """All values compared in one runtime ("tf" or "tflite"), in topological order."""

    backend: str
    checks: list[ValueCheck] = field(default_factory=list)
    error: str = ""  # why nothing could be observed, when that is the case
    criterion: str = ""  # how float values pass, when not by the report's atol/rtol

    @property
    def first_divergence(self) -> ValueCheck | None:
        return next((c for c in self.checks if c.status == FAIL), None)

    @property
    def unobserved(self) -> list[ValueCheck]:
        return [c for c in self.checks if c.status == UNOBSERVED]

    @property
    def passed(self) -> bool:
        """No value failed (unobserved ones, e.g. when `error` is set, do not fail)."""
        return all(c.status != FAIL for c in self.checks)

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "backend": self.backend,
            "passed": self.passed,
            "error": self.error,
            "criterion": self.criterion,
            "first_divergence": None if first is None else asdict(first),
            "counts": {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, UNOBSERVED)},
            "values": [asdict(c) for c in self.checks],
        }


@dataclass
class AccuracyReport:
    """What `-coto` / `-cotof` found: one BackendReport per runtime compared with ONNX.

    `passed` is True when no value failed in any runtime (unobserved values do not fail)
    and the reference ran.
    """

    model: str
    full: bool
    atol: float
    rtol: float
    inputs: dict  # name -> {"shape", "dtype", "source": "random" | "file"}
    seed: int
    backends: dict[str, BackendReport] = field(default_factory=dict)
    error: str = ""  # set when the reference itself could not run

    @property
    def passed(self) -> bool:
        return not self.error and all(b.passed for b in self.backends.values())

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "mode": "all values" if self.full else "model outputs",
            "rule": "|converted - onnx| <= atol + rtol * |onnx| elementwise; shapes equal; "
            "integers and bools exact",
            "atol": self.atol,
            "rtol": self.rtol,
            "seed": self.seed,
            "inputs": self.inputs,
            "passed": self.passed,
            "error": self.error,
            "backends": {k: b.to_dict() for k, b in self.backends.items()},
        }


def compare(
    target, reference: np.ndarray, actual: np.ndarray | None, atol: float, rtol: float,
    missing_reason: str = "", min_cosine: float | None = None,
) -> ValueCheck:
    """Compare one value; `actual` None means the runtime could not observe it. With
    `min_cosine` (quantized models), float values pass on cosine similarity instead of
    atol/rtol; integer and bool values stay exact."""
    ref = np.asarray(reference)
    check = ValueCheck(target.node_name, target.op_type, target.onnx_name, list(ref.shape), PASS)
    if actual is None:
        check.status, check.note = UNOBSERVED, missing_reason
        return check
    got = np.asarray(actual)
    if got.shape != ref.shape:
        check.status = FAIL
        check.note = f"shape {list(got.shape)} != ONNX {list(ref.shape)}"
        return check
    exact = ref.dtype.kind in "biu" or got.dtype.kind in "biu"
    if exact and ref.dtype.kind != got.dtype.kind:
        check.note = f"dtype {got.dtype} vs ONNX {ref.dtype}"
    err, ok = _errors(ref, got, 0.0 if exact else atol, 0.0 if exact else rtol)
    check.max_abs_err = _finite_or_none(err.max()) if err.size else 0.0
    rel = err / np.maximum(np.abs(ref.astype(np.float64)), REL_FLOOR) if err.size else err
    check.max_rel_err = _finite_or_none(np.nan_to_num(rel, nan=0.0).max()) if err.size else 0.0
    check.cosine = _cosine(ref, got)
    if min_cosine is not None and not exact:
        ok = check.cosine is not None and check.cosine >= min_cosine
    if not ok:
        check.status = FAIL
        if check.max_abs_err is None:
            check.note = check.note or "non-finite values differ"
    return check


def _errors(ref: np.ndarray, got: np.ndarray, atol: float, rtol: float):
    """Elementwise |got - ref| (NaN against NaN and equal infinities count as 0) and whether
    every element is within atol + rtol * |ref|."""
    a, b = got.astype(np.float64), ref.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - b))
    err = np.where(np.isnan(err), np.inf, err)
    ok = bool(np.all(err <= atol + rtol * np.abs(np.where(np.isfinite(b), b, 0.0))))
    return err, ok


def _cosine(ref: np.ndarray, got: np.ndarray) -> float | None:
    a = got.astype(np.float64).ravel()
    b = ref.astype(np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None
