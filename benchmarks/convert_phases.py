"""Convert a model with the CLI in a child process and report each phase's wall time and
memory, as the converter itself measures them at `-v debug` (onnx2tf_alt/logs.py `phase`
lines), with the child's whole-process wall time and peak RSS beside them.

    python benchmarks/convert_phases.py model.onnx OUT_DIR [CLI flags ...]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

PHASE = re.compile(r"phase (?P<name>.+?): (?P<wall>[\d.]+) s, peak (?P<peak>\d+) MB, "
                   r"after (?P<after>\d+) MB")


@dataclass
class Phases:
    """One conversion: exit code, wall seconds, peak RSS (MiB) and the phases in order."""

    code: int
    wall: float
    peak_mb: float
    phases: list[dict] = field(default_factory=list)
    error: str = ""

    def lines(self) -> list[str]:
        rows = [f"  {p['name']:<16} {p['wall']:8.2f} s  peak {p['peak']:6d} MB  "
                f"after {p['after']:6d} MB" for p in self.phases]
        whole = (f"  {'whole process':<16} {self.wall:8.2f} s  peak {self.peak_mb:6.0f} MB  "
                 f"exit {self.code}{'  ' + self.error if self.error else ''}")
        return [*rows, whole]


def convert_with_phases(model: str, out: str, *flags: str,
                        python: str = sys.executable) -> Phases:
    """Run `python -m onnx2tf_alt -i model -o out -v debug flags...` and parse its phases."""
    start = time.perf_counter()
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen([python, "-m", "onnx2tf_alt", "-i", model, "-o", out,
                                 "-v", "debug", *flags], stdout=null, stderr=subprocess.PIPE,
                                text=True, errors="replace")
        found, errors = [], []
        for line in proc.stderr:
            match = PHASE.search(line)
            if match:
                found.append({k: (v if k == "name" else float(v) if k == "wall" else int(v))
                              for k, v in match.groupdict().items()})
            elif line.startswith("error:"):
                errors.append(line.strip())
        _, status, usage = os.wait4(proc.pid, 0)
    return Phases(os.waitstatus_to_exitcode(status), time.perf_counter() - start,
                  usage.ru_maxrss / 1024, found, " ".join(errors)[:300])


if __name__ == "__main__":
    result = convert_with_phases(sys.argv[1], sys.argv[2], *sys.argv[3:])
    print("\n".join(result.lines()))
