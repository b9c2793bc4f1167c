"""Compare our converter with the peer converter onnx2tf 2.6.9 on the same ONNX models.

For each model the script converts it with our CLI and with onnx2tf, alternating between
the two (ours, theirs, ours, theirs, ...) for --runs rounds so that drift in machine load
falls on both sides alike. Every conversion is a whole child process wrapped in
/usr/bin/time -v, which gives its wall time and its peak resident set size (the largest
single process in its tree, helpers included, as the kernel reports it). Each run writes
into a fresh temporary folder that is deleted afterwards. Our CLI runs at `-v debug`, so
its per-phase seconds and peaks are read from its `phase NAME: ... s, peak ... MB` lines.

One row is printed per model: the median wall seconds of each side over its successful
runs, the ratio ours/theirs, each side's highest peak RSS, the model's weight bytes (the
ONNX file plus any external data files), whether our peak stayed under the bound of
2 GiB + 1.5 x weight bytes, the exit codes of every run ('timeout' for a run that ran past
--timeout), and our slowest phase. A summary line follows: the median ratio over the
models, the worst model, models where ours took more than twice as long, and models over
the memory bound. A failed or timed-out run is reported in its row and never stops the
benchmark. --json PATH saves the rows, every run included.

Run it from the repository root with the project's interpreter, pointing --peer-python
at a virtual environment that holds onnx2tf 2.6.9:

    python benchmarks/bench_convert.py tests/data/mobilenet_block.onnx model2.onnx \\
        --peer-python /work/o2tvenv/bin/python --runs 3 --json /tmp/bench.json

Extra flags for either side go in one quoted string, written with '=' so that their
leading dashes are not taken as options of this script:
--ours-flags='-osd --builtin_only' --peer-flags='-osd'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from onnx2tf_alt.ir.loader import external_data_paths

PHASE = re.compile(r"phase (.+?): ([0-9.]+) s, peak ([0-9]+) MB")
TIME_FIELDS = {"wall": "Elapsed (wall clock) time (h:mm:ss or m:ss): ",
               "maxrss_kb": "Maximum resident set size (kbytes): "}
MIB = 1 << 20
BOUND_BASE_BYTES = 2 << 30
BOUND_PER_WEIGHT_BYTE = 1.5


@dataclass
class Run:
    """One conversion as seen from outside; `code` is the exit status or 'timeout'."""

    tool: str
    code: int | str
    wall_s: float | None = None
    peak_mb: float | None = None
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0


def data_files(model: Path) -> list[Path]:
    """The external-data files the model's initializers point to."""
    return [Path(path) for path in external_data_paths(str(model))]


def weight_bytes(model: Path, data: list[Path]) -> int:
    """The ONNX file's size plus its external data files' sizes."""
    return model.stat().st_size + sum(path.stat().st_size for path in data)


def parse_clock(text: str) -> float:
    """'1:02:03.5' or '2:03.45' as seconds."""
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def parse_time_report(path: Path) -> tuple[float | None, float | None]:
    """Wall seconds and peak RSS (MiB) from a /usr/bin/time -v report, None where absent."""
    values: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        for key, prefix in TIME_FIELDS.items():
            if line.strip().startswith(prefix):
                values[key] = line.strip()[len(prefix):]
    wall = parse_clock(values["wall"]) if "wall" in values else None
    peak = int(values["maxrss_kb"]) / 1024 if "maxrss_kb" in values else None
    return wall, peak


def parse_phases(log: str) -> dict[str, dict[str, float]]:
    """Seconds (summed) and peak MB (highest) per phase name from our debug log."""
    phases: dict[str, dict[str, float]] = {}
    for name, seconds, peak in PHASE.findall(log):
        entry = phases.setdefault(name, {"s": 0.0, "peak_mb": 0.0})
        entry["s"] += float(seconds)
        entry["peak_mb"] = max(entry["peak_mb"], float(peak))
    return phases


def last_lines(log: str, count: int = 3, limit: int = 300) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return " | ".join(lines[-count:])[-limit:]


