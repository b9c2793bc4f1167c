"""batch_results.jsonl and batch_summary.md."""

from __future__ import annotations

import json
import os

RESULTS, SUMMARY_MD, SUMMARY_HTML = "batch_results.jsonl", "batch_summary.md", "batch_summary.html"
ORDER = ("ok", "expected-failure", "failed", "timeout", "memory", "crashed")


def read_results(path: str) -> list[dict]:
    """The records of a results file; [] when there is none. Unreadable lines are skipped:
    a batch that was killed may have left half a line."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("name"), str):
            records.append(record)
    return records


class ResultsFile:
    """Appends each record as it arrives, so an interrupted batch keeps what it finished."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "w")  # noqa: SIM115 - open for the whole batch

    def add(self, record: dict) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self, records: list[dict]) -> None:
        """Rewrite the file with `records` in the batch's order."""
        self._file.close()
        with open(self.path, "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)


def outcome_counts(records: list[dict]) -> dict[str, int]:
    counts = {k: 0 for k in ORDER}
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {k: v for k, v in counts.items() if v}


def row(record: dict) -> dict:
    """The summary table's columns for one record."""
    check = record.get("check") or {}
    err = check.get("max_abs_err")
    return {
        "model": record["name"],
        "outcome": record["outcome"] + (" (resumed)" if record.get("resumed") else ""),
        "exit": record.get("exit_code", ""),
        "error": record.get("error_kind", ""),
        "wall s": _fixed(record.get("wall_s"), 1),
        "peak MB": record.get("peak_rss_mb", ""),
        "ops": record.get("op_count", ""),
        "TRANSPOSE": record.get("transposes", ""),
        "tflite KB": _tflite_kb(record),
        "check": "" if not check else ("pass" if check["passed"] else "FAIL")
        + ("" if err is None else f" {err:.2g}"),
        "TFLite/ORT": _fixed(record.get("latency_ratio"), 2)
        or ("n/a" if "latency_error" in record else ""),
    }


def _fixed(value, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else ""


def _tflite_kb(record: dict) -> str:
    sizes = record.get("sizes") or {}
    size = next((v for k, v in sizes.items() if k.endswith("_float32.tflite")), None)
    return "" if size is None else f"{size / 1024:.1f}"


def write_summary_md(folder: str, records: list[dict], regressions: list[dict],
                     wall_s: float) -> str:
    """batch_summary.md: counts, regressions, one table row per model."""
    counts = ", ".join(f"{k} {v}" for k, v in outcome_counts(records).items())
    lines = ["# Batch conversion summary", "",
             f"{len(records)} models in {wall_s:.1f} s: {counts}.", ""]
    if regressions:
        lines += ["## Regressions", ""] + [f"- {r['name']}: {r['why']}" for r in regressions]
        lines.append("")
    rows = [row(r) for r in records]
    header = list(rows[0]) if rows else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r.values()) + " |")
    path = os.path.join(folder, SUMMARY_MD)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
