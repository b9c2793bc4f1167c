"""The manifest of a conversion: which files it wrote, so that later runs replace exactly
those and nothing else.

`<stem>_manifest.json` lists every file of a conversion (path relative to the output
folder, size, sha256), the folders it created, the converter version, the ONNX file's
sha256 and the command. A failed conversion's `reports/<stem>/` carries its own
`reports/<stem>/manifest.json`. A conversion owns only its own stem's manifests: another
model converted into the same folder keeps its files. A file is owned only while its size
and sha256 still match its manifest, and only at the place the manifest names once every
symlink on the way is resolved: a file the user changed since, or one a crafted manifest
reaches through a symlinked folder, is never touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass, field

from onnx2tf_alt.version import __version__

log = logging.getLogger("onnx2tf_alt")

FORMAT = "onnx2tf_alt.manifest/1"
CONVERSION, FAILURE_REPORT = "conversion", "failure_report"
REPORTS_ROOT = "reports"
LEGACY_REPORTS_MANIFEST = "reports/manifest.json"  # before failure reports were per stem
MANIFEST_MAX_BYTES = 16 << 20  # far above any real manifest; a larger file is not ours
# Ours nest 3 deep. json's decoder recurses in C per level: a crafted file nested 100,000
# deep overflows the C stack (a SIGSEGV, not a RecursionError) under the raised recursion
# limit the conversion runs with (translate/recursion.py).
MANIFEST_MAX_NESTING = 16
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"')


def reports_folder(stem: str) -> str:
    """Where a failed conversion of `stem` puts its reports, relative to the output folder."""
    return f"{REPORTS_ROOT}/{stem}"


def conversion_manifest(stem: str) -> str:
    return f"{stem}_manifest.json"


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Manifest:
    name: str  # the manifest's own path, relative to the output folder
    kind: str = CONVERSION
    source: dict = field(default_factory=dict)  # the ONNX file: path and sha256
    command: list = field(default_factory=list)
    files: dict = field(default_factory=dict)  # relative path -> {"size", "sha256"}
    folders: list = field(default_factory=list)

    @classmethod
    def for_conversion(cls, stem: str, source_paths: list[str], command: list[str]) -> Manifest:
        return cls(conversion_manifest(stem), CONVERSION, _describe_source(source_paths), command)

    @classmethod
    def for_failure_report(cls, stem: str, source_paths: list[str],
                           command: list[str]) -> Manifest:
        return cls(f"{reports_folder(stem)}/manifest.json", FAILURE_REPORT,
                   _describe_source(source_paths), command)

    def source_stem(self) -> str:
        """The stem of the ONNX file this manifest's run converted ("model" for a model
        given in memory), as pipeline.stem_of names it."""
        path = self.source.get("path")
        return os.path.splitext(os.path.basename(path))[0] if isinstance(path, str) else "model"

    def describe_files(self, stage: str) -> None:
        """List every file and folder under `stage` (the files to publish)."""
        self.files, folders = {}, []
        for root, dirs, names in os.walk(stage):
            dirs.sort()
            folders += [relative_path(os.path.join(root, d), stage) for d in dirs]
            for n in sorted(names):
                path = os.path.join(root, n)
                rel = relative_path(path, stage)
                if rel != self.name:
                    self.files[rel] = {"size": os.path.getsize(path), "sha256": sha256_of(path)}
        self.folders = sorted(folders)

    def write(self, stage: str) -> None:
        content = {
            "format": FORMAT,
            "kind": self.kind,
            "converter": f"onnx2tf_alt {__version__}",
            "source": self.source,
            "command": self.command,
            "folders": self.folders,
            "files": self.files,
        }
        path = os.path.join(stage, self.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(content, f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def read(cls, folder: str, name: str) -> Manifest | None:
        """The manifest at `folder/name`, or None when there is none or it is not one of
        ours. A file that names our format but does not hold a well-formed manifest (a
        crafted or damaged one) is ignored with a warning: it owns nothing."""
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        try:
            if os.path.getsize(path) > MANIFEST_MAX_BYTES:
                return None
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if _nesting(text) > MANIFEST_MAX_NESTING:
                log.warning("ignoring %s: nested deeper than any manifest of ours; the files "
                            "it names are left alone", path)
                return None
            content = json.loads(text)
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(content, dict) or content.get("format") != FORMAT:
            return None
        problem = _malformed(content)
        if problem:
            log.warning("ignoring %s: not a well-formed onnx2tf_alt manifest (%s); the files "
                        "it names are left alone", path, problem)
            return None
        return cls(name, content.get("kind", CONVERSION), content.get("source") or {},
                   content.get("command") or [], content["files"],
                   list(content.get("folders", [])))


def _nesting(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped)."""
    depth = deepest = 0
    for char in _STRINGS.sub("", text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _malformed(content: dict) -> str | None:
    """What is wrong with a manifest's content, or None."""
    files, folders = content.get("files"), content.get("folders", [])
    if not isinstance(files, dict):
        return "'files' is not an object"
    for rel, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) \
                or not isinstance(entry.get("sha256"), str):
            return f"the entry of '{rel}' has no integer size and sha256"
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        return "'folders' is not a list of paths"
    if content.get("kind", CONVERSION) not in (CONVERSION, FAILURE_REPORT):
        return f"unknown kind {content.get('kind')!r}"
    if not isinstance(content.get("source") or {}, dict):
        return "'source' is not an object"
    return None


