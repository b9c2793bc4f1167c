"""The console entry point (`onnx2tf-alt`, `python -m onnx2tf_alt`): runs `main()` and
ends the process. Import-light on purpose: a signal that arrives while the CLI's own
modules load must end the run quietly too, and this module is what is loaded first."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import signal
import sys

from onnx2tf_alt import startup

# TensorFlow's __init__ imports an optimizers module eagerly: Keras 3's (`keras.src`, 0.25 s
# and 17 MB of mobilenet_block's 2.8 s -dms run) unless this is set, then tf_keras's, which
# the conversion imports anyway. tf.keras is then tf_keras in this process, which is what
# the converter uses; a value the user set is kept.
LEGACY_KERAS = ("TF_USE_LEGACY_KERAS", "1")

# TensorFlow's generated TFLite schema module and ai_edge_litert's, which the converter's
# own flatbuffer edits use (tflite/flatbuffer.py), hold the same classes (ai_edge_litert's
# has two more: blockwise quantization); each takes 0.18 s to import. The CLI gives
# TensorFlow ai_edge_litert's when TensorFlow asks for its own (tests/cli/test_entry.py
# checks the superset).
TF_SCHEMA = "tensorflow.lite.python.schema_py_generated"
LITERT_SCHEMA = "ai_edge_litert.schema_py_generated"


class _SharedSchema(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers TensorFlow's import of TF_SCHEMA with the LITERT_SCHEMA module."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == TF_SCHEMA else None

    def create_module(self, spec):
        return importlib.import_module(LITERT_SCHEMA)

    def exec_module(self, module) -> None:
        pass


def share_tflite_schema() -> None:
    """TensorFlow gets LITERT_SCHEMA for TF_SCHEMA, unless it has loaded its own."""
    if TF_SCHEMA not in sys.modules and not any(
            isinstance(finder, _SharedSchema) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SharedSchema())


def run_and_exit() -> None:
    """`main()`, then the process ends without Python's interpreter teardown once every
    output is published and the streams are flushed.

    A SIGINT before `main` installs its own handlers (while the modules load or the flags
    are parsed) has written nothing: the run ends with 130 and one line, not a traceback.
    Unwinding TensorFlow's modules, thread pools and atexit hooks took 0.7 s of a 4.1 s
    conversion of tests/data/mobilenet_block.onnx, after the last file was written, and the
    supervising parent's modules 12 ms of a 0.4 s `-dms` one; the run's own cleanup (its
    temporary folder, the signal handlers) is done inside `main`. `onnx2tf-alt batch` exits
    normally: its parent imports no TensorFlow, and Ray's atexit hooks must run."""
    os.environ.setdefault(*LEGACY_KERAS)
    share_tflite_schema()
    startup.pause()  # until the conversion has loaded TensorFlow (onnx2tf_alt/startup.py)
    try:
        from onnx2tf_alt.cli.main import main

        code = main(supervise=True)
    except KeyboardInterrupt:
        print("interrupted (SIGINT) before the conversion began; nothing was written",
              file=sys.stderr)
        code = 128 + signal.SIGINT
    # Outputs are published: a late Ctrl-C must not turn the exit into a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.argv[1:2] == ["batch"]:  # its atexit hooks (Ray) must run
        sys.exit(code)
    import logging  # loaded by then; imported here to keep this module's load minimal

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a broken pipe, a closed stream
            stream.flush()
    os._exit(code)
