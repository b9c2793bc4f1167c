"""Whether an earlier batch already converted a model exactly as this one would."""

from __future__ import annotations

import json
import os

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
