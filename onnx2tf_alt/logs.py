"""Logging set-up shared by the CLI and the Python API.

TensorFlow's native libraries write start-up chatter straight to file descriptor 2, where
TF_CPP_MIN_LOG_LEVEL no longer reaches all of it, and onnxruntime prints its execution
provider warnings there. Unless debugging, the CLI points fd 2 at an anonymous file and keeps
Python's own stderr (logs, progress bar) on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def quiet_native_stderr() -> None:
    """Send native (C++) stderr to an anonymous temporary file; Python's stderr stays where
    it was. The file has no name (it is unlinked at once), so nothing is left behind; with
    `-v debug` the CLI does not call this and native messages reach the terminal."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    terminal = os.dup(2)
    sys.stderr = os.fdopen(terminal, "w", buffering=1)
    with tempfile.TemporaryFile(prefix="onnx2tf_alt_native_") as sink:
        os.dup2(sink.fileno(), 2)


def configure_logging(verbosity: str) -> None:
    level = LEVELS.get(verbosity, logging.INFO)
    log = logging.getLogger("onnx2tf_alt")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
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
