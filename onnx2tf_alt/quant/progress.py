"""One line of progress over the quantized files, with an ETA, drawn only on a terminal
(as the translation's progress bar)."""

from __future__ import annotations

import time

from onnx2tf_alt.translate.progress import Progress


class FileProgress(Progress):
    """`quantizing 2/5: <file> (ETA 12 s)`: the ETA is the mean time of the files already
    made times the files left, this one included."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        super().__init__(total, enabled, stream)
        self._started = time.monotonic()
        self._width = 0

    def begin(self, name: str) -> None:
        """Say that the next file, `name`, is being made."""
        if not self.enabled:
            self.done += 1
            return
        eta = ""
        if self.done:
            each = (time.monotonic() - self._started) / self.done
            eta = f" (ETA {each * (self.total - self.done):.0f} s)"
        self.done += 1
        line = f"quantizing {self.done}/{self.total}: {name}{eta}"
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Clear the line: the report's table follows."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
