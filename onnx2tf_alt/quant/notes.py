"""Notes of the quantization report: the full sentence for `<stem>_quant_report.json` and a
short line for the console table."""

from __future__ import annotations

import textwrap

CONSOLE_WIDTH = 120


class Note(str):
    """A report note: the string is the full sentence (written to the JSON as is); `short`
    is the one line the console shows instead."""

    short: str

    def __new__(cls, full: str, short: str) -> Note:  # noqa: PYI034 - Self: Python 3.11
        note = super().__new__(cls, full)
        note.short = short
        return note


def console_lines(note: str, width: int = CONSOLE_WIDTH) -> list[str]:
    """The console form of `note`: its short line, or the full sentence wrapped to `width`."""
    text = getattr(note, "short", note)
    return textwrap.wrap(text, width, subsequent_indent="    ") or [""]
