"""`onnx2tf-alt` command line; flag names follow onnx2tf wherever the feature matches."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile

from onnx2tf_alt import interrupts, progress, startup
from onnx2tf_alt.cli.args import parser
from onnx2tf_alt.cli.compat_flags import NOTES_DEST


def main(argv: list[str] | None = None, supervise: bool = False) -> int:
    """The CLI. `supervise` (the console entry): convert in a forked child watched by this
    process (cli/supervisor.py), so that a native crash or a stuck stop is cleaned up."""
    command = ["onnx2tf-alt", *(sys.argv[1:] if argv is None else argv)]
    if command[1:2] == ["batch"]:  # `onnx2tf-alt batch ...`: many models, see batching/
        from onnx2tf_alt.batching.cli import main as batch_main

        startup.resume()  # a long run that loads no TensorFlow (onnx2tf_alt/startup.py)

        return batch_main(command[2:])
    args = parser().parse_args(argv)
    for line in vars(args).pop(NOTES_DEST):
        if not args.non_verbose:
            print(line, file=sys.stderr)
    from onnx2tf_alt.cli import supervisor

    if not supervise or not args.input_onnx_file_path or not supervisor.available():
        return _convert(args, command)
    # fork before the conversion's modules load: each page the child then writes is one
    # the parent shares, and copying them costs time (about 10 ms per 20 MB)
    stem = os.path.splitext(os.path.basename(args.input_onnx_file_path))[0]  # stem_of's rule
    with private_temp_folder() as temp:
        return supervisor.run_supervised(
            lambda: _convert(args, command, supervised=True), args.output_folder_path, stem,
            args.input_onnx_file_path, command, temp)


def _convert(args: argparse.Namespace, command: list[str], supervised: bool = False) -> int:
    """The conversion with the CLI's signal handling, in this process; a supervised child
    uses its supervisor's temporary folder."""
    previous = interrupts.install(supervised)  # also where SIGINT was ignored at start
    try:
        with contextlib.nullcontext() if supervised else private_temp_folder():
            code = _run(args, command)
            interrupts.checkpoint()  # a signal held back during the final publication
            return code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(
            f"{progress.erase()}interrupted ({signal.Signals(signum).name}); outputs are "
            "published only when "
            f"complete, so '{args.output_folder_path}' holds what it held before (or, if the "
            "signal came after publication, the complete new conversion)",
            file=sys.stderr,
        )
        return 128 + signum
    finally:
        interrupts.restore(previous)


@contextlib.contextmanager
def private_temp_folder():
    """Point TMPDIR (and Python's tempfile) at a folder of this run's own, removed at the
    end: the libraries we call write there too (onnxruntime leaves a `.ses` file in the
    temp folder on import), and a run must leave nothing behind."""
    from onnx2tf_alt.export.publish import signals_deferred

    folder, saved = None, (os.environ.get("TMPDIR"), tempfile.tempdir)
    try:
        with signals_deferred():  # a signal now is acted on once `folder` is known
            folder = tempfile.mkdtemp(prefix="onnx2tf_alt_run_")
            os.environ["TMPDIR"], tempfile.tempdir = folder, folder
        yield folder
    finally:
        with signals_deferred():
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]


def _run(args: argparse.Namespace, command: list[str]) -> int:
    from onnx2tf_alt.logs import configure_logging, quiet_native_stderr

    verbosity = "error" if args.non_verbose else args.verbosity
    if verbosity != "debug":
        quiet_native_stderr()
    configure_logging(verbosity)
    if not args.input_onnx_file_path:
        print("error: -i/--input_onnx_file_path is required (the .onnx model).", file=sys.stderr)
        return 2
    from onnx2tf_alt.errors import Onnx2TfError

    try:
        from onnx2tf_alt.api import convert

        options = vars(args)
        backend = options.pop("tflite_backend")
        if backend is not None:  # onnx2tf 2.x's name for it
            from onnx2tf_alt.cli.args import BACKENDS

            options["tflite_writer"] = BACKENDS[backend]
            if backend == "tf_converter" and not options["disable_model_save"]:
                options["output_saved_model"] = True  # onnx2tf writes it on that backend
        convert(**options, command_line=command)
    except Onnx2TfError as exc:
        if verbosity == "debug":
            logging.getLogger("onnx2tf_alt").exception("conversion failed")
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        if interrupts.requested() is not None:  # what a stopped TF call raised instead
            raise interrupts.Interrupted(interrupts.requested()) from exc
        if verbosity == "debug":
            raise
        print(
            f"error: internal error ({type(exc).__name__}: {_first_line(exc)}). No output was "
            "written. Re-run with -v debug for the traceback and report it.",
            file=sys.stderr,
        )
        return 1
    return 0


def _first_line(exc: Exception) -> str:
    from onnx2tf_alt.errors import printable as escape

    lines = str(exc).strip().splitlines()
    return escape(lines[0] if lines else "")


if __name__ == "__main__":
    sys.exit(main())
