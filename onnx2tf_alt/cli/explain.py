"""Where the transposes of a conversion come from, for any ONNX model:

    python -m onnx2tf_alt.cli.explain [--tflite] model.onnx [...]

For each model: the layout plan's relayouts, grouped (onnx2tf_alt/layout/explain.py), and a
summary line; with --tflite the model is also lowered to a float32 .tflite and each of its
TRANSPOSE ops is attributed (plan / inside a handler / TF's converter). A conversion at
`-v debug` logs the same lines.
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="model.onnx")
    parser.add_argument("--tflite", action="store_true", help="explain the .tflite's TRANSPOSEs")
    args = parser.parse_args(argv)

    from onnx2tf_alt.layout.explain import describe
    from onnx2tf_alt.pipeline import build

    for path in args.models:
        converted = build(path)
        ops = None
        if args.tflite:
            from onnx2tf_alt.export.delegates import analyze
            from onnx2tf_alt.tflite.lowering import tflite_bytes

            content = tflite_bytes(converted.tflite_result())
            ops = analyze(content, converted.tflite_result(), converted.graph).ops
        print(f"== {path}")
        for line in describe(converted.graph, converted.plan, ops):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
