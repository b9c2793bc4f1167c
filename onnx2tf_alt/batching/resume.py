"""What an earlier batch left in OUT_ROOT: whether it already converted a model exactly as
this one would, and the folders it named otherwise (an older naming rule, see names.py)."""

from __future__ import annotations

import glob
import json
import os

from onnx2tf_alt.batching.names import safe_name
from onnx2tf_alt.batching.source import Job
from onnx2tf_alt.export.manifest import FORMAT, safe_relative, sha256_of
from onnx2tf_alt.version import __version__


def already_converted(folder: str, stem: str, argv: list[str], input_sha256: str) -> bool:
    """True when `folder` holds a complete conversion of the same input (sha256, wherever
    the file is now), made by this converter version with the same flags, every listed
    file unchanged (the folder may have moved)."""
    try:
        with open(os.path.join(folder, f"{stem}_manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return False
    same = (
        manifest.get("kind") == "conversion"
        and manifest.get("converter") == f"onnx2tf_alt {__version__}"
        and (manifest.get("source") or {}).get("sha256") == input_sha256
        and _flags(manifest.get("command")) == _flags(["onnx2tf-alt", *argv])
    )
    files = manifest.get("files")
    return same and isinstance(files, dict) and bool(files) and all(
        _unchanged(folder, rel, entry) for rel, entry in files.items()
    )


def failed_as_before(before: dict | None, base: dict) -> bool:
    """True when the previous record is the expected failure of the same input, flags,
    caps and converter: running it again would only fail again as expected. (A failure
    nobody expected is always tried again.)"""
    return (
        before is not None
        and before.get("outcome") == "expected-failure"
        and all(before.get(key) == value for key, value in base.items() if key != "path")
    )


def _flags(command) -> list | None:
    """The flags of a batch child's command line: onnx2tf-alt -i MODEL -o FOLDER FLAGS..."""
    if not isinstance(command, list) or command[1:2] != ["-i"] or command[3:4] != ["-o"]:
        return None
    return command[5:]


def _unchanged(folder: str, rel: str, entry: dict) -> bool:
    path = os.path.join(folder, rel)
    return (
        safe_relative(rel)
        and isinstance(entry, dict)
        and os.path.isfile(path)
        and os.path.getsize(path) == entry.get("size")
        and sha256_of(path) == entry.get("sha256")
    )


def adopt_renamed(jobs: list[Job], root: str, records: list[dict]) -> dict[str, str]:
    """Rename the folders that earlier `records` (batch_results.jsonl) gave a model of
    `jobs` under another name to the name it has now: {old name: new name}. A folder moves
    only when it holds that model's conversion (its manifest names the same input path) and
    the new name is free; nothing is deleted, and a folder that cannot move stays as it is."""
    todo = {}
    for record, new in _renamed(jobs, records):
        old = record["name"]
        if isinstance(old, str) and old and safe_name(old) == old:
            todo[old] = (new, record["path"])
    moved: dict[str, str] = {}
    progress = True
    while progress:  # a move can free the name another one waits for
        progress = False
        for old, (new, path) in list(todo.items()):
            folder, target = os.path.join(root, old), os.path.join(root, new)
            if os.path.lexists(target):
                continue
            del todo[old]
            if os.path.islink(folder) or path not in conversion_sources(folder):
                continue
            try:
                os.rename(folder, target)
            except OSError:
                continue
            moved[old], progress = new, True
    return moved


def records_by_name(jobs: list[Job], records: list[dict]) -> dict[str, dict]:
    """Earlier `records` by the name each model has now: one an older batch recorded under
    another name is found under the new name of the model with its path."""
    renamed = _renamed(jobs, records)
    moved = {id(record) for record, _ in renamed}
    kept = {r["name"]: r for r in records if id(r) not in moved}
    return {**kept, **{new: {**record, "name": new} for record, new in renamed}}


def conversion_sources(folder: str) -> set[str]:
    """The input paths of the conversions whose manifests are in `folder`."""
    sources = set()
    for path in glob.glob(os.path.join(glob.escape(folder), "*_manifest.json")):
        try:
            with open(path) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            continue
        if (isinstance(manifest, dict) and manifest.get("format") == FORMAT
                and manifest.get("kind") == "conversion"
                and isinstance(manifest.get("source"), dict)
                and isinstance(manifest["source"].get("path"), str)):
            sources.add(manifest["source"]["path"])
    return sources


def _renamed(jobs: list[Job], records: list[dict]) -> list[tuple[dict, str]]:
    """(record, the name its model has now) for each of `records` whose model, found by its
    path (a path only one model of `jobs` has), has another name now."""
    count: dict[str, int] = {}
    for job in jobs:
        count[job.path] = count.get(job.path, 0) + 1
    names = {job.path: job.name for job in jobs if count[job.path] == 1}
    found = []
    for record in records:
        path = record.get("path")
        new = names.get(path) if isinstance(path, str) else None
        if new is not None and new != record["name"]:
            found.append((record, new))
    return found
