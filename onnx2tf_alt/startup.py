"""Garbage collection while a console run loads its modules.

Importing TensorFlow creates over a million Python objects and, on the way, sets off
collections of the oldest generation that walk all of them: 5 in a small model's `-dms`
run (tests/data/mobilenet_block.onnx), about 0.3 s of it, and every later one walks them
again. Loading modules makes next to no cyclic garbage, so the console entry
(cli/entry.py) switches automatic collection off before anything loads (`pause`), and the
conversion switches it back on once TensorFlow is loaded (`resume`), first moving every
object made so far into the permanent generation (`gc.freeze`), which later collections
skip. A process that imports onnx2tf_alt as a library keeps its own collection settings:
without `pause`, `resume` does nothing.
"""

from __future__ import annotations

import gc

_paused = [False]


def pause() -> None:
    """Automatic collection off until `resume` (the console entry, before its imports)."""
    if gc.isenabled():
        gc.disable()
        _paused[0] = True


def resume() -> None:
    """After `pause`: what exists now is frozen out of later collections, which are back on."""
    if _paused[0]:
        _paused[0] = False
        gc.freeze()
        gc.enable()
