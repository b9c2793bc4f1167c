"""The console's status line (onnx2tf_alt/progress.py): counts and ETAs of counted steps,
phases shown with their time, short steps never drawn, log records above the line, nothing
off a terminal, nothing after a signal."""

from __future__ import annotations

import io
import logging
import types

import pytest

from onnx2tf_alt import logs, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def shown(self) -> str:
        """What the terminal shows on its last line: the text after the last carriage
        return that was not a blank-out."""
        frames = [f for f in self.getvalue().split("\r") if f.strip()]
        return frames[-1].rstrip() if frames else ""


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(progress, "REDRAW_EVERY", 0.0)
    yield now
    progress.disable()


@pytest.fixture
def terminal(clock):
    """A terminal the status line is drawn on (time: `clock`)."""
    stream = Terminal()
    progress.enable(stream=stream)
    return stream


def test_a_counted_step_shows_its_count_detail_and_eta(clock, terminal):
    with progress.counting("quantizing", 5) as files:
        files.begin("a.tflite")
        clock[0] += 10  # one file took 10 s: four left
        files.begin("b.tflite")
        assert terminal.shown() == "quantizing 2/5: b.tflite (ETA 40 s)"
        clock[0] += 4  # the ETA counts down between items
        progress.redraw()
        assert terminal.shown() == "quantizing 2/5: b.tflite (ETA 36 s)"
    assert terminal.getvalue().endswith("\r"), "the line is cleared when the step ends"


def test_nested_steps_show_outermost_first_and_long_etas_in_minutes(clock, terminal):
    with progress.counting("trying float ops", 32) as trials:
        trials.begin()
        clock[0] += 30
        trials.begin("cosine 0.9912")
        samples = progress.each(range(8), "measuring")
        next(samples)
        clock[0] += 1
        next(samples)
        assert terminal.shown() == ("trying float ops 2/32: cosine 0.9912 (ETA 15 min) · "
                                    "measuring 2/8 (ETA 7 s)")
        list(samples)  # the inner step ends with its items
        progress.redraw()
        assert terminal.shown().startswith("trying float ops 2/32: cosine 0.9912 (ETA")


def test_a_phase_shows_its_time_once_it_lasts_a_second(clock, terminal):
    with progress.phase("saved_model"):
        progress.redraw()
        assert terminal.getvalue() == "", "a phase under a second draws nothing"
        clock[0] += 12
        progress.redraw()
        assert terminal.shown() == "saved_model 12 s"


def test_short_steps_draw_nothing(clock, terminal):
    with progress.counting("translating", 3) as nodes:
        for name in "abc":
            nodes.begin(name)
            clock[0] += 0.1
    assert terminal.getvalue() == ""


def test_a_log_record_is_printed_above_the_line(clock, terminal, monkeypatch):
    log = logging.getLogger("onnx2tf_alt.test_progress")
    handler = logs._ConsoleHandler(terminal)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)  # whatever an earlier conversion set on onnx2tf_alt
    monkeypatch.setattr(log, "propagate", False)
    try:
        with progress.counting("calibrating", 16) as samples:
            samples.begin()
            clock[0] += 2
            samples.begin()
            log.warning("a note")
            lines = terminal.getvalue().split("\n")
            assert lines[-2].endswith("WARNING: a note"), lines
            assert lines[-2].split("\r")[-1] == "WARNING: a note", "the line was cleared first"
            assert terminal.shown() == "calibrating 2/16 (ETA 30 s)", "and drawn again below"
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)


def test_nothing_is_drawn_off_a_terminal_or_with_n(clock):
    for stream, shown in ((io.StringIO(), True), (Terminal(), False)):
        progress.enable(shown, stream=stream)
        with progress.counting("quantizing", 2) as files:
            files.begin()
            clock[0] += 5
            files.begin()
        assert stream.getvalue() == ""


def test_after_a_signal_nothing_more_is_written(clock, terminal):
    with progress.counting("quantizing", 2) as files:
        files.begin()
        clock[0] += 5
        progress.silence()  # what the signal handler calls: it writes nothing itself
        drawn = terminal.getvalue()
        files.begin()
        progress.redraw()
    progress.disable()
    assert terminal.getvalue() == drawn
    assert progress.erase(terminal) == "\r\x1b[K" and progress.erase(io.StringIO()) == ""
