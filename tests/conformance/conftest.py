"""Per-op-type and overall counts of the node suite, printed at the end of the run."""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

OUTCOMES = ("pass", "xfail", "excluded", "fail")
_results: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.skipped):
        props = dict(report.user_properties)
        if "op_type" in props:
            _results.append(props)


def summarize(results: list[dict]) -> list[str]:
    per_op: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    totals = {b: Counter() for b in ("tf", "tflite")}
    for props in results:
        for backend in ("tf", "tflite"):
            outcome = props.get(backend)
            if outcome:
                per_op[props["op_type"]][backend][outcome] += 1
                totals[backend][outcome] += 1
    lines = ["op type | TF pass/xfail/excluded/fail | TFLite pass/xfail/excluded/fail"]
    for op in sorted(per_op):
        cells = ["/".join(str(per_op[op][b][o]) for o in OUTCOMES) for b in ("tf", "tflite")]
        lines.append(f"{op} | {cells[0]} | {cells[1]}")
    for backend in ("tf", "tflite"):
        t = totals[backend]
        counted = t["pass"] + t["xfail"] + t["fail"]
        rate = 100.0 * t["pass"] / counted if counted else 0.0
        lines.append(
            f"TOTAL {backend}: pass {t['pass']}, expected-fail {t['xfail']}, excluded "
            f"{t['excluded']}, fail {t['fail']}; pass rate {rate:.1f}% of {counted} counted"
        )
    return lines


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    terminalreporter.section("ONNX node suite")
    for line in summarize(_results):
        terminalreporter.write_line(line)
