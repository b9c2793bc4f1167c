"""One convolution (bias and ReLU fused) or one linear layer run by onnxruntime and by the
float32 .tflite our CLI writes for it (one CONV_2D, or one FULLY_CONNECTED, on XNNPACK),
interleaved at 1 and 2 threads: where a CNN's or a transformer encoder's file is slower
than onnxruntime with nothing but these ops, this says whether the kernel is the limit.

    python benchmarks/kernel_limits.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from onnx2tf_alt.batching.latency import interleaved_medians

# (name, in channels, out channels, size, kernel): ResNet's and MobileNet's shapes; a
# kernel of 0 is a MatMul + Add of `size` tokens (ViT-B/32's 50, BERT's 128)
CASES = [("3x3 64->64 @56", 64, 64, 56, 3), ("1x1 256->64 @56", 256, 64, 56, 1),
         ("3x3 256->256 @14", 256, 256, 14, 3), ("1x1 512->2048 @7", 512, 2048, 7, 1),
         ("linear 768->3072 x50", 768, 3072, 50, 0), ("linear 3072->768 x50", 3072, 768, 50, 0),
         ("linear 384->1536 x128", 384, 1536, 128, 0)]


def conv_model(cin: int, cout: int, size: int, kernel: int, rng) -> onnx.ModelProto:
    if not kernel:
        return linear_model(cin, cout, size, rng)
    w = (rng.standard_normal((cout, cin, kernel, kernel)) * 0.05).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[kernel // 2] * 4),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cout, size, size])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def linear_model(cin: int, cout: int, tokens: int, rng) -> onnx.ModelProto:
    w = (rng.standard_normal((cin, cout)) * 0.05).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, tokens, cin])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, tokens, cout])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    from ai_edge_litert.interpreter import Interpreter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for name, cin, cout, size, kernel in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "conv.onnx" if kernel else "linear.onnx")
            onnx.save(conv_model(cin, cout, size, kernel, rng), path)
            subprocess.run([sys.executable, "-m", "onnx2tf_alt", "-i", path, "-o", tmp, "-n"],
                           check=True, capture_output=True)
            if kernel:
                x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
                x_last = np.ascontiguousarray(np.transpose(x, (0, 2, 3, 1)))
            else:
                x = x_last = rng.standard_normal((1, size, cin)).astype(np.float32)
            gflop = 2 * cin * cout * max(kernel, 1) ** 2 * size * (size if kernel else 1) / 1e9
            for threads in (1, 2):
                options = ort.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                stem = "conv" if kernel else "linear"
                runner = Interpreter(model_path=os.path.join(tmp, f"{stem}_float32.tflite"),
                                     num_threads=threads).get_signature_runner()
                key = next(iter(runner.get_input_details()))
                feeds, feeds_last = {"x": x}, {key: x_last}
                ms = interleaved_medians({
                    "ort": lambda s=session, f=feeds: s.run(None, f),
                    "tflite": lambda r=runner, f=feeds_last: r(**f)}, args.runs)
                print(f"{name:18s} {threads}t  onnxruntime {ms['ort']:.3f} ms "
                      f"({gflop / ms['ort'] * 1e3:.0f} GFLOP/s)  tflite {ms['tflite']:.3f} ms "
                      f"({gflop / ms['tflite'] * 1e3:.0f} GFLOP/s)  ratio "
                      f"{ms['tflite'] / ms['ort']:.2f}", flush=True)


if __name__ == "__main__":
    main()
