"""The manifest of a conversion: which files it wrote, so that later runs replace exactly
those and nothing else.

`<stem>_manifest.json` lists every file of a conversion (path relative to the output
folder, size, sha256), the folders it created, the converter version, the ONNX file's
sha256 and the command. A failed conversion's `reports/` carries its own
`reports/manifest.json`. A file is owned only while its size and sha256 still match its
manifest: a file the user changed since is theirs again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field

from onnx2tf_alt.version import __version__

FORMAT = "onnx2tf_alt.manifest/1"
CONVERSION, FAILURE_REPORT = "conversion", "failure_report"
REPORTS_MANIFEST = "reports/manifest.json"


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
        return cls(f"{stem}_manifest.json", CONVERSION, _describe_source(source_paths), command)

    @classmethod
    def for_failure_report(cls, source_paths: list[str], command: list[str]) -> Manifest:
        return cls(REPORTS_MANIFEST, FAILURE_REPORT, _describe_source(source_paths), command)

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
        """The manifest at `folder/name`, or None when it is not one of ours."""
        try:
            with open(os.path.join(folder, name)) as f:
                content = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(content, dict) or content.get("format") != FORMAT:
            return None
        files = content.get("files")
        if not isinstance(files, dict):
            return None
        return cls(name, content.get("kind", CONVERSION), content.get("source", {}),
                   content.get("command", []), files, list(content.get("folders", [])))


def previous_manifests(folder: str, reports_only: bool = False) -> list[Manifest]:
    """The manifests of earlier runs in `folder`: the conversion's and the failure report's,
    or only the failure report's."""
    if not os.path.isdir(folder):
        return []
    names = [REPORTS_MANIFEST]
    if not reports_only:
        names += sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(glob.escape(folder), "*_manifest.json")))
    found = [Manifest.read(folder, n) for n in names]
    return [m for m in found if m is not None and (not reports_only or m.kind == FAILURE_REPORT)]


def owned_files(folder: str, manifests: list[Manifest]) -> list[str]:
    """The files of `manifests` still in `folder` as they were written (relative paths),
    with the manifests themselves."""
    owned = set()
    for manifest in manifests:
        owned.add(manifest.name)
        for rel, entry in manifest.files.items():
            path = os.path.join(folder, rel)
            if not safe_relative(rel) or os.path.islink(path) or not os.path.isfile(path):
                continue
            if os.path.getsize(path) == entry.get("size") and sha256_of(path) == entry.get(
                "sha256"
            ):
                owned.add(rel)
    return sorted(owned)


def safe_relative(rel: str) -> bool:
    """A manifest (a file anyone can edit) may only name paths inside its folder."""
    return bool(rel) and not os.path.isabs(rel) and ".." not in rel.split("/")


def _describe_source(paths: list[str]) -> dict:
    if not paths:
        return {"path": None, "sha256": None}
    return {"path": os.path.abspath(paths[0]), "sha256": sha256_of(paths[0]),
            "external_data": [os.path.basename(p) for p in paths[1:]]}


def relative_path(path: str, folder: str) -> str:
    return os.path.relpath(path, folder).replace(os.sep, "/")
