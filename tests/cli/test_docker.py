"""The Docker image, built and run: docker/build_and_check.sh builds it (with a locally built
base image, since Docker Hub is unreachable on these machines), converts the shipped model
with the image's CLI and with the pip-installed one, and compares the two output folders
(same files, bitwise-equal TFLite outputs). Takes a few minutes, so it is marked slow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "build_and_check.sh"


def _why_not_runnable() -> str | None:
    """Why the script cannot run on this machine, or None when it can."""
    missing = [tool for tool in ("docker", "dockerd") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install -y docker.io debootstrap)"
    if os.geteuid() != 0:
        return "needs root to start dockerd and debootstrap a base image"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_why_not_runnable() is not None, reason=str(_why_not_runnable()))
def test_image_writes_what_the_pip_cli_writes(capsys):
    cli = Path(sys.executable).parent / "onnx2tf-alt"
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        env=dict(os.environ, ONNX2TF_ALT_CLI=str(cli)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "docker check: outputs identical" in output, output
    with capsys.disabled():  # build time, image size and the comparison, in the test log
        wanted = ("build_and_check", "tflite", "files in both")
        print(
            "", *(line for line in output.splitlines() if any(w in line for w in wanted)), sep="\n"
        )
