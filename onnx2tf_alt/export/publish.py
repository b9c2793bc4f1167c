"""Where a conversion's files go, and how they get there without touching anyone else's.

The converter owns exactly the files listed in the manifests it wrote (see manifest.py).
Outputs are written into a staging folder on the output folder's file system and published
in one step that cannot be interrupted by SIGINT/SIGTERM/SIGHUP (they are held back for the
few renames it takes): the folder then holds either the complete previous conversion or the
complete new one. Files the converter did not write are never deleted, moved or
overwritten; a new output that would land on one stops the run before it converts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.export.manifest import (
    Manifest,
    owned_files,
    previous_manifests,
    relative_path,
    safe_relative,
)
from onnx2tf_alt.interrupts import SIGNALS, checkpoint

STAGING_PREFIX = ".onnx2tf_alt_"
PSEUDO_FILE_SYSTEMS = ("/proc", "/sys", "/dev")


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back until the block ends, then act on the first one as
    its handler would have. Python runs signal handlers in the main thread between
    bytecodes, so swapping the handlers defers them whichever thread the OS picked (a
    thread mask would not: TF and onnxruntime threads would still take them)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be swapped, and only run, in the main thread
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum))
                for s in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler != signal.SIG_IGN:
                signal.raise_signal(caught[0])


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class OutputFolder:
    """The `-o` folder of one conversion: checks, staging and publication.

    `protected` are the paths that must never be written over (the ONNX file and its
    external-data files)."""

    def __init__(self, path: str, protected: Iterable[str] = ()):
        self.path = os.path.abspath(os.fspath(path))
        self.real = os.path.realpath(self.path)
        self.protected = sorted({os.path.realpath(p) for p in protected})

    # --- checks, before any work --------------------------------------------------------
    def check_usable(self) -> None:
        """-o must be a folder (or not exist yet) on a real, writable file system."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise InputError(
                f"-o '{self.path}' is an existing file, not a folder. Pass a folder path "
                "(it is created when missing)."
            )
        if any(_inside(self.real, root) for root in PSEUDO_FILE_SYSTEMS):
            raise InputError(
                f"-o '{self.path}' lies on a pseudo file system ({self.real.split(os.sep)[1]}/"
                "); pass a folder on a disk."
            )
        existing = self.path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise InputError(
                f"-o '{self.path}' cannot be written ('{existing}' is not a writable folder). "
                "Pass a folder you can write to."
            )

    def check_claims(self, entries: Iterable[str], replaces_reports_only: bool = False) -> None:
        """Stop before converting when publishing `entries` (names relative to the folder,
        a trailing '/' for folders) would write over the input or a file we do not own."""
        previous = previous_manifests(self.path, reports_only=replaces_reports_only)
        removed = [os.path.join(self.path, f) for f in owned_files(self.path, previous)]
        claimed = [os.path.join(self.path, e.rstrip("/")) for e in entries]
        for source in self.protected:
            for target in [*claimed, *removed]:
                if _inside(source, os.path.realpath(target)):
                    raise InputError(
                        f"The input '{source}' lies at or inside an output path ('{target}'), "
                        "which this conversion would write or replace. Pass another -o "
                        "folder, or move the input elsewhere."
                    )
        self._check_foreign(claimed, set(removed))

    def _check_foreign(self, targets: Iterable[str], owned: set[str]) -> None:
        for target in targets:
            for found in _files_at(target):
                if found not in owned:
                    raise InputError(
                        f"'{found}' already exists and was not written by onnx2tf_alt (no "
                        f"manifest in '{self.path}' lists it with its current content); a "
                        "new output would replace it. Nothing was changed: pass another -o "
                        "folder, or move that file away."
                    )

    # --- staging and publication --------------------------------------------------------
    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """A fresh folder to write outputs into, on the output folder's file system; it is
        gone when the block ends, whether it was published or not."""
        parent = os.path.dirname(self.path)
        base = parent
        if os.path.isdir(self.path) and (
            not _same_device(self.path, parent) or not os.access(parent, os.W_OK | os.X_OK)
        ):
            base = self.path  # renames must stay on its file system; the parent may be closed
        else:
            os.makedirs(parent, exist_ok=True)
        stage = None
        try:
            with signals_deferred():  # a signal now is acted on once `stage` is known
                stage = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=base)
            yield stage
        finally:
            with signals_deferred():
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)

    def publish(self, stage: str, manifest: Manifest, reports_only: bool = False) -> None:
        """Replace the previous conversion's files (or, with `reports_only`, the previous
        failure report's) with the files in `stage`, described by `manifest`, in one step."""
        checkpoint()  # a stop requested before publication leaves the previous state
        manifest.describe_files(stage)
        manifest.write(stage)
        entries = sorted(os.listdir(stage))
        self.check_claims(
            [e + "/" if os.path.isdir(os.path.join(stage, e)) else e for e in entries],
            replaces_reports_only=reports_only,
        )
        with signals_deferred():
            if not os.path.lexists(self.path):
                os.rename(stage, self.path)
                return
            previous = previous_manifests(self.path, reports_only=reports_only)
            trash = stage + ".old"
            os.makedirs(trash)
            try:
                for rel in owned_files(self.path, previous):
                    _move(os.path.join(self.path, rel), os.path.join(trash, rel))
                for root, dirs, files in os.walk(stage):
                    for name in dirs:
                        rel = relative_path(os.path.join(root, name), stage)
                        os.makedirs(os.path.join(self.path, rel), exist_ok=True)
                    for name in files:
                        source = os.path.join(root, name)
                        _move(source, os.path.join(self.path, relative_path(source, stage)))
                stale = {d for m in previous for d in m.folders} - set(manifest.folders)
                for folder in sorted(filter(safe_relative, stale), reverse=True):
                    with contextlib.suppress(OSError):  # kept when it still holds files
                        os.rmdir(os.path.join(self.path, folder))
            finally:
                shutil.rmtree(trash, ignore_errors=True)


def _move(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(source, target)


def _files_at(path: str) -> list[str]:
    """Every file at or below `path` (a symlink counts as a file, never followed)."""
    if not os.path.lexists(path):
        return []
    if os.path.islink(path) or not os.path.isdir(path):
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        found += [os.path.join(root, n) for n in files]
        found += [os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d))]
    return found


def _same_device(a: str, b: str) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev
