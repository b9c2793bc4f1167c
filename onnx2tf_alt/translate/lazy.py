"""TensorFlow and tf_keras for the handlers, imported when first used.

Every handler module is imported to register its handlers (translate/registry.py), and the
stages before the build (prepare, the unsupported-op check, the layout plan, the direct
TFLite writer of tflite/direct.py) read only the registrations. So that those stages run
without TensorFlow's 3 s and 550 MB, the handler modules name `tf` and `tf_keras` through
these stand-ins: the real module is imported at the first attribute read (a handler
converting a node), and each attribute is then kept on the stand-in. Module-level code of a
handler module must not read an attribute (tests/test_architecture.py imports every handler
module and checks that TensorFlow was not loaded).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import types


class LazyModule(types.ModuleType):
    """A module imported at the first read of one of its attributes, or while `standing_in`
    a namespace that answers for it."""

    def __init__(self, name: str):
        super().__init__(name)
        self._found: dict = {}

    def __getattr__(self, attribute: str):
        stand_in = _STAND_IN.get()
        if stand_in is not None and self.__name__ in stand_in:
            return getattr(stand_in[self.__name__], attribute)
        found = self.__dict__["_found"]
        if attribute not in found:
            found[attribute] = getattr(importlib.import_module(self.__name__), attribute)
        return found[attribute]


_STAND_IN: contextvars.ContextVar[dict | None] = contextvars.ContextVar("stand_in", default=None)


@contextlib.contextmanager
def standing_in(**namespaces):
    """While inside, `tf.X` (or `tf_keras.X`) reads X of the namespace given for it:
    handler code run on the direct writer's tensors (tflite/direct_tensors.py)."""
    names = {{"tf": "tensorflow"}.get(k, k): v for k, v in namespaces.items()}
    token = _STAND_IN.set(names)
    try:
        yield
    finally:
        _STAND_IN.reset(token)


def stand_in(name: str = "tensorflow"):
    """What stands for module `name` now (`standing_in`), or None."""
    return (_STAND_IN.get() or {}).get(name)


tf = LazyModule("tensorflow")
tf_keras = LazyModule("tf_keras")


def call(path: str):
    """`tf.<path>(...)` as a function that finds it when called: what a handler table made
    at import time holds (`call("math.log")`)."""

    def run(*args, **kwargs):
        target = tf
        for part in path.split("."):
            target = getattr(target, part)
        return target(*args, **kwargs)

    run.__name__ = run.__qualname__ = f"tf.{path}"
    return run
