"""The handler registry: one decorator per ONNX op type, versioned by opset.

A handler registered `since=N` applies from opset N until a later registration for the same
op overrides it, so only opsets where the ONNX spec changed behaviour need a new version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnx2tf_alt.layout.policies import LayoutPolicy, logical


@dataclass(frozen=True)
class Handler:
    op_type: str
    domain: str
    since: int
    fn: Callable
    layout: LayoutPolicy
    limits: str = ""
    # (node, input types) -> output types, for ops ONNX shape inference does not know
    # (other domains); a type is (ONNX elem_type, dims) and dims hold int, str or None.
    infer: Callable | None = None


_REGISTRY: dict[tuple[str, str], list[Handler]] = {}

DEFAULT_DOMAINS = ("", "ai.onnx")


def _domain_key(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def handler(
    op_type: str,
    *,
    since: int = 1,
    domain: str = "",
    layout: LayoutPolicy = logical,
    limits: str = "",
    infer: Callable | None = None,
) -> Callable:
    """Register `fn(ctx)` as the converter of `op_type` from opset `since` on."""

    if not isinstance(layout, LayoutPolicy):
        raise TypeError(f"{op_type}: layout must be a LayoutPolicy (see onnx2tf_alt/layout/policies.py), "
                        f"not {layout!r}")

    def register(fn: Callable) -> Callable:
        versions = _REGISTRY.setdefault((_domain_key(domain), op_type), [])
        versions.append(Handler(op_type, _domain_key(domain), since, fn, layout, limits,
                                infer))
        versions.sort(key=lambda h: h.since)
        return fn

    return register


_DIRECT: dict[tuple[str, str, int], Callable] = {}


def direct(op_type: str, *, since: int = 1, domain: str = "") -> Callable:
    """Register `fn(ctx)` as the direct TFLite writer (tflite/direct.py) of the handler of
    `op_type` registered with the same `since`: it applies where that handler does, and
    lives in the handler's module, sharing its decisions."""

    def register(fn: Callable) -> Callable:
        _DIRECT[(_domain_key(domain), op_type, since)] = fn
        return fn

    return register


def find_direct(op_type: str, domain: str, opset: int) -> Callable | None:
    """The direct writer of the handler version for this opset, or None."""
    found = find_handler(op_type, domain, opset)
    return None if found is None else _DIRECT.get((found.domain, op_type, found.since))


def has_direct(found: Handler) -> bool:
    """Whether this handler version has a direct writer (docs/supported_ops.md)."""
    return (found.domain, found.op_type, found.since) in _DIRECT


def find_handler(op_type: str, domain: str, opset: int) -> Handler | None:
    """The handler version for this opset, or None when the op is not supported."""
    _load_ops((_domain_key(domain), op_type))
    versions = _REGISTRY.get((_domain_key(domain), op_type), [])
    chosen = None
    for h in versions:
        if h.since <= opset:
            chosen = h
    return chosen


def foreign_inference(op_type: str, domain: str, opset: int) -> Callable | None:
    """The handler's output-type inference for an op ONNX shape inference does not know
    (the passes' ForeignInference; loads the handlers only when such an op is met)."""
    found = find_handler(op_type, domain, opset)
    return None if found is None else found.infer


def all_handlers() -> dict[tuple[str, str], list[Handler]]:
    _load_ops()
    return dict(_REGISTRY)


_loaded = False
_imported: set[str] = set()
INDEX_MODULE = "onnx2tf_alt.ops._index"  # generated: python -m onnx2tf_alt.translate.registry


def _load_ops(key: tuple[str, str] | None = None) -> None:
    """Import the ops modules that register `key` ((domain, op_type), from the generated
    index: a model's conversion imports and compiles only the modules of its ops), or
    every ops module once (no key, or one those modules do not register) so their
    decorators run."""
    global _loaded
    if _loaded:
        return
    import importlib

    if key is not None:
        index = importlib.import_module(INDEX_MODULE).MODULES
        for name in index.get(key, ()):
            if name not in _imported:
                _imported.add(name)
                importlib.import_module(f"onnx2tf_alt.ops.{name}")
        if key in _REGISTRY:
            return
    _loaded = True
    for name in ops_modules():
        importlib.import_module(f"onnx2tf_alt.ops.{name}")


def ops_modules() -> list[str]:
    """Every ops module that registers handlers (found by name, as plugins: the registry,
    core, does not depend on the handlers' code)."""
    import importlib
    import pkgutil

    ops_pkg = importlib.import_module("onnx2tf_alt.ops")
    return [info.name for info in pkgutil.iter_modules(ops_pkg.__path__)
            if not info.name.startswith("_")]


def index_source() -> str:
    """The text of ops/_index.py: for each (domain, op_type) the ops modules whose import
    registers a handler version or a direct writer of it (importing them all registers
    every version)."""
    import importlib

    modules = ops_modules()
    found: dict[tuple[str, str], set[str]] = {}
    for name in modules:
        handlers = {(k, id(h)) for k, versions in _REGISTRY.items() for h in versions}
        writers = set(_DIRECT)
        importlib.import_module(f"onnx2tf_alt.ops.{name}")
        added = [(k, h.fn) for k, versions in _REGISTRY.items() for h in versions
                 if (k, id(h)) not in handlers]
        added += [((d, op), _DIRECT[(d, op, v)]) for d, op, v in set(_DIRECT) - writers]
        for key, fn in added:  # the module that defines it, else the one that imported it
            defined = fn.__module__.rpartition(".")[2]
            found.setdefault(key, set()).add(defined if defined in modules else name)
    lines = ['"""For each (domain, op_type), the ops modules that register its handlers and',
             'direct writers (onnx2tf_alt/translate/registry.py imports only those for a',
             'model\'s ops). Generated by `python -m onnx2tf_alt.translate.registry >',
             'ops/_index.py`; tests/translate/test_registry_index.py checks it is current."""',
             "", "MODULES = {"]
    lines += [f"    {key!r}: {tuple(sorted(found[key]))!r}," for key in sorted(found)]
    lines += ["}", ""]
    return "\n".join(lines)


if __name__ == "__main__":  # the registry the ops modules import, not this __main__ copy
    import importlib

    print(importlib.import_module(__spec__.name).index_source(), end="")
