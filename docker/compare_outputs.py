"""Compare two onnx2tf_alt output folders: the Docker image's and the pip-installed CLI's.

    python docker/compare_outputs.py DOCKER_FOLDER HOST_FOLDER

Passes (exit 0) when both folders hold the same relative file list and every .tflite file
gives bitwise-equal outputs in both on one seeded random input; exit 1 otherwise. It also
says how many files are byte-identical (files that legitimately differ: the manifest's
command line and paths, and TF's random fingerprint.pb).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np


def file_digests(folder: Path) -> dict[str, str]:
    """Every file below `folder`: relative path -> sha256."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def tflite_outputs(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """The serving_default outputs of a .tflite file on a seeded random input (dynamic
    dimensions set to 2, so batch > 1 is exercised)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner("serving_default")
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, detail in sorted(runner.get_input_details().items()):
        shape = [2 if d < 0 else int(d) for d in detail["shape_signature"]]
        feeds[name] = rng.standard_normal(shape).astype(detail["dtype"])
    return runner(**feeds)


def compare(docker_folder: Path, host_folder: Path) -> list[str]:
    """The differences that fail the check (empty when the folders agree)."""
    docker_files, host_files = file_digests(docker_folder), file_digests(host_folder)
    problems = []
    if docker_files.keys() != host_files.keys():
        only_docker = sorted(docker_files.keys() - host_files.keys())
        only_host = sorted(host_files.keys() - docker_files.keys())
        problems.append(f"file lists differ: only in docker {only_docker}, only pip {only_host}")
    shared = sorted(docker_files.keys() & host_files.keys())
    identical = [name for name in shared if docker_files[name] == host_files[name]]
    print(f"{len(shared)} files in both, {len(identical)} byte-identical")
    for name in shared:
        if name not in identical:
            print(f"  differs: {name}")
    for name in (n for n in shared if n.endswith(".tflite")):
        docker_out = tflite_outputs(docker_folder / name)
        host_out = tflite_outputs(host_folder / name)
        equal = docker_out.keys() == host_out.keys() and all(
            np.array_equal(docker_out[k], host_out[k]) for k in docker_out
        )
        worst = max(
            float(np.max(np.abs(docker_out[k] - host_out[k]), initial=0.0))
            for k in docker_out.keys() & host_out.keys()
        )
        print(f"{name}: outputs {'equal' if equal else 'DIFFER'} (max |diff| {worst:g})")
        if not equal:
            problems.append(f"{name}: outputs differ (max |diff| {worst:g})")
    return problems


def main(argv: list[str]) -> int:
    """Compare the folders named in argv; print a verdict and return the exit code."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = compare(Path(argv[0]), Path(argv[1]))
    for problem in problems:
        print(f"FAIL: {problem}")
    print("docker check: " + ("FAILED" if problems else "outputs identical"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
