"""Run one conversion in a child process of its own, under a time and a memory cap.

The child is the normal CLI (`python -m onnx2tf_alt ...`) in a new session, so that it and
anything it starts form one process group that can be stopped as a whole. The memory cap
is on resident memory (RSS), polled: an address-space limit (RLIMIT_AS) does not work with
TensorFlow, which maps about 4x the memory it uses (2.6 GB of address space for a 0.65 GB
conversion) and dies on import, with an unrelated-looking error, under any useful limit.
With --check, a second child (latency.py) then times the result, under what is left of the
caps; the batch parent itself never imports TensorFlow or a runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

POLL_S = 0.1
# A stopped CLI run leaves its output folder as it was; it needs a moment to get there.
GRACE_S = {"timeout": 5.0, "memory": 1.0}
_PAGE = os.sysconf("SC_PAGE_SIZE")
_live: set[int] = set()  # process groups of the children running now
_lock = threading.Lock()
_stopping = threading.Event()


@dataclass
class Task:
    """What a worker needs to run one model: plain data, so it can travel to Ray workers."""

    name: str
    argv: list  # the CLI arguments: -i MODEL -o FOLDER FLAGS...
    log_path: str
    tmp_path: str
    timeout: float | None = None
    memory_limit_mb: float | None = None
    # After a conversion that succeeded: the latency.py arguments MODEL FOLDER STEM (the
    # batch's --check), run as a second child under what is left of the caps.
    measure: list | None = None


@dataclass
class ChildResult:
    """How the child ended."""

    name: str
    exit_code: int  # negative: the signal that ended it
    stopped_for: str | None  # "timeout" or "memory" when we stopped it
    wall_s: float
    peak_rss_mb: float
    latency: dict | None = None  # latency.py's result, when the task asked for it


def run_task(task: Task | dict) -> dict:
    """Run `task` and return its ChildResult as a dict."""
    task = Task(**task) if isinstance(task, dict) else task
    os.makedirs(os.path.dirname(task.log_path), exist_ok=True)
    os.makedirs(task.tmp_path, exist_ok=True)
    start = time.monotonic()
    try:
        code, peak_kb, stopped_for = _run_child(["onnx2tf_alt", *task.argv], task, start, "wb")
        wall_s = round(time.monotonic() - start, 3)
        latency = None
        if task.measure and code == 0 and stopped_for is None:
            latency = _measure(task, start)
    finally:
        shutil.rmtree(task.tmp_path, ignore_errors=True)
    return asdict(ChildResult(task.name, code, stopped_for, wall_s, round(peak_kb / 1024, 1),
                              latency))


def _measure(task: Task, start: float) -> dict:
    """Time the converted model in a child of its own (latency.py), under what is left of
    the task's caps; its result, or {"latency_error": why}."""
    out = os.path.join(task.tmp_path, "latency.json")
    code, _, stopped_for = _run_child(
        ["onnx2tf_alt.batching.latency", *task.measure, out], task, start, "ab")
    if stopped_for is not None:
        return {"latency_error": f"measuring was stopped ({stopped_for} cap)"}
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"latency_error": f"measuring ended with exit code {code}; see the log"}


def _run_child(module_argv: list[str], task: Task, start: float,
               log_mode: str) -> tuple[int, float, str | None]:
    """Run `python -m MODULE ARGS...` in a session of its own, its output going to the
    task's log, until it ends or a cap stops it: (exit code, peak RSS KiB, why stopped)."""
    env = dict(os.environ, TMPDIR=task.tmp_path)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _lock, open(task.log_path, log_mode) as log:
        if _stopping.is_set():
            raise KeyboardInterrupt
        child = subprocess.Popen(
            [sys.executable, "-m", *module_argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )
        _live.add(child.pid)
    try:
        status, peak_kb, stopped_for = _watch(child.pid, task, start)
        code = os.waitstatus_to_exitcode(status)
        child.returncode = code  # reaped by _watch (for its rusage), not by Popen
    finally:
        _kill_group(child.pid, signal.SIGKILL)  # anything the child left running
        with _lock:
            _live.discard(child.pid)
    return code, peak_kb, stopped_for


def stop_all() -> None:
    """Stop every running child (SIGTERM: each leaves its folder as it was) and start no
    more: the batch itself was interrupted. Children run in sessions of their own, so a
    Ctrl-C at the terminal does not reach them by itself."""
    with _lock:
        _stopping.set()
        for pid in _live:
            _kill_group(pid, signal.SIGTERM)


def allow_starts() -> None:
    """Undo stop_all for the next batch of this process."""
    _stopping.clear()


def _watch(pid: int, task: Task, start: float) -> tuple[int, float, str | None]:
    """Wait for the child, stopping it when over a cap; (wait status, peak RSS KiB, why)."""
    peak_kb, stopped_for, deadline = 0.0, None, None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, max(peak_kb, usage.ru_maxrss), stopped_for
        now = time.monotonic()
        rss_kb = _tree_rss_kb(pid)
        peak_kb = max(peak_kb, rss_kb)
        if stopped_for is None:
            if task.timeout is not None and now - start > task.timeout:
                stopped_for = "timeout"
            elif task.memory_limit_mb is not None and rss_kb > task.memory_limit_mb * 1024:
                stopped_for = "memory"
            if stopped_for is not None:
                _kill_group(pid, signal.SIGTERM)
                deadline = now + GRACE_S[stopped_for]
        elif now > deadline:
            _kill_group(pid, signal.SIGKILL)
        time.sleep(POLL_S)


def _tree_rss_kb(pid: int) -> float:
    """Resident memory of `pid` and its descendants, KiB (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked
    return total / 1024


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
