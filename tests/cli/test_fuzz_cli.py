"""A bounded, seeded fuzz of the CLI: byte-flipped and truncated copies of the shipped model.

Every run must end with exit 0, 1 or 2, print no traceback, finish within its timeout, and
leave no temporary files; a failed run leaves no model files (exit 1 may leave reports/).
"""

from __future__ import annotations

import collections
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cli_runner import leftovers, run_cli

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")
FLIPPED, TRUNCATED = 24, (1, 100, 0.1, 0.33, 0.5, 0.9, -1)
SEED = 20261201


def variants() -> list[tuple[str, bytes]]:
    with open(SHIPPED, "rb") as f:
        data = f.read()
    rng = np.random.default_rng(SEED)
    found = []
    for i in range(FLIPPED):
        mutated = bytearray(data)
        for position in rng.integers(0, len(data), size=int(rng.integers(1, 9))):
            mutated[position] ^= int(rng.integers(1, 256))
        found.append((f"flip{i}", bytes(mutated)))
    for cut in TRUNCATED:
        size = cut if isinstance(cut, int) and cut > 0 else (
            len(data) + cut if isinstance(cut, int) else int(len(data) * cut))
        found.append((f"cut{size}", data[:size]))
    return found


def test_fuzzed_models_end_cleanly(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()

    def run(case):
        name, content = case
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(content)
        out = tmp_path / f"out_{name}"
        code, output = run_cli("-i", path, "-o", out, "-n", tmpdir=scratch, timeout=120)
        return name, code, output, out

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, variants()))
    counts = collections.Counter(code for _, code, _, _ in results)
    print(f"fuzz exit codes: {dict(sorted(counts.items()))}")
    for name, code, output, out in results:
        assert code in (0, 1, 2), (name, code, output)
        assert "Traceback" not in output, (name, output)
        if code == 2 or (code == 1 and not out.exists()):
            assert not out.exists() or os.listdir(out) == [], (name, os.listdir(out))
        elif code == 1:
            assert os.listdir(out) == ["reports"], (name, os.listdir(out))
    assert leftovers(tmp_path, scratch) == [] and os.listdir(scratch) == []
    assert counts[2] > 0 and len(results) == FLIPPED + len(TRUNCATED)


@pytest.mark.parametrize("size", [0, 1, 7])
def test_tiny_files(tmp_path, size):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(b"\x08" * size)
    code, output = run_cli("-i", path, "-o", tmp_path / "out")
    assert code == 2 and "Traceback" not in output, output
    assert not (tmp_path / "out").exists()
