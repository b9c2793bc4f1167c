"""TFLite Micro's interpreter in a process of its own, for export/micro.py.

A failed allocation can crash TFLite Micro (a null dereference after "Failed to allocate
temp memory", seen while bisecting arena sizes), which must not take the conversion with
it. The process is started as a script (`python -I micro_worker.py`), so it imports numpy
and tflite_micro only. It reads one JSON command per line on stdin and answers each with
one JSON line on stdout; what TFLite Micro prints goes to the command's `log` file.

A command: `model` (a .tflite path), `arena` (bytes), `log` (a path); to run samples also
`feeds` (an .npz with `s<k>_i<j>`: sample k, input j in the subgraph's order), `samples`,
`outputs` (how many) and `results` (the .npz written with `s<k>_o<j>`). The answer:
`{"ok": true}` or `{"ok": false, "error": ...}`.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def _execute(runtime, model: bytes, command: dict) -> dict:
    interpreter = runtime.Interpreter.from_bytes(model, arena_size=command["arena"])
    if not command.get("feeds"):
        return {"ok": True}
    feeds = np.load(command["feeds"])
    results = {}
    for k in range(command["samples"]):
        for j in range(command["inputs"]):
            interpreter.set_input(feeds[f"s{k}_i{j}"], j)
        interpreter.invoke()
        for j in range(command["outputs"]):
            results[f"s{k}_o{j}"] = interpreter.get_output(j)
    np.savez(command["results"], **results)
    interpreter.print_allocations()  # the recording allocator's account, into the log
    return {"ok": True}


def main() -> None:
    from tflite_micro.python.tflite_micro import runtime

    answers = os.fdopen(os.dup(1), "w")
    models: dict[str, bytes] = {}
    for line in sys.stdin:
        command = json.loads(line)
        if command["model"] not in models:
            with open(command["model"], "rb") as f:
                models[command["model"]] = f.read()
        log = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        try:
            answer = _execute(runtime, models[command["model"]], command)
        except Exception as exc:  # noqa: BLE001 - the caller reads the log for the cause
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