def child_env(python: str) -> dict[str, str]:
    """The environment with the interpreter's own bin folder first on PATH, as in an
    activated virtual environment: onnx2tf runs the `onnxsim` console script by name and
    silently skips simplification when it is not on PATH."""
    bin_dir = os.path.dirname(os.path.abspath(shutil.which(python) or python))
    return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def timed_run(tool: str, command: Callable[[str], list[str]], env: dict[str, str],
              timeout: float) -> Run:
    """Run command(outdir) under /usr/bin/time -v in a fresh temporary folder."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_convert_{tool}_"))
    report, log_path = tmp / "time.txt", tmp / "log.txt"
    argv = ["/usr/bin/time", "-v", "-o", str(report), *command(str(tmp / "out"))]
    try:
        with open(log_path, "wb") as log:
            # A session of its own, so that a timeout kills the converter and any helper it
            # started, not only /usr/bin/time.
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                    env=env, start_new_session=True)
            try:
                code: int | str = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            finally:
                kill_group(proc)
        text = log_path.read_text(errors="replace")
        if code == "timeout":
            return Run(tool, code, tail=last_lines(text))
        wall, peak = parse_time_report(report)
        return Run(tool, code, wall, peak, parse_phases(text) if tool == "ours" else {},
                   "" if code == 0 else last_lines(text))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ours_command(python: str, model: Path, flags: list[str]) -> Callable[[str], list[str]]:
    return lambda out: [python, "-m", "onnx2tf_alt", "-i", str(model), "-o", out,
                        "-v", "debug", *flags]


def peer_command(python: str, model: Path, data: list[Path],
                 flags: list[str]) -> Callable[[str], list[str]]:
    return lambda out: [python, "-m", "onnx2tf", "-i",
                        str(linked_model(model, data, Path(out).parent)), "-o", out, *flags]


def linked_model(model: Path, data: list[Path], folder: Path) -> Path:
    """`model` and its external-data files `data` as links in `folder`: onnx2tf writes its
    simplified copy beside the input (`.NAME.onnx2tf_onnxsim_*.onnx`), and a run that is
    stopped leaves it there."""
    base = model.resolve().parent
    for source in [model.resolve(), *data]:
        target = folder / "model" / source.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)
    return folder / "model" / model.name


def median_wall(runs: list[Run]) -> float | None:
    walls = [run.wall_s for run in runs if run.ok and run.wall_s is not None]
    return statistics.median(walls) if walls else None


def highest_peak(runs: list[Run]) -> float | None:
    peaks = [run.peak_mb for run in runs if run.peak_mb is not None]
    return max(peaks) if peaks else None


def slowest_phase(runs: list[Run]) -> dict | None:
    """The phase with the highest median seconds over our successful runs."""
    seconds: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    for run in runs:
        if run.ok:
            for name, entry in run.phases.items():
                seconds.setdefault(name, []).append(entry["s"])
                peaks[name] = max(peaks.get(name, 0.0), entry["peak_mb"])
    if not seconds:
        return None
    name = max(seconds, key=lambda n: statistics.median(seconds[n]))
    return {"name": name, "s": statistics.median(seconds[name]), "peak_mb": peaks[name]}


def model_row(model: Path, weights: int, ours: list[Run], theirs: list[Run]) -> dict:
    ours_wall, theirs_wall = median_wall(ours), median_wall(theirs)
    ours_peak = highest_peak(ours)
    bound_mb = (BOUND_BASE_BYTES + BOUND_PER_WEIGHT_BYTE * weights) / MIB
    return {
        "model": model.name, "path": str(model), "weight_bytes": weights,
        "ours_wall_s": ours_wall, "theirs_wall_s": theirs_wall,
        "ratio": ours_wall / theirs_wall if ours_wall is not None and theirs_wall else None,
        "ours_peak_mb": ours_peak, "theirs_peak_mb": highest_peak(theirs),
        "bound_mb": bound_mb, "over_bound": None if ours_peak is None else ours_peak > bound_mb,
        "ours_codes": [run.code for run in ours], "theirs_codes": [run.code for run in theirs],
        "slowest_phase": slowest_phase(ours),
        "runs": [asdict(run) for pair in zip(ours, theirs, strict=True) for run in pair],
    }


def bench_model(model: Path, args: argparse.Namespace) -> dict:
    data = data_files(model)
    ours = ours_command(args.ours_python, model, args.ours_flags)
    theirs = peer_command(args.peer_python, model, data, args.peer_flags)
    ours_env, theirs_env = child_env(args.ours_python), child_env(args.peer_python)
    weights = weight_bytes(model, data)
    ours_runs: list[Run] = []
    theirs_runs: list[Run] = []
    for index in range(args.runs):
        print(f"{model.name}: run {index + 1}/{args.runs}", file=sys.stderr, flush=True)
        ours_runs.append(timed_run("ours", ours, ours_env, args.timeout))
        theirs_runs.append(timed_run("theirs", theirs, theirs_env, args.timeout))
    return model_row(model, weights, ours_runs, theirs_runs)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (("model", 24), ("ours s", 7), ("theirs s", 8), ("ratio", 5), ("ours MB", 7),
           ("theirs MB", 9), ("weights MB", 10), ("bound MB", 8), ("mem", 4),
           ("exit ours/theirs", 16), ("slowest phase", 0))


def table_line(cells: list[str]) -> str:
    """Cells padded to their column's width; a longer cell pushes the rest right."""
    return " ".join(f"{cell:<{width}}" for cell, (_, width) in
                    zip(cells, COLUMNS, strict=True)).rstrip()