def previous_manifests(folder: str, stem: str, reports_only: bool = False) -> list[Manifest]:
    """The manifests of earlier runs of `stem` in `folder`: its conversion's and its
    failure report's, or only the failure report's. Other stems' manifests are not read:
    their files are theirs."""
    if not os.path.isdir(folder):
        return []
    found = [Manifest.read(folder, f"{reports_folder(stem)}/manifest.json")]
    legacy = Manifest.read(folder, LEGACY_REPORTS_MANIFEST)
    if legacy is not None and legacy.source_stem() == stem:
        found.append(legacy)
    if not reports_only:
        found.append(Manifest.read(folder, conversion_manifest(stem)))
    return [m for m in found if m is not None and (not reports_only or m.kind == FAILURE_REPORT)]


def other_manifests(folder: str, stem: str) -> list[Manifest]:
    """The conversion manifests of other stems in `folder` (to name a file's owner)."""
    if not os.path.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder)
                   if n.endswith("_manifest.json") and n != conversion_manifest(stem))
    return [m for m in (Manifest.read(folder, n) for n in names) if m is not None]


def owned_files(folder: str, manifests: list[Manifest]) -> list[str]:
    """The files of `manifests` still in `folder` as they were written (relative paths),
    with the manifests themselves."""
    owned = set()
    for manifest in manifests:
        owned.add(manifest.name)
        for rel, entry in manifest.files.items():
            path = resolved_inside(folder, rel)
            if path is None or not os.path.isfile(path):
                continue
            if os.path.getsize(path) == entry.get("size") and sha256_of(path) == entry.get(
                "sha256"
            ):
                owned.add(rel)
    return sorted(owned)


def safe_relative(rel: str) -> bool:
    """A manifest (a file anyone can edit) may only name normalized relative paths."""
    return (isinstance(rel, str) and bool(rel) and "\x00" not in rel and "\\" not in rel
            and not os.path.isabs(rel) and posixpath.normpath(rel) == rel
            and ".." not in rel.split("/"))


def resolved_inside(folder: str, rel: str) -> str | None:
    """`folder/rel` when `rel` is a safe relative path that reaches a place inside `folder`
    with no symlink on the way (the folder itself may be one), else None with a warning:
    a manifest must never lead the converter to a file outside its folder."""
    if not safe_relative(rel):
        log.warning("ignoring the manifest entry %r in %s: not a plain relative path", rel,
                    folder)
        return None
    path = os.path.join(folder, *rel.split("/"))
    if not os.path.lexists(path):
        return None
    real_folder = os.path.realpath(folder)
    if os.path.realpath(path) != os.path.join(real_folder, *rel.split("/")):
        log.warning("ignoring the manifest entry '%s' in %s: a symlink on its way leads "
                    "elsewhere (%s); it is left alone", rel, folder, os.path.realpath(path))
        return None
    return path


def _describe_source(paths: list[str]) -> dict:
    if not paths:
        return {"path": None, "sha256": None}
    return {"path": os.path.abspath(paths[0]), "sha256": sha256_of(paths[0]),
            "external_data": [os.path.basename(p) for p in paths[1:]]}


def relative_path(path: str, folder: str) -> str:
    return os.path.relpath(path, folder).replace(os.sep, "/")
