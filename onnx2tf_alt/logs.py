"""Logging set-up shared by the CLI and the Python API.

TensorFlow's native libraries write start-up chatter straight to file descriptor 2, where
TF_CPP_MIN_LOG_LEVEL no longer reaches all of it, and onnxruntime prints its execution
provider warnings there. Unless debugging, the CLI points fd 2 at an anonymous file and keeps
Python's own stderr (logs, progress bar) on the terminal.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from onnx2tf_alt import progress, supervision

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


_native_quiet = [False]  # fd 2 already sent elsewhere for the whole process (the CLI)


def quiet_native_calls(func):
    """Decorator for the Python API: while `func` runs (unless its `verbosity` is "debug"),
    native code's stderr (TensorFlow's C++ logging: ~20 lines, among them a CUDA error on a
    CPU machine) goes to an anonymous file, as the CLI's does; Python's own stderr (logs,
    progress) stays where it was, and fd 2 is put back afterwards for the caller's own use.
    A no-op in the CLI, which quiets the whole process (quiet_native_stderr)."""

    @functools.wraps(func)
    def quieted(*args, **kwargs):
        if _native_quiet[0] or kwargs.get("verbosity") == "debug":
            return func(*args, **kwargs)
        with _native_stderr_aside():
            return func(*args, **kwargs)

    return quieted


@contextmanager
def _native_stderr_aside() -> Iterator[None]:
    sys.stderr.flush()
    try:
        python_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file (pytest, IDEs)
        python_fd = None
    saved = os.dup(2)
    previous, swapped = sys.stderr, None
    if python_fd == 2:  # Python writes where native code does: give Python its own copy
        swapped = os.fdopen(os.dup(saved), "w", buffering=1)
        sys.stderr = swapped
        _retarget(previous, swapped)
    try:
        with tempfile.TemporaryFile(prefix="onnx2tf_alt_native_") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        if swapped is not None:
            swapped.flush()
            sys.stderr = previous
            _retarget(swapped, previous)
            swapped.close()


def _retarget(old, new) -> None:
    for handler in logging.getLogger("onnx2tf_alt").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is old:
            handler.setStream(new)


def quiet_native_stderr() -> None:
    """Send native (C++) stderr to an anonymous temporary file; Python's stderr stays where
    it was. The file has no name (it is unlinked at once), so nothing is left behind; with
    `-v debug` the CLI does not call this and native messages reach the terminal. In a
    supervised run the file is the supervisor's (in the run's temporary folder), which
    quotes its last lines in the report of a crash."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _native_quiet[0] = True
    sys.stderr.flush()
    terminal = os.dup(2)
    sys.stderr = os.fdopen(terminal, "w", buffering=1)
    path = supervision.native_log()
    if path is not None:
        sink = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(sink, 2)
        os.close(sink)
        return
    with tempfile.TemporaryFile(prefix="onnx2tf_alt_native_") as sink:
        os.dup2(sink.fileno(), 2)


class _ConsoleHandler(logging.StreamHandler):
    """Records above the status line (onnx2tf_alt/progress.py), never through it."""

    def emit(self, record: logging.LogRecord) -> None:
        progress.clear()
        super().emit(record)
        progress.redraw()


def configure_logging(verbosity: str) -> None:
    level = LEVELS.get(verbosity, logging.INFO)
    log = logging.getLogger("onnx2tf_alt")
    if not log.handlers:
        handler = _ConsoleHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    if verbosity != "debug":
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        try:
            import absl.logging

            absl.logging.set_verbosity(absl.logging.ERROR)
        except ImportError:
            pass


@contextmanager
def phase(name: str) -> Iterator[None]:
    """At `-v debug`, log how long the block took and the process's memory in it:
    `phase NAME: 1.23 s, peak 789 MB, after 456 MB` (resident set size, sampled every 20 ms
    while the block runs; benchmarks/convert_phases.py reads these lines). Costs nothing
    at other levels. A supervised run tells its supervisor which phase it is in
    (onnx2tf_alt/supervision.py), for the report of a crash."""
    supervision.report(f"phase {name}")
    try:
        with progress.phase(name):
            yield from _timed(name)
    finally:
        supervision.report(f"end {name}")


def _timed(name: str) -> Iterator[None]:
    log = logging.getLogger("onnx2tf_alt")
    if not log.isEnabledFor(logging.DEBUG) or _rss_bytes() is None:
        yield
        return
    peak, done = [_rss_bytes()], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss_bytes() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        after = _rss_bytes()
        log.debug("phase %s: %.2f s, peak %d MB, after %d MB", name, time.perf_counter() - start,
                  max(peak[0], after) >> 20, after >> 20)


def _rss_bytes() -> int | None:
    """This process's resident set size (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
