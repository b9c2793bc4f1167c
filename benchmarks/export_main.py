"""The command line the export scripts share: `OUT_DIR [NAME ...]` (default: all of theirs);
-h, or no OUT_DIR, prints the script's usage."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable


def run(doc: str, export: Callable[[str, str], str], names: Iterable[str],
        keep_going: bool = False) -> None:
    """Export each model named on the command line (else `names`) into OUT_DIR, printing
    each path; with `keep_going`, a failing export is said on stderr and the rest go on."""
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(doc)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name in sys.argv[2:] or list(names):
        try:
            print(export(name, out_dir), flush=True)
        except Exception as exc:
            if not keep_going:
                raise
            print(f"{name}: export failed: {str(exc).strip().splitlines()[-1][:200]}",
                  file=sys.stderr, flush=True)
