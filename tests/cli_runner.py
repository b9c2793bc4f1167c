"""Run the real CLI in a subprocess and look at what it leaves behind."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys


def cli_env(tmpdir: str | None = None) -> dict:
    """The environment of a CLI run: quiet TF logs; temporary files in `tmpdir` if given."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if tmpdir is not None:  # where the run's temporary files would go, to look for leftovers
        env["TMPDIR"] = str(tmpdir)
    return env


def run_cli(*args, cwd=None, tmpdir=None, timeout=300) -> tuple[int, str]:
    """`python -m onnx2tf_alt *args` in a subprocess: (exit code, stdout + stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "onnx2tf_alt", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(tmpdir),
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def tree(folder) -> dict[str, str]:
    """Every file below `folder` (relative path -> sha256); {} when it does not exist."""
    found = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            found[os.path.relpath(path, folder).replace(os.sep, "/")] = digest
    return found


def manifest_files(folder, stem: str) -> set[str]:
    """The files a conversion's manifest lists, with the manifest itself."""
    with open(os.path.join(folder, f"{stem}_manifest.json")) as f:
        return set(json.load(f)["files"]) | {f"{stem}_manifest.json"}


def leftovers(*folders) -> list[str]:
    """Staging folders or temporary files of ours left in `folders`."""
    return [
        os.path.join(str(folder), name)
        for folder in folders
        if os.path.isdir(folder)
        for name in os.listdir(folder)
        if name.startswith((".onnx2tf_alt_", "onnx2tf_alt_"))
    ]
