"""Convert every model of a batch, each in its own child process, and report on them."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from onnx2tf_alt.batching import baseline as bl
from onnx2tf_alt.batching.flags import child_flags
from onnx2tf_alt.batching.record import finish, make_record, outputs, stem_of
from onnx2tf_alt.batching.report_html import write_summary_html
from onnx2tf_alt.batching.results import (
    RESULTS,
    ResultsFile,
    outcome_counts,
    read_results,
    write_summary_md,
)
from onnx2tf_alt.batching.resume import (
    adopt_renamed,
    already_converted,
    conversion_sources,
    failed_as_before,
    records_by_name,
)
from onnx2tf_alt.batching.source import Job, load_jobs
from onnx2tf_alt.batching.worker import Task, allow_starts, run_task, stop_all
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.export.manifest import sha256_of
from onnx2tf_alt.export.publish import STAGING_PREFIX
from onnx2tf_alt.version import __version__

STATE = ".batch"  # logs, temporary folders and the lock, inside OUT_ROOT
DEFAULT_TIMEOUT_S = 3600.0
_MB_PER_JOB = 2048  # a small CNN's conversion peaks at 0.7-1.5 GB resident
_MEASURED = ("latency_ratio", "latency_ms", "latency_error")  # by latency.py, after converting


@dataclass
class BatchReport:
    """What `batch` returns: one record per model (as in batch_results.jsonl), the
    regressions against the baseline, the folders of an older batch renamed to the names
    their models have now ({old: new}, see resume.adopt_renamed), and the exit code the CLI
    would return."""

    results: list[dict]
    regressions: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    renamed: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        bad = any(not r["as_expected"] for r in self.results)
        return 1 if bad or self.regressions else 0


def batch(
    source: str,
    output_root: str,
    flags: list[str] | tuple[str, ...] = (),
    jobs: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    memory_limit_mb: float | None = None,
    force: bool = False,
    check: bool = False,
    baseline: str | None = None,
    thresholds: bl.Thresholds | None = None,
    ray: str | None = None,
    progress: bool = False,
) -> BatchReport:
    """Convert every model of `source` (a folder searched for *.onnx, or a JSONL manifest)
    into `output_root/<name>/` (a name made from its path alone: names.py; an older batch's
    folders named otherwise are renamed, see resume.adopt_renamed), each in a child process running the CLI with `flags` (CLI
    conversion flags), at most `jobs` at a time, stopped after `timeout` seconds or above
    `memory_limit_mb` resident. Models converted before with the same input, flags and
    converter version (or failed before as expected) are skipped unless `force`. `check`
    adds -coto and times each converted float32 .tflite against onnxruntime (latency.py).
    `baseline` (a previous batch_results.jsonl) marks regressions. `ray` (an address,
    "auto", or "local" for a new local cluster) runs the conversions as Ray tasks. Writes
    batch_results.jsonl, batch_summary.md and batch_summary.html into `output_root`."""
    start = time.monotonic()
    models = load_jobs(source, output_root)
    root = os.path.abspath(output_root)
    os.makedirs(os.path.join(root, STATE), exist_ok=True)
    with _only_batch_in(root):
        earlier = read_results(os.path.join(root, RESULTS))
        renamed = adopt_renamed(models, root, earlier)
        previous = records_by_name(models, earlier)
        paths = {job.path for job in models}
        results = ResultsFile(os.path.join(root, RESULTS))
        done: dict[str, dict] = {}
        plans = {}
        for job in models:
            plan = _plan(job, root, list(flags), check, timeout, memory_limit_mb)
            record = _refused(plan, paths)
            if record is None and not force:
                record = _done_before(plan, previous.get(job.name))
            if record is None:
                plans[job.name] = plan
            else:
                done[job.name] = record
                results.add(record)
        bar = _Progress(len(models), done.values(), renamed, progress)

        def finished(child: dict) -> None:
            plan = plans[child["name"]]
            record = make_record(plan.job, child, plan.folder, plan.task.log_path, plan.base)
            done[plan.job.name] = record
            results.add(record)
            bar.step(record)

        tasks = [p.task for p in plans.values()]
        if ray is not None:
            from onnx2tf_alt.batching.ray_backend import run_on_ray

            run_on_ray(tasks, ray, finished, jobs)
        else:
            _run_local(tasks, jobs or default_jobs(memory_limit_mb), finished)
        records = [done[job.name] for job in models]
        results.close(records)
        _remove_leftovers(root)
    found = []
    if baseline is not None:
        found = bl.regressions(records, read_results(baseline), thresholds or bl.Thresholds())
    report = BatchReport(records, found, round(time.monotonic() - start, 2), renamed)
    write_summary_md(root, records, found, report.wall_s)
    write_summary_html(root, records, found, report.wall_s)
    return report


@dataclass
class _Plan:
    job: Job
    folder: str
    task: Task
    base: dict  # the record's fields known before converting


def _plan(job: Job, root: str, flags: list[str], check: bool, timeout, memory) -> _Plan:
    folder = os.path.join(root, job.name)
    argv_flags = child_flags([*flags, *job.flags], check)
    argv = ["-i", job.path, "-o", folder, *argv_flags]
    state = os.path.join(root, STATE)
    task = Task(job.name, argv, os.path.join(state, "logs", f"{job.name}.log"),
                os.path.join(state, "tmp", job.name),
                job.timeout if job.timeout is not None else timeout,
                job.memory_limit_mb if job.memory_limit_mb is not None else memory,
                [job.path, folder, stem_of(job)] if check else None)
    base = {"name": job.name, "path": job.path, "input_sha256": _sha256_or_none(job.path),
            "flags": argv_flags, "converter": __version__, "expect": job.expect,
            "timeout": task.timeout, "memory_limit_mb": task.memory_limit_mb}
    return _Plan(job, folder, task, base)


def _sha256_or_none(path: str) -> str | None:
    """None for what is not a readable file: a dangling or looping symlink, a pipe."""
    try:
        return sha256_of(path) if os.path.isfile(path) else None
    except OSError:
        return None


def _refused(plan: _Plan, paths: set[str]) -> dict | None:
    """The record of a model that is not converted at all, because its input cannot be read
    or converting it would write where it must not; None when it can run."""
    if plan.base["input_sha256"] is None:
        dangling = os.path.islink(plan.job.path) and not os.path.exists(plan.job.path)
        kind, why = "unreadable input", f"'{plan.job.path}' is not a readable file" + (
            " (a symbolic link to nothing, or a loop)." if dangling else ".")
    elif os.path.islink(plan.folder):
        kind, why = "output folder in use", (
            f"'{plan.folder}' is a symbolic link; a batch writes only into folders of its "
            "own. Remove the link and run the batch again.")
    else:
        other = sorted(conversion_sources(plan.folder) & paths - {plan.job.path})
        if not other:
            return None
        kind, why = "output folder in use", (
            f"'{plan.folder}' holds the conversion of '{other[0]}', another model of this "
            "batch (converted into a folder of its own), left there by an older batch; "
            "move that folder away and run the batch again.")
    record = {**plan.base, "exit_code": None, "wall_s": None, "peak_rss_mb": None,
              "resumed": False, "error_kind": kind, "error": why}
    return finish(record, "failed", plan.job.expect)


def _done_before(plan: _Plan, before: dict | None) -> dict | None:
    """The record of a model an earlier batch already converted, or saw fail as expected,
    exactly as this one would; None when it has to run."""
    if already_converted(plan.folder, stem_of(plan.job), plan.task.argv,
                         plan.base["input_sha256"]):
        return _resumed(plan, before)
    if failed_as_before(before, plan.base):
        return {**before, "resumed": True}
    return None


def _resumed(plan: _Plan, before: dict | None) -> dict:
    """The record of a model that was already converted: measured again from its files,
    with the wall time and memory of the run that converted it."""
    job = plan.job
    record = {**plan.base, "exit_code": 0, "resumed": True, **outputs(plan.folder, stem_of(job))}
    same = before is not None and before.get("input_sha256") == plan.base["input_sha256"]
    record["wall_s"] = before.get("wall_s") if same else None
    record["peak_rss_mb"] = before.get("peak_rss_mb") if same else None
    if same:
        record.update({key: before[key] for key in _MEASURED if key in before})
    actual = "ok"
    if record.get("check") and not record["check"]["passed"]:
        actual, record["error_kind"] = "failed", "accuracy check failed"
    return finish(record, actual, job.expect)


def _run_local(tasks: list[Task], jobs: int, finished: Callable[[dict], None]) -> None:
    # Threads only wait: each one watches its own child process.
    allow_starts()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        for future in as_completed([pool.submit(run_task, t) for t in tasks]):
            finished(future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True)


def default_jobs(memory_limit_mb: float | None = None) -> int:
    """As many workers as cores, fewer when the available memory cannot hold them."""
    cores = len(os.sched_getaffinity(0))
    per_job = memory_limit_mb or _MB_PER_JOB
    return max(1, min(cores, int(_available_mb() // per_job)))


def _available_mb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float(_MB_PER_JOB)


@contextlib.contextmanager
def _only_batch_in(root: str) -> Iterator[None]:
    """One batch at a time per OUT_ROOT: they would share results and staging folders."""
    with open(os.path.join(root, STATE, "lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise InputError(f"another batch is writing into '{root}'; wait for it or "
                             "pass another -o folder.") from exc
        yield


def _remove_leftovers(root: str) -> None:
    """Staging folders of children that had to be killed (they stage next to their output
    folder, in OUT_ROOT); every child has ended, so none is in use."""
    for path in glob.glob(os.path.join(glob.escape(root), STAGING_PREFIX + "*")):
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(os.path.join(root, STATE, "tmp"), ignore_errors=True)


class _Progress:
    """"[3/20] ok 2 · failed 1 · last: resnet (12.3 s)" on stderr, redrawn on a terminal."""

    def __init__(self, total: int, settled: Iterable[dict], renamed: dict[str, str],
                 enabled: bool):
        settled = list(settled)  # resumed, or refused before running
        self.total, self.done, self.enabled = total, len(settled), enabled
        self.tty = sys.stderr.isatty()
        self.records: list[dict] = []
        if not enabled:
            return
        for old, new in renamed.items():
            print(f"renamed folder {old}/ to {new}/ (a model's folder is named after its "
                  "path now; see docs/batch.md)", file=sys.stderr)
        resumed = sum(bool(r.get("resumed")) for r in settled)
        if resumed:
            print(f"{resumed} of {total} models done before (resumed)", file=sys.stderr)
        for record in settled:
            if not record.get("resumed"):
                print(f"{record['name']}: not converted: {record['error']}", file=sys.stderr)

    def step(self, record: dict) -> None:
        self.done += 1
        self.records.append(record)
        if not self.enabled:
            return
        counts = " · ".join(f"{k} {v}" for k, v in outcome_counts(self.records).items())
        wall = record.get("wall_s")
        line = (f"[{self.done}/{self.total}] {counts} · last: {record['name']} "
                f"{record['outcome']}" + (f" ({wall:.1f} s)" if wall is not None else ""))
        end = "\n" if not self.tty or self.done == self.total else ""
        print(("\r\033[K" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)

