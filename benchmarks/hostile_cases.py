"""Run the CLI on the hostile-but-realistic cases of tests/hostile.py and print one table row
per case: its exit code, the first line of its message, whether every pre-existing file
(inside and beside `-o`) kept its sha256 (the converted model's own earlier outputs aside),
and what staging or temporary files were left.

    python benchmarks/hostile_cases.py [WORK_DIR]

Each case gets a fresh folder under WORK_DIR (default: a temporary folder, removed after).
tests/export/test_hostile.py asserts the same cases; this prints them, e.g. to compare two
versions (run it with PYTHONPATH set to another checkout).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from hostile import CASES, play


def main(work: str) -> None:
    print("| case | exit (expected) | first line of the message | files changed | left behind |")
    print("|---|---|---|---|---|")
    for case in CASES:
        root = os.path.join(work, case.name)
        os.makedirs(root)
        try:
            outcome = play(case, root)
        except AssertionError as exc:  # a set-up run failed (another version)
            print(f"| {case.name} | set-up failed | {str(exc)[:100]} | | |", flush=True)
            continue
        first = outcome.first_line.replace("|", "/").replace(root, ".")[:120]
        mark = "" if outcome.code == case.code else " **"
        print(f"| {case.name} | {outcome.code} ({case.code}){mark} | {first} | "
              f"{len(outcome.changed) or 'none'} | {len(outcome.left) or 'none'} |", flush=True)


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hostile_")
    try:
        main(folder)
    finally:
        if len(sys.argv) <= 1:
            shutil.rmtree(folder, ignore_errors=True)
