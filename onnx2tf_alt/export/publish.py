"""Where a conversion's files go, and how they get there without touching anyone else's.

A conversion of one model (a stem) owns exactly the files listed in that stem's manifests
(see manifest.py); other models' files in the same folder are not its own. Outputs are
written into a staging folder on the output folder's file system and published in one step
that cannot be interrupted by SIGINT/SIGTERM/SIGHUP (they are held back for the few renames
it takes) and that holds a lock on the staging folder's parent, so two runs never publish
into one folder at once: the folder then holds either the complete previous conversion or
the complete new one. Files the converter did not write, and other models' files, are
never deleted, moved or overwritten; a new output that would land on one stops the run
before it converts (and again at publication, for a run that started at the same time).

A staging folder's name carries its process id and host, so that a later run can remove
the staging folders of a process that died (a native crash, SIGKILL) and no other.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator

from onnx2tf_alt import supervision
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.export.manifest import (
    REPORTS_ROOT,
    Manifest,
    other_manifests,
    owned_files,
    previous_manifests,
    relative_path,
    resolved_inside,
)
from onnx2tf_alt.export.names import SAVED_MODEL_ENTRIES
from onnx2tf_alt.interrupts import SIGNALS, checkpoint

STAGING_PREFIX = ".onnx2tf_alt_"
PSEUDO_FILE_SYSTEMS = ("/proc", "/sys", "/dev")


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def staging_prefix(pid: int | None = None) -> str:
    """The name every staging folder of process `pid` (default: this one) starts with."""
    return f"{STAGING_PREFIX}{os.getpid() if pid is None else pid}.{_host_tag()}_"


def remove_staging_of(pid: int, folders: Iterable[str]) -> list[str]:
    """Remove the staging folders process `pid` left in `folders` (it has ended); returns
    them."""
    removed = []
    for folder in folders:
        for path in glob.glob(os.path.join(glob.escape(folder), staging_prefix(pid) + "*")):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _remove_dead_staging(folder: str) -> None:
    """Staging folders in `folder` of processes of this host that no longer run (a crash or
    SIGKILL ended them before they could clean up)."""
    pattern = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)\." + _host_tag() + "_")
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            found = pattern.match(name)
            if found and not _alive(int(found.group(1))):
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True


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

    `stem` names the model whose files this run replaces; `protected` are the paths that
    must never be written over (the ONNX file and its external-data files)."""

    def __init__(self, path: str, stem: str, protected: Iterable[str] = ()):
        self.path = os.path.abspath(os.fspath(path))
        self.real = os.path.realpath(self.path)
        self.stem = stem
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
        a trailing '/' for folders) would write over the input, a file we do not own or
        another model's file."""
        previous = previous_manifests(self.path, self.stem, reports_only=replaces_reports_only)
        removed = [os.path.join(self.path, f) for f in owned_files(self.path, previous)]
        claimed = [os.path.join(self.path, e.rstrip("/")) for e in self._claimed(entries)]
        for source in self.protected:
            for target in [*claimed, *removed]:
                if _inside(source, os.path.realpath(target)):
                    raise InputError(
                        f"The input '{source}' lies at or inside an output path ('{target}'), "
                        "which this conversion would write or replace. Pass another -o "
                        "folder, or move the input elsewhere."
                    )
        self._check_foreign(claimed, set(removed))

    def _claimed(self, entries: Iterable[str]) -> list[str]:
        """What publishing `entries` takes over: each entry whole (a saved_model's
        `variables/` with whatever is in it), except the shared `reports/` folder, of which
        only this stem's part is claimed."""
        claimed = []
        for entry in entries:
            claimed.append(f"{REPORTS_ROOT}/{self.stem}/" if entry == f"{REPORTS_ROOT}/"
                           else entry)
        return claimed

    def _check_foreign(self, targets: Iterable[str], owned: set[str]) -> None:
        for target in targets:
            blocked = self._blocked_parent(target)
            for found in [blocked] if blocked else _files_at(target):
                if found not in owned:
                    raise InputError(self._foreign_message(found))

    def _blocked_parent(self, target: str) -> str | None:
        """A folder on the way from the output folder to `target` that is a symlink or a
        file: writing through it would write elsewhere."""
        rel = relative_path(target, self.path).split("/")
        for depth in range(1, len(rel)):
            parent = os.path.join(self.path, *rel[:depth])
            if os.path.islink(parent) or (os.path.lexists(parent) and not os.path.isdir(parent)):
                return parent
        return None

    def _foreign_message(self, found: str) -> str:
        rel = relative_path(found, self.path)
        for manifest in other_manifests(self.path, self.stem):
            if rel in owned_files(self.path, [manifest]):
                source = manifest.source.get("path") or "a model given in memory"
                what = "the saved_model" if _in_saved_model(rel) else f"'{rel}'"
                return (
                    f"'{self.path}' already holds {what} of another model's conversion "
                    f"({source}, listed in {manifest.name}); converting '{self.stem}' into "
                    "the same folder would replace it. Nothing was changed: another model's "
                    "files are kept, so pass another -o folder"
                    + (", or leave out -osm to write this model's .tflite files beside "
                       "it without a saved_model" if what == "the saved_model" else "") + "."
                )
        return (
            f"'{found}' already exists and was not written by onnx2tf_alt (no manifest of "
            f"'{self.stem}' in '{self.path}' lists it with its current content); a new output "
            "would replace it. Nothing was changed: pass another -o folder, or move that file "
            "away."
        )

    # --- staging and publication --------------------------------------------------------
    def staging_bases(self) -> list[str]:
        """Where staging folders of this output folder may be: beside it, or inside it."""
        return [os.path.dirname(self.path), self.path]

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
        _remove_dead_staging(base)
        stage = None
        try:
            with signals_deferred():  # a signal now is acted on once `stage` is known
                stage = tempfile.mkdtemp(prefix=staging_prefix(), dir=base)
            yield stage
        finally:
            with signals_deferred():
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)

    def publish(self, stage: str, manifest: Manifest, reports_only: bool = False) -> None:
        """Replace this stem's previous conversion's files (or, with `reports_only`, its
        previous failure report's) with the files in `stage`, described by `manifest`, in
        one step."""
        checkpoint()  # a stop requested before publication leaves the previous state
        manifest.describe_files(stage)
        manifest.write(stage)
        entries = sorted(os.listdir(stage))
        with signals_deferred(), _locked(os.path.dirname(stage)):
            supervision.report("publish begin")
            try:
                self._publish_locked(stage, manifest, entries, reports_only)
            finally:
                supervision.report("publish end")

    def _publish_locked(self, stage: str, manifest: Manifest, entries: list[str],
                        reports_only: bool) -> None:
        # checked again under the lock: a run that started at the same time may have
        # published since this one's first check
        self.check_claims(
            [e + "/" if os.path.isdir(os.path.join(stage, e)) else e for e in entries],
            replaces_reports_only=reports_only,
        )
        if not os.path.lexists(self.path):
            os.rename(stage, self.path)
            _chmod_as_made(self.path)  # mkdtemp made it 0700
            return
        previous = previous_manifests(self.path, self.stem, reports_only=reports_only)
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
            for folder in sorted(stale, reverse=True):
                path = resolved_inside(self.path, folder)
                if path is not None:
                    with contextlib.suppress(OSError):  # kept when it still holds files
                        os.rmdir(path)
        finally:
            shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _locked(folder: str) -> Iterator[None]:
    """An exclusive lock on `folder` (flock on the folder itself: no lock file is left
    behind); a no-op where flock is not available."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _in_saved_model(rel: str) -> bool:
    """Whether `rel` (relative to the output folder) is a saved_model's file."""
    top, _, below = rel.partition("/")
    return (f"{top}/" if below else top) in SAVED_MODEL_ENTRIES


def _chmod_as_made(folder: str) -> None:
    """Give `folder` the mode os.makedirs would have (0777 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)


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
