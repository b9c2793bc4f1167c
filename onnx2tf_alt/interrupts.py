"""Interruption at safe points: SIGINT, SIGTERM and SIGHUP end a CLI run cleanly.

Raising from a signal handler can land inside a callback TensorFlow's C++ code makes into
Python, which then swallows the exception (it prints a SystemError and carries on) or turns
it into an ImportError. So the CLI's handler only records the signal, and the run raises
`Interrupted` at its next safe point (`checkpoint()`: every converted node, every written
file, and before publishing). A second signal raises at once.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_pending: list[int] = []


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal; every `finally` cleans up on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def request_stop(signum: int, _frame=None) -> None:
    """The CLI's handler for SIGNALS: record the first, raise on the second."""
    if _pending:
        raise Interrupted(signum)
    _pending.append(signum)


def install() -> dict:
    """Make `request_stop` the handler of SIGNALS; return the handlers it replaced."""
    _pending.clear()
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
