"""Counts of the node suite per op type and overall, and the expectations-file writer.

The hooks live in tests/conftest.py (the pytest-xdist controller only loads that one) and
call into here with the user properties each node test records.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

OUTCOMES = ("pass", "xfail", "excluded", "fail")
BACKENDS = ("tf", "tflite", "direct")
BOTH = ("tf", "tflite")  # what `both` names in expectations.txt
EXPECTATIONS = os.path.join(os.path.dirname(__file__), "expectations.txt")
HEADER = (
    "# ONNX backend node tests expected to fail, one per line: <test name> <tf|tflite|both> "
    "<reason>\n# A listed test that passes fails the run: delete its line. Regenerate with\n"
    "# ONNX2TF_ALT_WRITE_EXPECTATIONS=1 python -m pytest -n 2 tests/conformance\n"
)


def summarize(results: list[dict]) -> list[str]:
    per_op: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    totals = {b: Counter() for b in BACKENDS}
    for props in results:
        for backend in BACKENDS:
            outcome = props.get(backend)
            if outcome:
                per_op[props["op_type"]][backend][outcome] += 1
                totals[backend][outcome] += 1
    lines = [("op type | TF pass/xfail/excluded/fail | TFLite pass/xfail/excluded/fail | "
              "direct TFLite pass/xfail/not covered/fail")]
    for op in sorted(per_op):
        cells = ["/".join(str(per_op[op][b][o]) for o in OUTCOMES) for b in BACKENDS]
        lines.append(f"{op} | " + " | ".join(cells))
    for backend in BACKENDS:
        t = totals[backend]
        counted = t["pass"] + t["xfail"] + t["fail"]
        rate = 100.0 * t["pass"] / counted if counted else 0.0
        lines.append(
            f"TOTAL {backend}: pass {t['pass']}, expected-fail {t['xfail']}, excluded "
            f"{t['excluded']}, fail {t['fail']}; pass rate {rate:.1f}% of {counted} counted"
        )
    return lines


def write_expectations(results: list[dict]) -> int:
    """Rewrite expectations.txt: failing tests listed with their current reason, fixed ones
    dropped; tests this run did not include (a -k selection) keep their lines. Returns the
    number of lines written."""
    from conformance.test_node_suite import read_expectations

    old = read_expectations()
    ran = {props.get("name") for props in results}
    entries: dict[str, dict[str, str]] = {}
    for (name, backend), reason in old.items():
        if name not in ran:
            entries.setdefault(name, {})[backend] = reason
    for props in results:
        name = props.get("name")
        for backend in BACKENDS:
            outcome = props.get(backend)
            reason = props.get(f"{backend}_reason")
            if outcome == "xfail":
                entries.setdefault(name, {})[backend] = reason or old[(name, backend)]
            elif outcome == "fail" and not props.get(f"{backend}_now_passes"):
                entries.setdefault(name, {})[backend] = reason or "fails"
    lines = []
    for name in sorted(entries):
        reasons = entries[name]
        if set(BOTH) <= set(reasons) and reasons["tf"] == reasons["tflite"]:
            lines.append(f"{name} both {reasons['tf']}")
            lines += [f"{name} direct {reasons['direct']}"] if "direct" in reasons else []
        else:
            lines += [f"{name} {b} {reasons[b]}" for b in BACKENDS if b in reasons]
    with open(EXPECTATIONS, "w") as f:
        f.write(HEADER + "".join(line + "\n" for line in lines))
    return len(lines)
