"""The console run's supervisor (cli/supervisor.py): a child that crashes in native code or
does not stop in time is cleaned up after by its parent.

The children here are real forked processes that crash (SIGSEGV, as TF's quantizer did on
data it could not calibrate) or hold the thread in a C call (as TF's quantizer holds a
signal back for a minute); each case runs in a Python process of its own, so pytest's
worker is never forked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cli_runner import leftovers, tree

SCRIPT = textwrap.dedent("""
    import ctypes, os, signal, sys, tempfile
    from onnx2tf_alt import supervision
    from onnx2tf_alt.cli.supervisor import run_supervised
    from onnx2tf_alt.export.publish import OutputFolder
    from onnx2tf_alt.logs import phase, quiet_native_stderr

    out, mode, temp = sys.argv[1], sys.argv[2], sys.argv[3]

    def work():
        quiet_native_stderr()  # as the CLI's run does
        folder = OutputFolder(out, "m")
        with phase("quantized files"), folder.staging() as stage:
            open(os.path.join(stage, "m_float32.tflite"), "wb").write(b"half-written")
            os.write(2, b"scale out of expressed type range\\n")  # what native code said
            print("ready", flush=True)
            if mode == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            libc = ctypes.CDLL(None)
            while True:  # a C call that never reaches a safe point
                libc.sleep(60)
        return 0

    sys.exit(run_supervised(work, out, "m", None, ["onnx2tf-alt", "-i", "m.onnx"], temp))
""")


def _start(tmp_path, mode: str) -> tuple[subprocess.Popen, str]:
    out = tmp_path / "out"
    out.mkdir()
    (out / "labels.txt").write_text("user data")
    temp = tmp_path / "run_tmp"
    temp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), mode, str(temp)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, str(out)


def test_a_native_crash_leaves_no_staging_and_writes_the_failure_report(tmp_path):
    proc, out = _start(tmp_path, "crash")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    first = err.strip().splitlines()[0]
    assert first.startswith("error: the conversion crashed in native code (SIGSEGV) during "
                            "'quantized files', in TensorFlow's TFLite converter"), err
    report = json.loads((tmp_path / "out" / "reports" / "m" / "conversion_errors.json")
                        .read_text())
    assert report["crash"]["signal"] == "SIGSEGV"
    assert report["crash"]["phase"] == "quantized files"
    assert report["crash"]["native_stderr_tail"] == ["scale out of expressed type range"]
    assert set(tree(out)) == {"labels.txt", "reports/m/conversion_errors.json",
                              "reports/m/manifest.json"}
    assert leftovers(tmp_path, out) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_takes_effect_within_seconds_when_native_code_holds_the_thread(tmp_path,
                                                                                  signum):
    proc, out = _start(tmp_path, "hang")
    start = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - start
    assert proc.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    name = signal.Signals(signum).name
    assert lines[0] == (f"{name} received during 'quantized files': stopping (within 4 s; a "
                        "second signal stops at once)"), err
    assert lines[-1].startswith(f"interrupted ({name}): stopped during 'quantized files'"), err
    assert took < 5.0, took
    assert tree(out) == {"labels.txt": tree(out)["labels.txt"]}
    assert leftovers(tmp_path, out) == []


def test_a_second_signal_stops_at_once(tmp_path):
    proc, out = _start(tmp_path, "hang")
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 2.0
    assert leftovers(tmp_path, out) == []


def test_staging_folders_of_a_dead_process_are_removed_by_the_next_run(tmp_path):
    from onnx2tf_alt.export.publish import OutputFolder, staging_prefix

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    stale = tmp_path / f"{staging_prefix(pid)}abc"
    stale.mkdir()
    (stale / "x_float32.tflite").write_bytes(b"half-written")
    alive = tmp_path / f"{staging_prefix(os.getppid())}def"  # pytest's parent: alive
    alive.mkdir()
    with OutputFolder(tmp_path / "out", "x").staging():
        pass
    assert not stale.exists()
    assert alive.is_dir()
