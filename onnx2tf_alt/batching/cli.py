"""`onnx2tf-alt batch SOURCE -o OUT_ROOT [batch options] [conversion flags]`.

Every argument that is not a batch option is a conversion flag, passed to each model's
CLI run (`-oh5`, `-ois x:1,3,224,224`, ...). Exit codes: 0 every model converted (or failed
as its manifest entry expects), 1 any other outcome or a regression against --baseline,
2 bad usage (unusable source, flags or output folder; --ray without Ray), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from onnx2tf_alt.batching.results import RESULTS, SUMMARY_HTML, SUMMARY_MD, outcome_counts

_VALUE = {"-o", "--output_folder_path", "-j", "--jobs", "--timeout", "--memory_limit_mb",
          "--baseline", "--ray", "--time_ratio", "--error_ratio", "--latency_ratio"}
_SWITCH = {"--force", "--check", "-h", "--help"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onnx2tf-alt batch",
        description="Convert every model of a folder (searched for *.onnx) or a JSONL "
        "manifest, each in its own process, into OUT_ROOT/<name>/. Arguments that are not "
        "batch options are conversion flags, passed to every model.",
    )
    p.add_argument("source", help="a folder, or a .jsonl manifest: one JSON object per line "
                   "with \"path\" and optionally \"flags\", \"expect\", \"name\", \"timeout\", "
                   "\"memory_limit_mb\"")
    p.add_argument("-o", "--output_folder_path", required=True, metavar="OUT_ROOT",
                   help="where each model's folder and the batch results go")
    p.add_argument("-j", "--jobs", type=int, help="conversions at a time (default: the "
                   "cores, fewer when the available memory holds fewer 2 GB conversions)")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="stop a conversion after S seconds (default: 3600)")
    p.add_argument("--memory_limit_mb", type=float, metavar="M",
                   help="stop a conversion whose processes use more than M MB resident")
    p.add_argument("--force", action="store_true",
                   help="convert again models an earlier run already converted")
    p.add_argument("--check", action="store_true",
                   help="check each model against onnxruntime (-coto), record the verdict and "
                   "the float32 .tflite's latency over onnxruntime's (1 thread)")
    p.add_argument("--baseline", metavar="PREVIOUS/batch_results.jsonl",
                   help="mark regressions against a previous batch; exit 1 when any")
    p.add_argument("--time_ratio", type=float, default=1.5, help="slower than this many "
                   "times the baseline's wall time (and by > 2 s) is a regression (default 1.5)")
    p.add_argument("--error_ratio", type=float, default=10.0, help="a check error this many "
                   "times the baseline's (and > 1e-5) is a regression (default 10)")
    p.add_argument("--latency_ratio", type=float, default=1.25, help="a TFLite/onnxruntime "
                   "latency ratio this many times the baseline's (and the TFLite run > 0.1 ms "
                   "longer) is a regression (default 1.25)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the conversions as Ray tasks: a "
                   "cluster address, auto (this machine's cluster) or local (start one)")
    return p


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(batch arguments, conversion flags): a conversion flag's value never looks like a
    batch option, so one pass separates them."""
    mine, theirs, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if i == 0 and not arg.startswith("-"):
            mine.append(arg)  # SOURCE
        elif name in _VALUE:
            mine += argv[i:i + (1 if "=" in arg else 2)]
            i += 0 if "=" in arg else 1
        elif name in _SWITCH:
            mine.append(arg)
        else:
            theirs.append(arg)
        i += 1
    return mine, theirs


def main(argv: list[str]) -> int:
    """Run the batch command; returns the exit code."""
    from onnx2tf_alt.batching.baseline import Thresholds
    from onnx2tf_alt.batching.runner import batch
    from onnx2tf_alt.errors import InputError

    mine, flags = split_arguments(argv)
    try:
        args = parser().parse_args(mine)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if args.jobs is not None and args.jobs < 1:
        print("error: --jobs must be at least 1.", file=sys.stderr)
        return 2
    if args.baseline is not None and not os.path.isfile(args.baseline):
        print(f"error: --baseline '{args.baseline}' does not exist.", file=sys.stderr)
        return 2
    saved = signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop children too
    try:
        report = batch(
            args.source, args.output_folder_path, flags, jobs=args.jobs, timeout=args.timeout,
            memory_limit_mb=args.memory_limit_mb, force=args.force, check=args.check,
            baseline=args.baseline, thresholds=Thresholds(
                args.time_ratio, error_ratio=args.error_ratio, latency_ratio=args.latency_ratio),
            ray=args.ray, progress=True,
        )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; the models finished so far are in {args.output_folder_path}/"
              f"{RESULTS}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, saved)
    _print_summary(report, args.output_folder_path)
    return report.exit_code


def _print_summary(report, root: str) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in outcome_counts(report.results).items())
    print(f"{len(report.results)} models in {report.wall_s:.1f} s: {counts}")
    for r in report.results:
        if not r["as_expected"]:
            print(f"  {r['name']}: {r['outcome']}"
                  + (f" ({r['error_kind']})" if r.get("error_kind") else "")
                  + (f", expected {r['expect']}" if r["expect"] != "ok" else ""))
    for r in report.regressions:
        print(f"  regression: {r['name']}: {r['why']}")
    print(f"results: {os.path.join(root, RESULTS)}, {os.path.join(root, SUMMARY_MD)}, "
          f"{os.path.join(root, SUMMARY_HTML)}")
