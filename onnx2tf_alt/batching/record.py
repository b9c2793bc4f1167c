"""One line of batch_results.jsonl: how a model's conversion ended and what it produced."""

from __future__ import annotations

import json
import os

from onnx2tf_alt.batching.source import Job
from onnx2tf_alt.batching.tflite_ops import tflite_op_counts
from onnx2tf_alt.export.manifest import reports_folder

_ERROR_TAIL_CHARS = 600


def stem_of(job: Job) -> str:
    return os.path.splitext(os.path.basename(job.path))[0]


def make_record(job: Job, child: dict, folder: str, log_path: str, base: dict) -> dict:
    """The record of `job` after its child ended as `child` (worker.ChildResult)."""
    record = {**base, "exit_code": child["exit_code"], "wall_s": child["wall_s"],
              "peak_rss_mb": child["peak_rss_mb"], "resumed": False}
    actual = _actual_outcome(child)
    if actual == "ok":
        record.update(outputs(folder, stem_of(job)), **(child.get("latency") or {}))
        if record.get("check") and not record["check"]["passed"]:
            actual, record["error_kind"] = "failed", "accuracy check failed"
    elif actual == "failed" and _crash(folder, stem_of(job)) is not None:
        # the CLI's supervisor caught a native crash (cli/supervisor.py): exit 1 and a report
        actual, crash = "crashed", _crash(folder, stem_of(job))
        record["error_kind"] = (f"crashed in native code ({crash.get('signal')}) during "
                                f"'{crash.get('phase')}'")
        record["error"] = _log_tail(log_path)
    elif actual == "failed":
        record["error_kind"], record["error"] = _failure(folder, stem_of(job), log_path,
                                                       child["exit_code"])
    else:
        record["error_kind"] = _stopped_kind(child, actual)
        record["error"] = _log_tail(log_path)
    return finish(record, actual, job.expect)


def finish(record: dict, actual: str, expect: str) -> dict:
    """Set the outcome: `actual`, or expected-failure when a known failure happened again."""
    record["actual"] = actual
    record["expect"] = expect
    record["as_expected"] = actual == expect
    record["outcome"] = "expected-failure" if actual == expect != "ok" else actual
    return record


def outputs(folder: str, stem: str) -> dict:
    """Op census of the float32 .tflite, sizes of the top-level files, the check's verdict."""
    found: dict = {"sizes": {}}
    if not os.path.isdir(folder):  # e.g. a Ray node that does not share OUT_ROOT
        return found
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isfile(path) and not entry.endswith((".json", ".html")):
            found["sizes"][entry] = os.path.getsize(path)
    tflite = os.path.join(folder, f"{stem}_float32.tflite")
    if os.path.isfile(tflite):
        ops = tflite_op_counts(tflite)
        found.update(tflite_ops=ops, op_count=sum(ops.values()), transposes=ops.get("TRANSPOSE", 0))
    check = _check_verdict(os.path.join(folder, f"{stem}_accuracy_report.json"))
    if check is not None:
        found["check"] = check
    return found


def _actual_outcome(child: dict) -> str:
    if child["stopped_for"]:
        return child["stopped_for"]
    code = child["exit_code"]
    if code == 0:
        return "ok"
    return "failed" if code in (1, 2) else "crashed"  # signals, 128+N: not a verdict


def _check_verdict(path: str) -> dict | None:
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    errors = [v.get("max_abs_err") for b in report.get("backends", {}).values()
              for v in b.get("values", [])]
    errors = [e for e in errors if isinstance(e, (int, float))]
    return {"passed": bool(report.get("passed")), "max_abs_err": max(errors, default=None)}


def _failure(folder: str, stem: str, log_path: str, exit_code: int) -> tuple[str, str]:
    tail = _log_tail(log_path)
    failures = _failures(os.path.join(folder, reports_folder(stem)))
    if not failures:
        return ("input error" if exit_code == 2 else _internal_kind(tail)), tail
    reasons = sorted({str(f.get("reason", "")).split(":")[0] or "failed" for f in failures})
    ops = sorted({f"{f.get('domain') or 'ai.onnx'}::{f.get('op_type')}" for f in failures})
    return f"{', '.join(reasons)} ({', '.join(ops)})", tail


def _crash(folder: str, stem: str) -> dict | None:
    """The crash a supervised run recorded in its failure report, if any."""
    try:
        with open(os.path.join(folder, reports_folder(stem), "conversion_errors.json")) as f:
            crash = json.load(f).get("crash")
    except (OSError, ValueError, AttributeError):
        return None
    return crash if isinstance(crash, dict) else None


def _failures(reports: str) -> list | None:
    """The failures a conversion_errors.json in `reports` lists; None without one."""
    try:
        with open(os.path.join(reports, "conversion_errors.json")) as f:
            failures = json.load(f)["failures"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return failures if isinstance(failures, list) and failures else None


def _internal_kind(tail: str) -> str:
    # "error: internal error (TypeError: ...)" -> "internal error (TypeError)"
    marker = "internal error ("
    if marker in tail:
        return f"internal error ({tail.split(marker, 1)[1].split(':', 1)[0]})"
    return "conversion error"


def _stopped_kind(child: dict, actual: str) -> str:
    if actual == "timeout":
        return "timed out"
    if actual == "memory":
        return "over the memory cap"
    code = child["exit_code"]
    if child.get("lost"):
        return child["lost"]
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _log_tail(log_path: str) -> str:
    """The child's last words: from its first "error:" line on, or the end of its log."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    start = text.find("error:")
    text = text[start:] if start >= 0 else text
    return text.strip()[-_ERROR_TAIL_CHARS:]
