"""What a batch converts: every `*.onnx` below a folder, or the entries of a JSONL manifest.

A manifest line is a JSON object: `{"path": "models/a.onnx"}` plus, optionally, `"flags"`
(conversion flags for this model only, e.g. `["-ois", "x:1,3,224,224"]`), `"expect"` (the
outcome it is known to have: ok, failed, timeout, memory or crashed), `"name"` (its output
folder's name, instead of the one names.py makes from its path), `"timeout"` and
`"memory_limit_mb"` (overriding the batch's). Relative paths are relative to the manifest's
folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from onnx2tf_alt.batching.names import check_unique, folder_name, safe_name
from onnx2tf_alt.errors import InputError

OUTCOMES = ("ok", "failed", "timeout", "memory", "crashed")
_KEYS = {"path", "flags", "expect", "name", "timeout", "memory_limit_mb"}


@dataclass
class Job:
    """One model of the batch."""

    path: str  # absolute
    name: str  # the output folder OUT_ROOT/<name>/: see names.py
    flags: list[str] = field(default_factory=list)
    expect: str = "ok"
    timeout: float | None = None
    memory_limit_mb: float | None = None


def load_jobs(source: str, output_root: str | None = None) -> list[Job]:
    """The models of `source` (a folder or a .jsonl manifest), each named after its own path
    (names.py). A folder's search skips `output_root` when it lies inside; no model's
    output folder may be the source folder or hold a model."""
    if os.path.isdir(source):
        walked = os.path.abspath(source)
        if output_root is not None and _same(walked, output_root):
            raise InputError(f"-o '{output_root}' is the source folder itself; pass an output "
                             "folder of its own (inside the source is fine: it is skipped).")
        found = _onnx_files(walked, output_root)
        jobs = [Job(path, folder_name(_relative(path, walked))) for path in found]
    elif os.path.isfile(source):
        walked = None
        jobs = _read_manifest(source)
    else:
        raise InputError(f"batch source '{source}' is neither a folder nor a manifest file.")
    if not jobs:
        raise InputError(f"batch source '{source}' holds no .onnx model.")
    check_unique([job.name for job in jobs], [job.path for job in jobs])
    if output_root is not None:
        _check_apart(jobs, walked, output_root)
    return jobs


def _onnx_files(folder: str, skipped: str | None) -> list[str]:
    skipped = os.path.realpath(skipped) if skipped is not None else None
    found = []
    for root, dirs, names in os.walk(folder):  # symlinked folders are not followed: no loops
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and os.path.realpath(os.path.join(root, d)) != skipped)
        found += [os.path.abspath(os.path.join(root, n)) for n in sorted(names)
                  if n.lower().endswith(".onnx")]
    return found


def _check_apart(jobs: list[Job], walked: str | None, output_root: str) -> None:
    """Stop when a model's output folder would be the source folder or hold a model (SOURCE
    inside OUT_ROOT, with a model named like a folder of it): converting would write among
    the inputs."""
    out = os.path.realpath(output_root)
    inside = {}  # first path part below OUT_ROOT (case ignored) -> an input there
    for path in [*(job.path for job in jobs), *([walked] if walked else [])]:
        real = os.path.realpath(path)
        if real.startswith(out + os.sep):
            inside.setdefault(real[len(out) + 1:].split(os.sep)[0].casefold(), path)
    for job in jobs:
        if job.name.casefold() in inside:
            raise InputError(f"the output folder '{os.path.join(output_root, job.name)}' of "
                             f"'{job.path}' would hold '{inside[job.name.casefold()]}'; pass "
                             "an -o folder outside the source.")


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _relative(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _read_manifest(path: str) -> list[Job]:
    base = os.path.dirname(os.path.abspath(path))
    jobs = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                jobs.append(_manifest_job(line, base, f"{path}:{number}"))
    return jobs


def _manifest_job(line: str, base: str, where: str) -> Job:
    try:
        entry = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{where}: not a JSON object ({exc}).") from exc
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise InputError(f"{where}: each line needs a \"path\" to a .onnx file.")
    unknown = set(entry) - _KEYS
    if unknown:
        raise InputError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}.")
    flags = entry.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(a, str) for a in flags):
        raise InputError(f"{where}: \"flags\" must be a list of strings, e.g. [\"-okv3\"].")
    expect = entry.get("expect", "ok")
    if expect not in OUTCOMES:
        raise InputError(f"{where}: \"expect\" must be one of {', '.join(OUTCOMES)}.")
    path = os.path.normpath(os.path.join(base, entry["path"]))
    if not os.path.isfile(path):
        raise InputError(f"{where}: model '{path}' does not exist.")
    name = entry.get("name")
    if name is not None and not (isinstance(name, str) and name):
        raise InputError(f"{where}: \"name\" must be a non-empty string.")
    name = safe_name(name) if name else folder_name(_relative(path, base))
    return Job(path, name, flags, expect,
               _positive(entry, "timeout", where), _positive(entry, "memory_limit_mb", where))


def _positive(entry: dict, key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, (int, float)) or value <= 0):
        raise InputError(f"{where}: \"{key}\" must be a positive number.")
    return value
