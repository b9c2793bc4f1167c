"""Errors the user can act on.

`InputError` (exit code 2) is raised for problems with what the user gave us: a missing or
malformed file, a bad flag value, an unknown input name. `ConversionError` (exit code 1) is
raised when the model is valid ONNX but one or more nodes cannot be converted; it carries one
`NodeFailure` per failing node so a single run reports all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def printable(text: object) -> str:
    """`text` with control characters and undecodable bytes escaped ('Con\\x10'): names
    read from a corrupt file can hold anything."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


class Onnx2TfError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 1


class InputError(Onnx2TfError):
    """The user's input (file, flag, name) is unusable."""

    exit_code = 2


class UnsupportedFormError(Onnx2TfError):
    """A valid model in a form a rewrite the flags ask for does not recognise (e.g. a KV
    cache --kv_cache_capacity cannot pair): refused rather than converted wrongly."""

    exit_code = 1


@dataclass
class NodeFailure:
    """One node that could not be converted, described well enough to file a bug."""

    node_name: str
    op_type: str
    domain: str
    opset: int
    reason: str
    input_shapes: list = field(default_factory=list)
    input_dtypes: list = field(default_factory=list)
    attributes: dict = field(default_factory=dict)

    def describe(self) -> str:
        domain = printable(self.domain or "ai.onnx")
        io = ", ".join(f"{s} {d}" for s, d in zip(self.input_shapes, self.input_dtypes))
        return (
            f"node '{printable(self.node_name)}' ({domain}::{printable(self.op_type)}, opset "
            f"{self.opset}; inputs: {io or 'none'}): {short_reason(self.reason)}"
        )


def short_reason(reason: str) -> str:
    """The part of an exception message a person needs: TF wraps the cause of a failed op
    between "Exception encountered when calling layer ..." and a dump of the call's
    arguments; keep the cause alone (the full text stays in conversion_errors.json)."""
    text = reason.split("Call arguments received by layer")[0]
    lines = [line for line in text.splitlines()
             if line.strip() and "Exception encountered when calling layer" not in line]
    kind = reason.split(":", 1)[0] + ": " if "Exception encountered" in reason else ""
    text = " ".join(line.strip() for line in lines)
    return printable(kind + text if not text.startswith(kind) else text)


class ConversionError(Onnx2TfError):
    """One or more nodes could not be converted; lists all of them."""

    exit_code = 1

    def __init__(self, failures: list[NodeFailure], headline: str | None = None):
        self.failures = failures
        lines = [headline or f"{len(failures)} node(s) could not be converted:"]
        lines += [f"  - {f.describe()}" for f in failures]
        unsupported = [f for f in failures if f.reason.startswith("unsupported")]
        if unsupported:
            lines.append(
                "No handler exists for these op types in this opset. Replace them in the ONNX "
                "graph (e.g. with onnx-graphsurgeon) or add a handler in ops/ (see "
                "docs/contributing.md)."
            )
        lines += sorted({hint for f in unsupported if (hint := producing_tool(f))})
        super().__init__("\n".join(lines))


def producing_tool(failure: NodeFailure) -> str | None:
    """Where an unsupported op of onnxruntime's domain comes from, and what to do about it."""
    if failure.domain != "com.microsoft":
        return None
    op = printable(failure.op_type)
    quantized = op.startswith(("Q", "DynamicQuantize", "MatMulInteger", "MatMulNBits",
                               "GatherBlockQuantized", "DequantizeLinear"))
    tool = ("onnxruntime's quantization tools (quantize_dynamic / quantize_static / "
            "MatMulNBitsQuantizer)" if quantized else "onnxruntime's transformers optimizer")
    return (f"com.microsoft::{op} comes from {tool}; convert the model as exported, before "
            "that step, or open an issue asking for this op.")
