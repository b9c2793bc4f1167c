"""The conversion flags a batch passes to each child, checked before anything runs."""

from __future__ import annotations

import contextlib
import io

from onnx2tf_alt.errors import InputError

_MARK = "\0batch"  # stands for -i / -o, which the batch sets itself


def child_flags(flags: list[str], check: bool) -> list[str]:
    """`flags` as the child CLI gets them: with -coto when `check`, and -n (no progress
    bars in the logs) unless a verbosity was asked for. Raises InputError on flags the CLI
    would refuse, and on -i/-o (the batch chooses both)."""
    from onnx2tf_alt.cli.args import parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser().parse_args(["-i", _MARK, "-o", _MARK, *flags])
    except SystemExit as exc:
        reason = stderr.getvalue().strip().splitlines()[-1:] or ["invalid flags"]
        raise InputError(f"conversion flags {flags}: {reason[0]}") from exc
    if args.input_onnx_file_path != _MARK or args.output_folder_path != _MARK:
        raise InputError("conversion flags may not set -i or -o: the batch gives each model "
                         "its own folder OUT_ROOT/<name>/.")
    out = list(flags)
    if check and not (args.check_onnx_tf_outputs_elementwise_close
                      or args.check_onnx_tf_outputs_elementwise_close_full):
        out.append("-coto")
    if not args.non_verbose and args.verbosity == "info" and not _asks_verbosity(flags):
        out.append("-n")
    return out


def _asks_verbosity(flags: list[str]) -> bool:
    return any(f in ("-v", "--verbosity") or f.startswith("--verbosity=") for f in flags)
