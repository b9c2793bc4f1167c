"""A console conversion runs in a forked child; this parent watches it.

Native code the conversion calls can crash the process (TF's quantizer on data it cannot
calibrate, TFLite Micro on a failed allocation) or hold a signal back for a minute (TF's
quantizer keeps the thread). Python cannot clean up after either from inside. So the
console run forks before it loads TensorFlow or converts anything, and the parent:

- on SIGINT / SIGTERM / SIGHUP says at once that it is stopping, passes the signal on (the
  child stops at its next safe point and cleans up itself), and when the child has not
  ended within GRACE_S (or at a second signal) kills it, unless it is publishing (a few
  renames, never cut short);
- when the child died of a signal it did not send (a native crash, the kernel's OOM
  killer), writes the failure report `reports/<stem>/conversion_errors.json` (signal,
  phase, the library running then, the last lines native code printed) and exits 1;
- in every case removes the child's staging folders (their names carry its pid) and owns
  the run's temporary folder (cli/main.py), so nothing is left behind.

The child tells the parent its phase and publication over a pipe (onnx2tf_alt/supervision.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from onnx2tf_alt import interrupts, progress, supervision

GRACE_S = 4.0  # a stop takes effect within this (plus the kill and the clean-up) of a signal
POLL_S = 0.1
NATIVE_LOG = "native_stderr.log"  # native code's stderr, in the run's temporary folder
NATIVE_TAIL_LINES = 20

# What runs in each phase (logs.phase names) that can crash in native code.
LIBRARIES = {
    "quantized files": "TensorFlow's TFLite converter and quantizer",
    "tflite float32": "TensorFlow's TFLite converter",
    "tflite float16": "TensorFlow's TFLite converter",
    "tflite dynamic range": "TensorFlow's TFLite converter",
    "micro": "TensorFlow Lite for Microcontrollers",
    "check": "the TFLite interpreter (XNNPACK) or onnxruntime",
    "delegate report": "the TFLite interpreter (XNNPACK)",
    "translate": "TensorFlow",
    "saved_model": "TensorFlow",
    "load": "onnx",
}

ADVICE = {
    "quantized files": " Another -cind calibration set, or leaving out -oiqt, may avoid it.",
    "tflite dynamic range": " Leaving out -odrqt may avoid it.",
    "micro": " Leaving out --target micro may avoid it.",
}


def available() -> bool:
    """Whether runs can be supervised here: fork exists and this is the main thread."""
    import threading

    return hasattr(os, "fork") and threading.current_thread() is threading.main_thread()


def run_supervised(work: Callable[[], int], output_folder: str, stem: str,
                   input_path: str | None, command: list[str], temp_folder: str) -> int:
    """Run `work` (the conversion; returns the exit code) in a forked child and watch it."""
    read_fd, write_fd = os.pipe()
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: pending.append(signum))
                for s in interrupts.SIGNALS}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(work, write_fd, os.path.join(temp_folder, NATIVE_LOG))
    try:
        os.close(write_fd)
        watch = _Watch(pid, read_fd, pending)
        status = watch.wait()
    finally:
        os.close(read_fd)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    from onnx2tf_alt.export.publish import OutputFolder, remove_staging_of

    folder = OutputFolder(output_folder, stem, protected=[input_path] if input_path else [])
    remove_staging_of(pid, folder.staging_bases())
    if watch.killed_for is not None:
        name = signal.Signals(watch.killed_for).name
        held = (f"its outputs were published before the stop, complete, in '{folder.path}'"
                if watch.published else f"outputs are published only when complete, so "
                f"'{folder.path}' holds what it held before")
        print(f"{progress.erase()}interrupted ({name}): stopped during {watch.phase_text()}; "
              f"{held}", file=sys.stderr)
        return 128 + watch.killed_for
    if os.WIFSIGNALED(status):
        return _crashed(os.WTERMSIG(status), watch, folder, input_path, command,
                        os.path.join(temp_folder, NATIVE_LOG))
    return os.waitstatus_to_exitcode(status)


def _child(work: Callable[[], int], channel: int, native_log: str) -> None:
    code = 1
    try:  # `work` installs the signal handlers (cli/main.py _convert, supervised)
        supervision.attach(channel, native_log)
        code = work()
    except BaseException as exc:  # noqa: BLE001 - the child must end here, never return
        if isinstance(exc, KeyboardInterrupt):
            code = 128 + getattr(exc, "signum", signal.SIGINT)
        elif isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            print(f"error: internal error ({type(exc).__name__}: {exc})", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


class _Watch:
    """The parent's loop: the child's reports, signals, the grace period, its end."""

    def __init__(self, pid: int, channel: int, pending: list[int]):
        self.pid, self.channel, self.pending = pid, channel, pending
        self.phases: list[str] = []
        self.publishing = False
        self.published = False  # a publication ended (a stop after it keeps the new files)
        self.killed_for: int | None = None
        self._buffer = b""

    def phase_text(self) -> str:
        return f"'{self.phases[-1]}'" if self.phases else "start-up"

    def wait(self) -> int:
        stop_at, acted_on, open_channel = None, 0, True
        while True:
            if open_channel:
                ready, _, _ = select.select([self.channel], [], [], POLL_S)
                if ready:
                    open_channel = self._read()
                if not open_channel and not self.pending:
                    # every write end is closed: the child is ending (blocking is safe; a
                    # grandchild that inherited the pipe would only delay this to its end)
                    return os.waitpid(self.pid, 0)[1]
            else:
                time.sleep(POLL_S / 4)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return status
            if len(self.pending) > acted_on:
                signum = self.pending[acted_on]
                acted_on = len(self.pending)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signum)
                if stop_at is None:
                    print(f"{progress.erase()}{signal.Signals(signum).name} received during "
                          f"{self.phase_text()}: "
                          f"stopping (within {GRACE_S:.0f} s; a second signal stops at once)",
                          file=sys.stderr, flush=True)
                    stop_at = time.monotonic() + GRACE_S
                else:
                    stop_at = time.monotonic()
            if stop_at is not None and time.monotonic() >= stop_at and not self.publishing \
                    and self.killed_for is None:
                self.killed_for = self.pending[0]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)

    def _read(self) -> bool:
        data = os.read(self.channel, 1 << 16)
        if not data:
            return False
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            event = line.decode(errors="replace")
            if event.startswith("phase "):
                self.phases.append(event[6:])
            elif event.startswith("end ") and self.phases and self.phases[-1] == event[4:]:
                self.phases.pop()
            elif event in ("publish begin", "publish end"):
                self.publishing = event == "publish begin"
                self.published = self.published or event == "publish end"
        return True


def _crashed(signum: int, watch: _Watch, folder, input_path: str | None,
             command: list[str], native_log: str) -> int:
    """The child died of `signum`, not sent by us: publish the failure report, say so."""
    name = signal.Signals(signum).name
    phase = watch.phases[-1] if watch.phases else None
    library = next((LIBRARIES[p] for p in reversed(watch.phases) if p in LIBRARIES), None)
    cause = "was killed (SIGKILL: out of memory?)" if signum == signal.SIGKILL else \
        f"crashed in native code ({name})"
    crash = {"signal": name, "phase": phase, "phases": watch.phases, "library": library,
             "native_stderr_tail": _tail(native_log)}
    where = _publish_crash_report(folder, crash, input_path, command)
    print(f"{progress.erase()}error: the conversion {cause} during {watch.phase_text()}"
          + (f", in {library}" if library else "") + ". Nothing of this run was published"
          + (f"; the crash is recorded in {where}" if where else "") + ". This is a bug: "
          "please report it with that file." + ADVICE.get(phase, ""), file=sys.stderr)
    return 1


def _publish_crash_report(folder, crash: dict, input_path: str | None,
                          command: list[str]) -> str | None:
    from onnx2tf_alt.errors import InputError
    from onnx2tf_alt.export.manifest import Manifest, reports_folder

    reports = reports_folder(folder.stem)
    try:
        with folder.staging() as stage:
            os.makedirs(os.path.join(stage, reports))
            with open(os.path.join(stage, reports, "conversion_errors.json"), "w") as f:
                json.dump({"failures": [], "crash": crash, "command": command}, f, indent=2)
            folder.publish(stage, Manifest.for_failure_report(
                folder.stem, [input_path] if input_path else [], command), reports_only=True)
    except (OSError, InputError):
        return None
    return os.path.join(folder.path, reports, "conversion_errors.json")


def _tail(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (64 << 10)))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return lines[-NATIVE_TAIL_LINES:]