def header() -> str:
    return table_line([name for name, _ in COLUMNS])


def row_line(row: dict) -> str:
    phase = row["slowest_phase"]
    return table_line([
        row["model"], fmt(row["ours_wall_s"], ".2f"), fmt(row["theirs_wall_s"], ".2f"),
        fmt(row["ratio"], ".2f"), fmt(row["ours_peak_mb"], ".0f"),
        fmt(row["theirs_peak_mb"], ".0f"), f"{row['weight_bytes'] / MIB:.1f}",
        f"{row['bound_mb']:.0f}", {None: "-", True: "OVER", False: "ok"}[row["over_bound"]],
        ",".join(map(str, row["ours_codes"])) + "/" + ",".join(map(str, row["theirs_codes"])),
        f"{phase['name']} {phase['s']:.2f} s, peak {phase['peak_mb']:.0f} MB" if phase else "-",
    ])


def summary(rows: list[dict]) -> dict:
    ratios = {row["model"]: row["ratio"] for row in rows if row["ratio"] is not None}
    worst = max(ratios, key=ratios.get) if ratios else None
    return {
        "median_ratio": statistics.median(ratios.values()) if ratios else None,
        "worst_model": worst, "worst_ratio": ratios[worst] if worst else None,
        "over_2x": [name for name, ratio in ratios.items() if ratio > 2],
        "over_memory_bound": [row["model"] for row in rows if row["over_bound"]],
        "no_ratio": [row["model"] for row in rows if row["ratio"] is None],
    }


def summary_line(result: dict, models: int) -> str:
    def names(items: list[str]) -> str:
        return ", ".join(items) or "none"

    return (f"summary: median ours/theirs {fmt(result['median_ratio'], '.2f')} over "
            f"{models - len(result['no_ratio'])} of {models} models; worst "
            f"{result['worst_model'] or '-'} {fmt(result['worst_ratio'], '.2f')}; "
            f"ours > 2x theirs: {names(result['over_2x'])}; over memory bound: "
            f"{names(result['over_memory_bound'])}; no ratio (a side failed every run): "
            f"{names(result['no_ratio'])}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX model files")
    parser.add_argument("--peer-python", required=True,
                        help="interpreter of the environment that holds onnx2tf 2.6.9")
    parser.add_argument("--ours-python", default=sys.executable,
                        help="interpreter that runs onnx2tf_alt (default: this one)")
    parser.add_argument("--runs", type=int, default=1, help="rounds per model (default 1)")
    parser.add_argument("--ours-flags", type=shlex.split, default=[],
                        help="extra flags for our CLI, one string: --ours-flags='...'")
    parser.add_argument("--peer-flags", type=shlex.split, default=[],
                        help="extra flags for onnx2tf, one string: --peer-flags='...'")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds allowed per conversion (default 1800)")
    parser.add_argument("--json", type=Path, help="save every row, runs included, here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    missing = [str(model) for model in args.models if not model.is_file()]
    if missing:
        parser.error(f"no such model: {', '.join(missing)}")
    args.models = [model.resolve() for model in args.models]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(header(), flush=True)
    rows = []
    for model in args.models:
        rows.append(bench_model(model, args))
        print(row_line(rows[-1]), flush=True)
    result = summary(rows)
    print(summary_line(result, len(rows)))
    if args.json:
        args.json.write_text(json.dumps({"ours_python": args.ours_python,
                                         "peer_python": args.peer_python, "runs": args.runs,
                                         "models": rows, "summary": result}, indent=2))


if __name__ == "__main__":
    main()
