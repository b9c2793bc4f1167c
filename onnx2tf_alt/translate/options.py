"""Conversion options that change how handlers lower ops (read as `ctx.options` in a handler).

One small frozen object travels from `convert` / `build` through the builder to every
NodeContext, so a rebuild of the same conversion (float32 compute, quantization) lowers
exactly as the first build did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from onnx2tf_alt.errors import InputError

log = logging.getLogger("onnx2tf_alt")

INLINE_CONSTANT_LIMIT = 1024  # elements; larger constants become layer weights

# -rtpo names, as onnx2tf spells them (matched case-insensitively), -> the ONNX op whose
# delegate-friendly lowering they select. The replacement is in the op's handler.
PSEUDO_OPERATORS: dict[str, str] = {
    "gelu": "Gelu",
    "hardswish": "HardSwish",
    "leakyrelu": "LeakyRelu",
    "prelu": "PRelu",
    "pow": "Pow",
    "power": "Pow",
}
# the other onnx2tf names: accepted, nothing to replace (why, for the log)
NOT_REPLACED: dict[str, str] = {
    "erf": "Erf is always a rational polynomial of builtins, |error| < 4e-7",
    "abs": "Abs is always ABS",
    "neg": "Neg is always NEG",
    "gathernd": "GatherND is always one GATHER with flattened indices",
    "matmulinteger": "MatMulInteger is always a float MATMUL where that is exact",
    "asin": "Asin stays ATAN2 of exact builtins",
    "acos": "Acos stays ATAN2 of exact builtins",
    "atan": "Atan stays ATAN2 of exact builtins",
    "inverse": "Inverse has no handler here",
}


@dataclass(frozen=True)
class ConversionOptions:
    """What the user chose about lowering; the defaults are the fastest exact lowering."""

    # -dgc: grouped Conv as SPLIT + one CONV_2D per group + CONCATENATION (for runtimes
    # whose conv has no groups, e.g. TF.js) instead of one grouped CONV_2D
    disable_group_convolution: bool = False
    # -rtpo: ONNX op types lowered to the simplest builtins (see PSEUDO_OPERATORS)
    pseudo_operators: frozenset[str] = frozenset()
    # the graph a quantizer starts from (quant/quantize.py's prepared sources): the direct
    # writer makes only the speed folds that keep every quantization grid as fine
    # (tflite/direct_rewrites.rewrite's for_quantization)
    for_quantization: bool = False

    def replaces(self, op_type: str) -> bool:
        """Whether -rtpo asked for the delegate-friendly lowering of `op_type`."""
        return op_type in self.pseudo_operators


DEFAULT_OPTIONS = ConversionOptions()


def pseudo_operators(names: Iterable[str] | None) -> frozenset[str]:
    """The ONNX op types selected by -rtpo NAME... (onnx2tf's names, any case)."""
    chosen = set()
    for name in names or []:
        key = name.strip().lower()
        if key in PSEUDO_OPERATORS:
            chosen.add(PSEUDO_OPERATORS[key])
        elif key in NOT_REPLACED:
            log.info("-rtpo %s: nothing to replace (%s)", name, NOT_REPLACED[key])
        else:
            known = sorted({*PSEUDO_OPERATORS, *NOT_REPLACED})
            raise InputError(f"-rtpo/--replace_to_pseudo_operators: unknown operator "
                             f"'{name}'; choose from {', '.join(known)}.")
    return frozenset(chosen)
