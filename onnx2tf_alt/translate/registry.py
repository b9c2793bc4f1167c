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
    _load_ops()
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


def _load_ops() -> None:
    """Import every ops module once so their decorators run."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    # Found by name, as plugins: the registry (core) does not depend on the handlers' code.
    ops_pkg = importlib.import_module("onnx2tf_alt.ops")
    for info in pkgutil.iter_modules(ops_pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"onnx2tf_alt.ops.{info.name}")
