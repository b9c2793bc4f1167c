"""Run one conversion in a child process of its own, under a time and a memory cap.

The child is the normal CLI (`python -m onnx2tf_alt ...`) in a new session, so that it and
anything it starts form one process group that can be stopped as a whole. The memory cap
is on resident memory (RSS), polled: an address-space limit (RLIMIT_AS) does not work with
TensorFlow, which maps about 4x the memory it uses (2.6 GB of address space for a 0.65 GB
conversion) and dies on import, with an unrelated-looking error, under any useful limit.
"""

from __future__ import annotations

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


@dataclass
class ChildResult:
    """How the child ended."""

    name: str
    exit_code: int  # negative: the signal that ended it
    stopped_for: str | None  # "timeout" or "memory" when we stopped it
    wall_s: float
    peak_rss_mb: float


def run_task(task: Task | dict) -> dict:
    """Run `task` and return its ChildResult as a dict."""
    task = Task(**task) if isinstance(task, dict) else task
    os.makedirs(os.path.dirname(task.log_path), exist_ok=True)
    os.makedirs(task.tmp_path, exist_ok=True)
    env = dict(os.environ, TMPDIR=task.tmp_path)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    start = time.monotonic()
    with _lock, open(task.log_path, "wb") as log:
        if _stopping.is_set():
            raise KeyboardInterrupt
        child = subprocess.Popen(
            [sys.executable, "-m", "onnx2tf_alt", *task.argv],
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
        shutil.rmtree(task.tmp_path, ignore_errors=True)
    result = ChildResult(task.name, code, stopped_for, round(time.monotonic() - start, 3),
                         round(peak_kb / 1024, 1))
    return asdict(result)


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
