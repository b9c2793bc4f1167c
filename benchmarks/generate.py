"""Greedy decoding with a converted decoder against onnxruntime on the same ONNX: tokens,
per-step logits agreement and tokens/s, side by side in one run.

    python benchmarks/generate.py MODEL.onnx FILE.tflite [FILE.tflite ...]
        [--prompt 8] [--new 32] [--threads 1 2] [--seed 0]

MODEL.onnx is a decoder with one input of token ids [1, sequence] (sequence symbolic) and
logits [1, sequence, vocab] first among its outputs, e.g. benchmarks/export_llama.py's.
Each .tflite is a conversion of it (float32, float16, dynamic range). No tokenizer: a
random prompt of --prompt token ids, then --new greedy tokens. There is no KV cache yet
(issue 30): every step runs the whole sequence again, on both sides alike.

Per file it prints the tokens that differ from onnxruntime's (first position and count),
the logits cosine per step against onnxruntime's on the same prefix (onnxruntime's tokens
fed to both, so one early difference does not shift every later step), and tokens/s at
each thread count for the file and for onnxruntime, measured interleaved.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


class OnnxDecoder:
    def __init__(self, path: str, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.name: ids[None].astype(np.int64)})[0][0, -1]


class TfliteDecoder:
    def __init__(self, path: str, threads: int):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=path, num_threads=threads)
        detail = self.interpreter.get_input_details()[0]
        self.index, self.dtype = detail["index"], detail["dtype"]
        outputs = self.interpreter.get_output_details()
        self.output = max(outputs, key=lambda d: int(np.prod(d["shape_signature"].clip(1))))
        self.length = None

    def logits(self, ids: np.ndarray) -> np.ndarray:
        if self.length != len(ids):  # one token more each step: new shapes
            self.interpreter.resize_tensor_input(self.index, [1, len(ids)])
            self.interpreter.allocate_tensors()
            self.length = len(ids)
        self.interpreter.set_tensor(self.index, ids[None].astype(self.dtype))
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"])[0, -1]


def greedy(decoder, prompt: np.ndarray, new: int) -> tuple[list[int], float]:
    """`new` greedy tokens after `prompt`, and the seconds they took."""
    ids = list(prompt)
    start = time.perf_counter()
    for _ in range(new):
        ids.append(int(np.argmax(decoder.logits(np.array(ids)))))
    return ids[len(prompt):], time.perf_counter() - start


def cosines(decoder, reference, prompt: np.ndarray, tokens: list[int]) -> list[float]:
    """Per step, the cosine of `decoder`'s last logits and `reference`'s on the prefix
    made of the prompt and `tokens` (the reference's)."""
    found = []
    for step in range(len(tokens)):
        ids = np.concatenate([prompt, np.array(tokens[:step], np.int64)])
        a, b = decoder.logits(ids).astype(np.float64), reference.logits(ids).astype(np.float64)
        found.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx")
    parser.add_argument("tflite", nargs="+")
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    reference = OnnxDecoder(args.onnx, args.threads[0])
    vocab = reference.session.get_outputs()[0].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 1000
    prompt = np.random.default_rng(args.seed).integers(0, vocab, args.prompt).astype(np.int64)
    expected, _ = greedy(reference, prompt, args.new)
    print(f"onnxruntime tokens: {expected}")
    for path in args.tflite:
        decoder = TfliteDecoder(path, args.threads[0])
        tokens, _ = greedy(decoder, prompt, args.new)
        differ = [i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b]
        agree = 1 - len(differ) / len(expected)
        cos = cosines(decoder, reference, prompt, expected)
        print(f"{path}: {agree:.0%} of {len(expected)} tokens as onnxruntime's"
              + (f" (first difference at {differ[0]})" if differ else "")
              + f"; logits cosine per step min {min(cos):.6f}, mean {np.mean(cos):.6f}")
        for threads in args.threads:
            ours = TfliteDecoder(path, threads)
            theirs = OnnxDecoder(args.onnx, threads)
            pairs = [(greedy(ours, prompt, args.new)[1], greedy(theirs, prompt, args.new)[1])
                     for _ in range(2)]
            ours_s, theirs_s = min(p[0] for p in pairs), min(p[1] for p in pairs)
            print(f"  {threads} thread(s): {args.new / ours_s:.1f} tokens/s, onnxruntime "
                  f"{args.new / theirs_s:.1f} tokens/s (time ratio {ours_s / theirs_s:.2f})")


if __name__ == "__main__":
    main()
