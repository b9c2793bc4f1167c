"""What a supervised CLI run tells the process that watches it (cli/supervisor.py).

The console run converts in a forked child, so that a crash in native code (TF's
quantizer, TFLite Micro, XNNPACK) or a stop that TF's code holds up for a minute can be
cleaned up by the parent: it removes the child's staging and temporary folders, writes the
failure report, and ends the run within seconds of a signal. The child reports, one line
each, the phase it is in and when it publishes (a publication is never cut short). Outside
a supervised run `report` does nothing.
"""

from __future__ import annotations

import contextlib
import os

_channel: list[int] = []  # the write end of the pipe to the supervisor, in the child
_native_log: list[str] = []


def attach(fd: int, native_log: str) -> None:
    """In the supervised child: send reports to `fd`; native code's stderr goes to
    `native_log` (logs.quiet_native_stderr), which the supervisor reads after a crash."""
    _channel[:] = [fd]
    _native_log[:] = [native_log]


def native_log() -> str | None:
    return _native_log[0] if _native_log else None


def supervised() -> bool:
    return bool(_channel)


def report(event: str) -> None:
    """One event ('phase NAME', 'publish begin', 'publish end') for the supervisor."""
    if _channel:
        with contextlib.suppress(OSError):  # the supervisor is gone: nothing to tell
            os.write(_channel[0], (event.replace("\n", " ") + "\n").encode())
