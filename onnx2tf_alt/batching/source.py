"""What a batch converts: every `*.onnx` below a folder, or the entries of a JSONL manifest.

A manifest line is a JSON object: `{"path": "models/a.onnx"}` plus, optionally, `"flags"`
(conversion flags for this model only, e.g. `["-ois", "x:1,3,224,224"]`), `"expect"` (the
outcome it is known to have: ok, failed, timeout, memory or crashed), `"name"` (its output
folder's name), `"timeout"` and `"memory_limit_mb"` (overriding the batch's). Relative paths
are relative to the manifest's folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from onnx2tf_alt.errors import InputError

OUTCOMES = ("ok", "failed", "timeout", "memory", "crashed")
_KEYS = {"path", "flags", "expect", "name", "timeout", "memory_limit_mb"}


@dataclass
class Job:
    """One model of the batch."""

    path: str  # absolute
    name: str = ""  # unique within the batch: the output folder OUT_ROOT/<name>/
    flags: list[str] = field(default_factory=list)
    expect: str = "ok"
    timeout: float | None = None
    memory_limit_mb: float | None = None


def load_jobs(source: str) -> list[Job]:
    """The models of `source` (a folder or a .jsonl manifest), with unique names."""
    if os.path.isdir(source):
        jobs = [Job(p) for p in _onnx_files(source)]
        root = os.path.abspath(source)
    elif os.path.isfile(source):
        jobs = _read_manifest(source)
        root = os.path.dirname(os.path.abspath(source))
    else:
        raise InputError(f"batch source '{source}' is neither a folder nor a manifest file.")
    if not jobs:
        raise InputError(f"batch source '{source}' holds no .onnx model.")
    _name_jobs(jobs, root)
    return jobs


def _onnx_files(folder: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.abspath(os.path.join(root, n)) for n in sorted(names)
                  if n.lower().endswith(".onnx")]
    return found


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
    return Job(path, _safe_name(entry.get("name", "")), flags, expect,
               _positive(entry, "timeout", where), _positive(entry, "memory_limit_mb", where))


def _positive(entry: dict, key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, (int, float)) or value <= 0):
        raise InputError(f"{where}: \"{key}\" must be a positive number.")
    return value


def _name_jobs(jobs: list[Job], root: str) -> None:
    """Name each job after its file's stem; where stems collide, after its path below
    `root` (a/b/m.onnx -> a__b__m), then with a counter."""
    stems: dict[str, int] = {}
    for job in jobs:
        if not job.name:
            stem = _safe_name(os.path.splitext(os.path.basename(job.path))[0])
            stems[stem] = stems.get(stem, 0) + 1
    explicit = [job.name for job in jobs if job.name]
    if len(set(explicit)) < len(explicit):
        raise InputError("the manifest gives two models the same \"name\".")
    taken = set(explicit)
    for job in jobs:
        if job.name:
            continue
        name = _safe_name(os.path.splitext(os.path.basename(job.path))[0])
        if stems[name] > 1:
            rel = os.path.relpath(os.path.splitext(job.path)[0], root)
            name = _safe_name(rel.replace(os.sep, "__"))
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}_{n}"
        job.name = unique
        taken.add(unique)


def _safe_name(text: str) -> str:
    """A folder name: no separators, no leading dot (our own state lives in .batch/)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or ("model" if text else "")
