"""Greedy decoding with a converted decoder against onnxruntime on the same ONNX: tokens,
per-step logits agreement, prefill time and decode tokens/s, side by side in one run.

    python benchmarks/generate.py MODEL.onnx FILE.tflite [FILE.tflite ...]
        [--encoder ENCODER.onnx] [--first DECODER.onnx] [--prompt 16] [--new 32]
        [--threads 1 2] [--seed 0]

Two kinds of decoder, told apart by their inputs:
- with a KV cache: MODEL.onnx takes `input_ids`, `attention_mask`, `position_ids` and
  `past...` inputs and returns `logits` and `present...` (benchmarks/export_decoder_kv.py);
  onnxruntime runs it with the past growing by concatenation, as exported. Each .tflite is
  its conversion with `--kv_cache_capacity N --signature prefill input_ids:1,P --signature
  decode input_ids:1,1`: the prompt (P = --prompt tokens) goes through `prefill`, each new
  token through `decode`, and every step's new keys/values are written into the cache at
  its position (names and shapes from the `<stem>_io_layout.json` beside the file);
  onnxruntime's model builder writes the same form without position ids, and with
  GroupQueryAttention inside (benchmarks/export_builder.py);
- without: one input of token ids [1, sequence] (benchmarks/export_llama.py); every step
  runs the whole sequence again, on both sides alike.

With --encoder (a speech model, benchmarks/export_whisper_kv.py): random input features go
through ENCODER.onnx in onnxruntime and through the file's `encode` signature, and each side
feeds its own encoder output to every decoder step (`encoder_hidden_states`). A text
encoder (T5's, BART's: `input_ids` in) gets --source random ids below --vocab and a mask of
ones, which its decoder takes as `encoder_attention_mask`.

With --first (Optimum's pair: `decoder_model.onnx` for the prompt, MODEL.onnx =
`decoder_with_past_model.onnx` for each new token): onnxruntime runs the prompt through
DECODER.onnx, the file through its `prefill` signature (converted from the same file); a
present output that the next steps take back unchanged (Whisper's cross-attention keys and
values, computed once from the encoder's output) is kept and fed to every decode step.

No tokenizer: a random prompt of --prompt token ids, then --new greedy tokens. Per file: how
many tokens are onnxruntime's, the logits cosine per step on onnxruntime's tokens (fed to
both, so one early difference does not shift every later step), and at each thread count
the prefill time and decode tokens/s of the file and of onnxruntime, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _session(path: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class OnnxDecoder:
    def __init__(self, path: str, threads: int, encoder: str | None = None,
                 features: np.ndarray | None = None, first: str | None = None):
        self.session, self.path = _session(path, threads), path
        self.first = first and _session(first, threads)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.cached = any(n.startswith("past") for n in self.inputs)
        self.encoder, self.features = encoder and _session(encoder, threads), features
        self.extra = {}

    def start(self, prompt: np.ndarray) -> np.ndarray:
        if self.encoder is not None:
            names = [i.name for i in self.encoder.get_inputs()]
            self.extra = {"encoder_hidden_states": self.encoder.run(
                None, encoder_feeds(names, self.features))[0], **encoder_mask(self.features)}
        if not self.cached:
            self.ids = list(prompt)
            return self.step(None)
        self.past = {name: np.zeros(self._empty_past(i.shape), np.float32)
                     for name, i in self.inputs.items() if name.startswith("past")}
        self.length = 0
        return self._run(prompt, self.first)

    def _empty_past(self, shape: list) -> list[int]:
        """[1, heads, 0, head size]: a symbolic head size (onnxruntime's model builder writes
        `kv_cache_dim`) read from the genai_config.json beside the model."""
        dims = [1, *[d if isinstance(d, int) else 0 for d in shape[1:]]]
        if dims[3] == 0:
            with open(os.path.join(os.path.dirname(self.path), "genai_config.json")) as f:
                dims[3] = json.load(f)["model"]["decoder"]["head_size"]
        return dims

    def step(self, token: int | None) -> np.ndarray:
        if not self.cached:
            if token is not None:
                self.ids.append(token)
            ids = np.array(self.ids, np.int64)[None]
            return self.session.run(None, {next(iter(self.inputs)): ids})[0][0, -1]
        return self._run(np.array([token]))

    def _run(self, ids: np.ndarray, session=None) -> np.ndarray:
        session = session or self.session
        total = self.length + len(ids)
        feeds = {"input_ids": ids[None].astype(np.int64),
                 "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.arange(self.length, total, dtype=np.int64)[None], **self.past,
                 # Optimum's merged decoder: the branch with past once there is one
                 "use_cache_branch": np.array([self.length > 0]), **self.extra}
        taken = {i.name for i in session.get_inputs()}  # builder: no position ids
        out = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {k: v for k, v in feeds.items() if k in taken})))
        # a past the step returns no present for (cross-attention's) is kept as it is, as
        # is one it returns empty (Optimum's merged encoder-decoders: a placeholder)
        presents = {name: out.get("present" + name[name.index("."):]) for name in self.past}
        self.past = {name: value if presents[name] is None or not presents[name].size
                     else presents[name] for name, value in self.past.items()}
        self.length = total
        return out["logits"][0, -1]


def encoder_feeds(names: list[str], features: np.ndarray) -> dict[str, np.ndarray]:
    """The encoder's inputs: `features` as its first, and an all-ones attention mask where
    it takes one (a text encoder: T5's, BART's)."""
    feeds = {names[0]: features}
    if "attention_mask" in names[1:]:
        feeds["attention_mask"] = np.ones(features.shape[:2], np.int64)
    return feeds


def encoder_mask(features: np.ndarray) -> dict[str, np.ndarray]:
    """A text encoder's mask as its decoder takes it (`encoder_attention_mask`; a speech
    encoder's decoder takes none: the signature's inputs filter it out)."""
    if features.dtype != np.int64:
        return {}
    return {"encoder_attention_mask": np.ones(features.shape[:2], np.int64)}


class TfliteDecoder:
    """A converted decoder: with `prefill` / `decode` signatures and a fixed-capacity cache,
    or one signature run on the whole sequence each step."""

    def __init__(self, path: str, threads: int, features: np.ndarray | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=path, num_threads=threads)
        self.cached = "decode" in self.interpreter.get_signature_list()
        if self.cached:
            stem = os.path.basename(path).removesuffix(".tflite")
            for suffix in ("_float32", "_float16", "_dynamic_range_quant", "_int4_weight_quant"):
                stem = stem.removesuffix(suffix)
            with open(os.path.join(os.path.dirname(path), f"{stem}_io_layout.json")) as f:
                layout = json.load(f)
            self.signatures = {name: _Signature(self.interpreter, name, entries)
                               for name, entries in layout["signatures"].items()}
            self.features, self.extra = features, {}
            self.axis = {e["past"]: e["axis"] for e in layout["signatures"]["decode"]["kv_cache"]}
        else:
            detail = self.interpreter.get_input_details()[0]
            self.index, self.dtype = detail["index"], detail["dtype"]
            outputs = self.interpreter.get_output_details()
            self.output = max(outputs, key=lambda d: int(np.prod(d["shape_signature"].clip(1))))

    def start(self, prompt: np.ndarray) -> np.ndarray:
        if not self.cached:
            self.ids = list(prompt)
            return self.step(None)
        prefill, decode = self.signatures["prefill"], self.signatures["decode"]
        self.capacity = next(decode.shapes[name][axis] for name, axis in self.axis.items())
        if len(prompt) != prefill.shapes["input_ids"][1]:
            raise SystemExit(f"the prefill signature takes {prefill.shapes['input_ids'][1]} "
                             f"tokens: run with --prompt {prefill.shapes['input_ids'][1]}")
        self.cache = {name: np.zeros(decode.shapes[name], np.float32) for name in self.axis}
        self.length = 0
        if "encode" in self.signatures:
            encoder = self.signatures["encode"]
            encoded = encoder.run(encoder_feeds(list(encoder.inputs), self.features))
            self.extra = {"encoder_hidden_states": next(iter(encoded.values())),
                          **encoder_mask(self.features)}
        return self._run(prefill, prompt)

    def step(self, token: int | None) -> np.ndarray:
        if self.cached:
            return self._run(self.signatures["decode"], np.array([token]))
        if token is not None:
            self.ids.append(token)
        self.interpreter.resize_tensor_input(self.index, [1, len(self.ids)])
        self.interpreter.allocate_tensors()
        self.interpreter.set_tensor(self.index, np.array(self.ids, self.dtype)[None])
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"])[0, -1]

    def _run(self, signature, ids: np.ndarray) -> np.ndarray:
        start, end = self.length, self.length + len(ids)
        if end > self.capacity:
            raise SystemExit(f"the cache holds {self.capacity} positions: fewer --new tokens")
        mask = np.zeros((1, self.capacity + len(ids)), np.int64)
        mask[0, :start] = 1
        mask[0, self.capacity:] = 1
        feeds = {"input_ids": ids[None], "attention_mask": mask,
                 "position_ids": np.arange(start, end)[None], **self.cache, **self.extra}
        out = signature.run({k: v for k, v in feeds.items() if k in signature.inputs})
        for name, axis in self.axis.items():
            where = [slice(None)] * self.cache[name].ndim
            where[axis] = slice(start, end)
            self.cache[name][tuple(where)] = out["present" + name[name.index("."):]]
        for name in self.signatures["decode"].inputs:  # kept: cross-attention's
            kept = "present" + name[name.index("."):] if name.startswith("past") else None
            if name not in self.axis and kept in out:
                self.extra[name] = out[kept]
        self.length = end
        return out["logits"][0, -1]


class _Signature:
    """One signature run through the interpreter's tensors (allocated once, no resizing)."""

    def __init__(self, interpreter, name: str, layout: dict):
        self.wrapper = interpreter._interpreter
        runner = interpreter.get_signature_runner(name)
        details = runner.get_input_details()
        self.subgraph = runner._subgraph_index
        self.inputs = {e["onnx_name"]: (details[e["tflite_name"]]["index"],
                                        details[e["tflite_name"]]["dtype"])
                       for e in layout["inputs"]}
        self.shapes = {e["onnx_name"]: e["onnx_shape"] for e in layout["inputs"]}
        self.perms = {e["onnx_name"]: e["perm"] for e in layout["inputs"] + layout["outputs"]}
        outputs = runner.get_output_details()
        self.outputs = {e["onnx_name"]: outputs[e["tflite_name"]]["index"]
                        for e in layout["outputs"]}
        self.wrapper.AllocateTensors(self.subgraph)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ONNX-layout values in and out (each tensor's perm from the io_layout.json)."""
        for name, value in feeds.items():
            index, dtype = self.inputs[name]
            value = np.transpose(value, self.perms[name])
            self.wrapper.SetTensor(index, np.ascontiguousarray(value, dtype), self.subgraph)
        self.wrapper.Invoke(self.subgraph)
        return {name: np.transpose(self.wrapper.GetTensor(index, self.subgraph),
                                   np.argsort(self.perms[name]))
                for name, index in self.outputs.items()}


def greedy(decoder, prompt: np.ndarray, new: int, forced: list[int] | None = None):
    """`new` greedy tokens after `prompt` (or `forced` ones fed instead), each step's logits,
    and the prefill and decode seconds."""
    start = time.perf_counter()
    logits = [decoder.start(prompt)]
    prefilled = time.perf_counter()
    tokens = []
    for step in range(new):
        tokens.append(int(np.argmax(logits[-1])) if forced is None else forced[step])
        if step + 1 < new:
            logits.append(decoder.step(tokens[-1]))
    return tokens, logits, prefilled - start, time.perf_counter() - prefilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx")
    parser.add_argument("tflite", nargs="+")
    parser.add_argument("--encoder", help="an encoder-decoder's encoder (see the docstring)")
    parser.add_argument("--first", help="Optimum's decoder_model.onnx, for the prompt")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=int, default=12,
                        help="a text encoder's input length (its encode signature's)")
    parser.add_argument("--start", type=int, default=None,
                        help="the prompt's first token (decoder_start_token_id: T5's 0)")
    parser.add_argument("--vocab", type=int, default=512,
                        help="a text encoder's input ids are drawn below this")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    features = None
    if args.encoder:
        first = _session(args.encoder, 1).get_inputs()[0]
        if "int" in first.type:  # a text encoder: --source random token ids
            features = rng.integers(2, args.vocab, (1, args.source)).astype(np.int64)
        else:
            features = rng.normal(size=[1, *first.shape[1:]]).astype(np.float32)
    reference = OnnxDecoder(args.onnx, args.threads[0], args.encoder, features, args.first)
    vocab = reference.session.get_outputs()[0].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 1000
    prompt = rng.integers(0, vocab, args.prompt).astype(np.int64)
    if args.start is not None:  # an encoder-decoder's decoder starts from its start token
        prompt[0] = args.start
    expected, expected_logits, _, _ = greedy(reference, prompt, args.new)
    print(f"onnxruntime tokens: {expected}")
    for path in args.tflite:
        decoder = TfliteDecoder(path, args.threads[0], features)
        tokens = greedy(decoder, prompt, args.new)[0]
        differ = [i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b]
        forced = greedy(decoder, prompt, args.new, forced=expected)[1]
        cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
               for a, b in zip((f.astype(np.float64) for f in forced),
                               (e.astype(np.float64) for e in expected_logits))]
        # where the file picks another token on onnxruntime's prefix: how far apart
        # onnxruntime's own logits put the two (in units of their standard deviation)
        margins = [float((e[e.argmax()] - e[f.argmax()]) / e.std())
                   for f, e in zip(forced, expected_logits) if f.argmax() != e.argmax()]
        print(f"{path}: {len(expected) - len(differ)} of {len(expected)} tokens as "
              "onnxruntime's" + (f" (first difference at {differ[0]})" if differ else "")
              + f"; logits cosine per step min {min(cos):.6f}, mean {np.mean(cos):.6f}"
              + (f"; {len(margins)} step(s) pick another token on onnxruntime's prefix, "
                 f"where its top two logits differ by at most {max(margins):.3f} std"
                 if margins else ""))
        for threads in args.threads:
            ours = TfliteDecoder(path, threads, features)
            theirs = OnnxDecoder(args.onnx, threads, args.encoder, features, args.first)
            runs = [(greedy(ours, prompt, args.new)[2:], greedy(theirs, prompt, args.new)[2:])
                    for _ in range(3)]
            (p_ours, d_ours), (p_theirs, d_theirs) = (
                tuple(min(r[side][k] for r in runs) for k in (0, 1)) for side in (0, 1))
            steps = max(1, args.new - 1)
            print(f"  {threads} thread(s): prefill {p_ours * 1e3:.1f} ms (onnxruntime "
                  f"{p_theirs * 1e3:.1f} ms, ratio {p_ours / p_theirs:.2f}); decode "
                  f"{steps / d_ours:.1f} tokens/s (onnxruntime {steps / d_theirs:.1f}, time "
                  f"ratio {d_ours / d_theirs:.2f})")


if __name__ == "__main__":
    main()
