"""An ONNX model with its symbolic dims fixed, for the zoo (peer_zoo.py times every model at
one static shape, as both converters then plan it).

    python benchmarks/static_shapes.py IN.onnx OUT.onnx DIM=VALUE [DIM=VALUE ...]

DIM is a dim_param as the exporter wrote it (`batch`, `sequence`, `past_sequence`,
`past_sequence + sequence`); every input and output dim of that name gets VALUE. E.g. a KV
decode step of export_decoder_kv.py with 127 cached positions:

    python benchmarks/static_shapes.py llama_kv.onnx llama_decode.onnx batch=1 sequence=1 \\
        past_sequence=127 "past_sequence + sequence=128"
"""

from __future__ import annotations

import sys

import onnx


def fixed(model: onnx.ModelProto, values: dict[str, int]) -> onnx.ModelProto:
    for info in [*model.graph.input, *model.graph.output]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]
    unset = sorted({d.dim_param for i in model.graph.input
                    for d in i.type.tensor_type.shape.dim if d.dim_param})
    if unset:
        raise SystemExit(f"still symbolic: {unset}")
    del model.graph.value_info[:]  # inferred again for the fixed dims
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model


def main() -> None:
    source, target, *pairs = sys.argv[1:]
    values = {k: int(v) for k, v in (p.rsplit("=", 1) for p in pairs)}
    onnx.save(fixed(onnx.load(source), values), target)


if __name__ == "__main__":
    main()
