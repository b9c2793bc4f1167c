"""Interruption at safe points: SIGINT, SIGTERM and SIGHUP end a CLI run cleanly.

Raising from a signal handler can land inside a callback TensorFlow's C++ code makes into
Python, which then swallows the exception (it prints a SystemError and carries on) or turns
it into an ImportError. So the CLI's handler only records the signal (and says at once
that the run is stopping), and the run raises `Interrupted` at its next safe point
(`checkpoint()`: every converted node, every written file, and before publishing). A second
signal raises at once. In a supervised run (cli/supervisor.py) the parent says it and ends
a child that does not stop in time, so the child's handler only records.
"""

from __future__ import annotations

import os
import signal
import sys

from onnx2tf_alt import progress

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_pending: list[int] = []
_supervised: list[bool] = [False]


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal; every `finally` cleans up on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def request_stop(signum: int, _frame=None) -> None:
    """The CLI's handler for SIGNALS: record the first (and say so), raise on the second."""
    progress.silence()  # the message below (or the supervisor's) replaces the status line
    if _supervised[0]:
        _pending.append(signum)
        return
    if _pending:
        raise Interrupted(signum)
    _pending.append(signum)
    message = (f"{progress.erase()}{signal.Signals(signum).name} received: stopping at the "
               "next safe point (a second signal stops at once)\n")
    try:  # a raw write: the handler may run inside a write to sys.stderr
        os.write(sys.stderr.fileno(), message.encode())
    except (OSError, ValueError, AttributeError):
        pass


def install(supervised: bool = False) -> dict:
    """Make `request_stop` the handler of SIGNALS; return the handlers it replaced.
    `supervised`: the run's supervisor acknowledges signals and escalates."""
    _pending.clear()
    _supervised[0] = supervised
    return {signum: signal.signal(signum, request_stop) for signum in SIGNALS}


def restore(previous: dict) -> None:
    """Put back the handlers `install` replaced (main() called in-process, e.g. by tests or a
    script, must not leave the CLI's handler behind: a later Ctrl-C would only be recorded)."""
    for signum, handler in previous.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def checkpoint() -> None:
    """Raise `Interrupted` when a stop was requested (a no-op outside the CLI)."""
    if _pending:
        raise Interrupted(_pending[0])


def requested() -> int | None:
    return _pending[0] if _pending else None
