"""The block that ends a conversion's console: each written file with its size, the
manifest, the delegate coverage and the accuracy verdict (from the reports written beside
the files)."""

from __future__ import annotations

import json
import logging
import os
import textwrap
from collections.abc import Iterable

from onnx2tf_alt.export.manifest import conversion_manifest

log = logging.getLogger("onnx2tf_alt")

WIDTH = 120
SAVED_MODEL = ("saved_model.pb", "fingerprint.pb", "variables", "assets")


def log_written(folder: str, stem: str, names: Iterable[str], extra: Iterable[str] = ()
                ) -> None:
    """Log at info level what a conversion of `stem` wrote into `folder`: one line per
    file of `names` (a folder: its file count), its manifest, then the delegate coverage
    and accuracy verdict read from the reports among them, then the `extra` lines."""
    log.info("%s", summary(folder, stem, names, extra))


def summary(folder: str, stem: str, names: Iterable[str], extra: Iterable[str] = ()) -> str:
    """The text log_written logs."""
    listed = list(names)
    names = [*listed, *_unlisted(folder, stem, listed), conversion_manifest(stem)]
    rows = _rows(folder, names)
    width = min(max(len(label) for label, _ in rows), WIDTH - 12)
    total = sum(size for _, size in rows)
    lines = [f"wrote {len(rows)} outputs ({_size(total)}) to {folder}:"]
    lines += [f"  {label[:width]:<{width}} {_size(size):>9}" for label, size in rows]
    lines += [wrapped for line in (*_report_lines(folder, stem, names), *extra)
              for wrapped in textwrap.wrap(line, WIDTH, initial_indent="  ",
                                           subsequent_indent="    ")]
    return "\n".join(lines)


def _unlisted(folder: str, stem: str, names: list[str]) -> list[str]:
    """The outputs the manifest lists that `names` leaves out (e.g. the accuracy reports),
    by their top-level name."""
    manifest = _read(folder, conversion_manifest(stem), [conversion_manifest(stem)]) or {}
    known = set(names) | set(SAVED_MODEL)
    found = []
    for path in manifest.get("files", {}):
        top = path.split("/")[0]
        if top not in known:
            known.add(top)
            found.append(top)
    return found


def _rows(folder: str, names: list[str]) -> list[tuple[str, int]]:
    """(label, bytes) per output; a saved_model's files and folders are one row."""
    rows, saved_model = [], []
    for name in names:
        if name in SAVED_MODEL:
            saved_model.append(name)
            continue
        rows.append(_row(folder, [name]))
    if "saved_model.pb" in saved_model:  # TF writes these beside it, unlisted
        saved_model = [n for n in SAVED_MODEL if os.path.exists(os.path.join(folder, n))]
    if saved_model:
        rows.insert(0, _row(folder, saved_model))
    return rows


def _row(folder: str, names: list[str]) -> tuple[str, int]:
    parts, total = [], 0
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            sizes = [os.path.getsize(os.path.join(root, f))
                     for root, _, files in os.walk(path) for f in files]
            if sizes or len(names) == 1:
                files = f"{len(sizes)} file{'' if len(sizes) == 1 else 's'}"
                parts.append(f"{name}/ ({files}, {_size(sum(sizes))})")
            total += sum(sizes)
        else:
            parts.append(name)
            total += os.path.getsize(path) if os.path.exists(path) else 0
    return ", ".join(parts), total


def _report_lines(folder: str, stem: str, names: list[str]) -> list[str]:
    """The delegate coverage and the accuracy verdict, from their reports in `names`."""
    lines = []
    delegates = _read(folder, f"{stem}_delegates.json", names)
    if delegates is not None:
        per_signature = delegates.get("signatures", {"": delegates})
        for signature, report in per_signature.items():
            where = f"{stem}_float32.tflite" + (f", signature {signature}" if signature else "")
            lines.append(f"delegates ({where}): {report.get('summary')}")
    accuracy = _read(folder, f"{stem}_accuracy_report.json", names)
    if accuracy is not None:
        verdict = ("not run: " + accuracy["error"] if accuracy.get("error") else
                   "passed" if accuracy.get("passed") else "FAILED")
        checked = ", ".join(accuracy.get("backends", {}))
        lines.append(f"accuracy check ({checked or 'no runtime'} vs onnxruntime): {verdict}")
    return lines


def _read(folder: str, name: str, names: list[str]) -> dict | None:
    if name not in names:
        return None
    try:
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB"):
        if count < 1024:
            return f"{count} B" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"
