"""The op census of a .tflite file, read straight from its flatbuffer (no interpreter)."""

from __future__ import annotations

from onnx2tf_alt.tflite.flatbuffer import OP_NAMES, builtin_codes, read_model, schema


def tflite_op_counts(path: str) -> dict[str, int]:
    """Operator name -> how many times it occurs, over every subgraph of `path`."""
    with open(path, "rb") as f:
        model = read_model(f.read())
    names = [_op_name(model.OperatorCodes(i), builtin)
             for i, builtin in enumerate(builtin_codes(model))]
    counts: dict[str, int] = {}
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for o in range(subgraph.OperatorsLength()):
            name = names[subgraph.Operators(o).OpcodeIndex()]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _op_name(code, builtin: int) -> str:
    if builtin == schema.BuiltinOperator.CUSTOM:
        return f"CUSTOM:{code.CustomCode().decode()}"
    return OP_NAMES.get(builtin, f"BUILTIN_{builtin}")
