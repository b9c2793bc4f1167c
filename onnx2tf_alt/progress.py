"""The console's status line: what the run is doing now, redrawn in place on a terminal.

A run is a stack of steps. A counted step (`counting`, `each`: the graph's nodes, the
quantized files, calibration samples, the sensitivity search's trials) shows `label i/n`
and, once an item is done, an ETA: the mean time of the items done times the items left,
counting down between items. A phase (logs.phase: saved_model, TF's converter, ...) has no
count to go by; once it has run a second it shows its name and its time so far, redrawn
every second. The line shows the counted steps, outermost first, and the innermost phase:

    quantizing 2/5: m_full_integer_quant.tflite (ETA 40 s) · calibrating 7/16 (ETA 4 s)

Nothing is drawn unless `enable` was called for a terminal (the CLI and convert() without
-n); a log record clears the line and draws it again below itself (logs.configure_logging),
so the line never mixes with other output. A base module: it imports nothing of the project.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

PHASE_SHOWN_AFTER = 1.0  # s: a phase shorter than this is never drawn
COUNT_SHOWN_AFTER = 0.5  # s: nor a counted step (a small model's run draws nothing)
REDRAW_EVERY = 0.1  # s: counted steps redraw at most this often


class _Step:
    def __init__(self, label: str, total: int | None):
        self.label, self.total = label, total
        self.created = self.started = self.last = time.monotonic()
        self.shown_after = PHASE_SHOWN_AFTER if total is None else COUNT_SHOWN_AFTER
        self.done = 0  # items begun (the one running included)
        self.detail = ""

    def text(self, now: float) -> str:
        if self.total is None:
            return f"{self.label} {now - self.started:.0f} s"
        text = f"{self.label} {self.done}/{self.total}" + (f": {self.detail}" if self.detail
                                                             else "")
        finished = self.done - 1
        if finished > 0:
            each = (self.last - self.started) / finished
            left = each * (self.total - finished) - (now - self.last)
            text += f" (ETA {_duration(max(left, 0.0))})"
        return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Line:
    """The steps and what is drawn; all drawing under one lock (the ticker is a thread)."""

    def __init__(self, stream):
        self.stream, self.steps = stream, []
        self.lock = threading.RLock()
        self.width = 0  # characters drawn now
        self.text_drawn = ""
        self.silenced = False
        self.drawn_at = 0.0
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True, name="progress")
        self.ticker.start()

    def text(self, now: float) -> str:
        shown = [s for s in self.steps if now - s.created >= s.shown_after]
        parts = [s.text(now) for s in shown if s.total is not None]
        if shown and shown[-1] is self.steps[-1] and shown[-1].total is None:
            parts.append(shown[-1].text(now))  # the innermost phase
        return " · ".join(parts)

    def draw(self, force: bool = False) -> None:
        with self.lock:
            if self.silenced:
                return
            now = time.monotonic()
            if not force and now - self.drawn_at < REDRAW_EVERY:
                return
            self.drawn_at = now
            columns = shutil.get_terminal_size((100, 24)).columns - 1
            text = self.text(now)[:columns]
            if not text:
                self.clear()
                return
            if text == self.text_drawn and self.width:
                return
            self.text_drawn = text
            self._write("\r" + text.ljust(self.width) + ("\r" + text if len(text) < self.width
                                                        else ""))
            self.width = len(text)

    def clear(self) -> None:
        with self.lock:
            if self.width and not self.silenced:
                self._write("\r" + " " * self.width + "\r")
                self.width = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: draw nothing more
            self.stop.set()

    def _tick(self) -> None:
        while not self.stop.wait(1.0):
            if self.steps:
                self.draw(force=True)


_line: list[_Line | None] = [None]


def enable(shown: bool = True, stream=None) -> None:
    """Draw the status line on `stream` (default stderr) from now on, if it is a terminal
    and `shown` (not -n)."""
    stream = stream or sys.stderr
    disable()
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if shown and terminal:
        _line[0] = _Line(stream)


def disable() -> None:
    """Clear the line and draw nothing more."""
    line, _line[0] = _line[0], None
    if line is not None:
        line.stop.set()
        line.clear()


def silence() -> None:
    """Draw nothing more, without writing now: for a signal handler, which may run inside a
    write (the message it prints starts with ERASE)."""
    line = _line[0]
    if line is not None:
        line.stop.set()
        line.silenced = True


ERASE = "\r\x1b[K"  # back to the line's start, erase it: a message over a drawn line


def erase(stream=None) -> str:
    """ERASE where `stream` (default stderr) is a terminal, else nothing: the start of a
    message that may land on a drawn line (another process's, or after `silence`)."""
    try:
        return ERASE if (stream or sys.stderr).isatty() else ""
    except (AttributeError, ValueError):
        return ""


def clear() -> None:
    """Take the line off the terminal before other output; the next draw puts it back."""
    line = _line[0]
    if line is not None:
        line.clear()


def redraw() -> None:
    """Draw the line again (after a log record)."""
    line = _line[0]
    if line is not None and line.steps:
        line.draw(force=True)


@contextmanager
def _step(label: str, total: int | None) -> Iterator[_Step]:
    line, step = _line[0], _Step(label, total)
    if line is None:
        yield step
        return
    with line.lock:
        line.steps.append(step)
    try:
        yield step
    finally:
        with line.lock:
            if step in line.steps:
                line.steps.remove(step)
            if line.steps:
                line.draw(force=True)
            else:
                line.clear()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A step without a count: shown with its time so far once it lasts a second."""
    with _step(name, None):
        yield


class Counter:
    """A counted step: `begin(detail)` before each item."""

    def __init__(self, step: _Step):
        self._step = step

    def begin(self, detail: str = "") -> None:
        step = self._step
        now = time.monotonic()
        if step.done:
            step.last = now
        else:
            step.started = step.last = now
        step.done += 1
        step.detail = detail
        line = _line[0]
        if line is not None and step in line.steps:
            line.draw(force=step.done in (1, step.total))


@contextmanager
def counting(label: str, total: int) -> Iterator[Counter]:
    """A step of `total` items; `begin` each."""
    with _step(label, total) as step:
        yield Counter(step)


def each(items: Iterable, label: str, total: int | None = None) -> Iterator:
    """Yield `items`, counting them as the step `label` (total: len(items) unless given).
    A generator: the step ends when the iteration does."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = len(items) if total is None else total
    if _line[0] is None or total < 2:
        yield from items
        return
    with counting(label, total) as counter:
        for item in items:
            counter.begin()
            yield item
