"""A one-line progress bar over the graph's nodes, drawn only on a terminal."""

from __future__ import annotations

import sys
import time

from onnx2tf_alt.interrupts import checkpoint


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0 and self.stream.isatty()
        self.total = total
        self.done = 0
        self._last_draw = 0.0

    def step(self, node) -> None:
        checkpoint()  # a requested stop ends the build between two nodes
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw < 0.05 and self.done < self.total:
            return
        self._last_draw = now
        width = 30
        filled = width * self.done // self.total
        label = f"{node.op_type} {node.name}"[:40]
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label:<40}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
