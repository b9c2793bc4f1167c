"""Greedy tokens and decode speed of LiteRT-LM's engine on our `.litertlm` files against
onnxruntime (or onnxruntime-genai's generator) on the ONNX decoder, side by side in one run.

    python benchmarks/litertlm_generate.py MODEL.onnx FILE.litertlm [FILE.litertlm ...]
        [--prompt 16] [--new 32] [--threads 1 2] [--seed 0]

MODEL.onnx's folder holds the tokenizer the files were bundled with: a word-level
tokenizer.json whose token k is a word `<letter><k>` (benchmarks/export_builder.py writes
`t<k>`, tests/generative/test_litertlm.py `w<k>`), so that ids go in and come back through
the engine's text exactly. With genai_config.json in the folder (an onnxruntime-genai
builder model), the reference is onnxruntime-genai's generator; else onnxruntime runs the
ONNX with its past growing (inputs input_ids, attention_mask, position_ids if it has them,
past_key_values.* / past.*).

The prompt: --prompt random ids (the start token first where the tokenizer folder gives
one: the engine adds it). Per file: how many of the --new greedy tokens are the
reference's; per thread count, decode tokens/s of the engine (streamed tokens, from the
first to the last) and of the reference, interleaved, best of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np


def word_tokens(folder: str) -> tuple[str, dict[str, int], list[int]]:
    """The word-level tokenizer's letter, its {word: id}, and the ids a prompt may hold: those
    whose word holds no added token (the tokenizer matches added tokens first: with `w1`
    added, `w17` is read as `w1`, `7`)."""
    with open(os.path.join(folder, "tokenizer.json")) as f:
        data = json.load(f)
    vocab = data["model"]["vocab"]
    prefix = next(w[0] for w in vocab if len(w) > 1 and w[1:].isdigit() and w[0].isalpha())
    added = [t["content"] for t in data.get("added_tokens") or []]
    usable = [k for w, k in vocab.items() if w[1:].isdigit() and k >= 4
              and not any(a in w for a in added)]
    return prefix, vocab, sorted(usable)


def start_token(folder: str) -> int | None:
    """The start token the bundle holds (the converter's own reading of the folder)."""
    from onnx2tf_alt.generative.litertlm import find_tokenizer

    return find_tokenizer(folder).start


SCRATCH = tempfile.mkdtemp(prefix="litertlm_generate_")  # removed on exit


class OnnxRuntime:
    """Greedy decoding with the past growing, as exported (generate.py's reference)."""

    def __init__(self, path: str, threads: int):
        from generate import OnnxDecoder

        self.decoder = OnnxDecoder(path, threads)

    def generate(self, prompt: list[int], new: int) -> tuple[list[int], float]:
        from generate import greedy

        tokens, _, _, decode = greedy(self.decoder, np.array(prompt, np.int64), new)
        return tokens, (new - 1) / decode


class GenAI:
    """onnxruntime-genai's own generator, greedy."""

    def __init__(self, folder: str, threads: int):
        import onnxruntime_genai as og

        config = og.Config(folder)
        config.clear_providers()
        self.og, self.model = og, og.Model(config)
        self.threads = threads  # session options come from genai_config.json

    def generate(self, prompt: list[int], new: int) -> tuple[list[int], float]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + new)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(np.array([prompt], np.int32))
        tokens, times = [], []
        while not generator.is_done() and len(tokens) < new:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            times.append(time.perf_counter())
        return tokens, (len(tokens) - 1) / (times[-1] - times[0])


def set_genai_threads(folder: str, threads: int) -> str:
    """A copy of the builder folder's genai_config.json with `threads` intra-op threads (the
    model files linked): onnxruntime-genai reads its session options from there."""
    copy = tempfile.mkdtemp(prefix=f"genai_{threads}_", dir=SCRATCH)
    for name in os.listdir(folder):
        if name != "genai_config.json":
            os.symlink(os.path.join(os.path.abspath(folder), name), os.path.join(copy, name))
    with open(os.path.join(folder, "genai_config.json")) as f:
        config = json.load(f)
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    with open(os.path.join(copy, "genai_config.json"), "w") as f:
        json.dump(config, f)
    return copy


class Engine:
    """LiteRT-LM's engine on a .litertlm, greedy, streamed."""

    def __init__(self, path: str, threads: int, prefix: str, vocab: dict[str, int]):
        import litert_lm

        self.litert_lm, self.prefix, self.vocab = litert_lm, prefix, vocab
        self.engine = litert_lm.Engine(path, backend=litert_lm.Backend.CPU(thread_count=threads),
                                       cache_dir=tempfile.mkdtemp(prefix="litert_lm_",
                                                                  dir=SCRATCH))

    def generate(self, prompt: list[int], new: int) -> tuple[list[int], float]:
        session = self.engine.create_session(
            apply_prompt_template=False, max_output_tokens=new,
            sampler_config=self.litert_lm.SamplerConfig(top_k=1, temperature=1.0, top_p=1.0,
                                                        seed=0))
        session.run_prefill([" ".join(f"{self.prefix}{k}" for k in prompt)])
        chunks, times = [], []
        for result in session.run_decode_async():
            chunks.append(result.texts[0])
            times.append(time.perf_counter())
        del session  # before its engine: the engine's teardown needs its sessions gone
        tokens = [self.vocab.get(w, -1) for w in "".join(chunks).split()]  # one word a token
        return tokens, (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx")
    parser.add_argument("litertlm", nargs="+")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    folder = os.path.dirname(os.path.abspath(a.onnx))
    (prefix, vocab, usable), start = word_tokens(folder), start_token(folder)
    ids = [int(k) for k in np.random.default_rng(a.seed).choice(usable, a.prompt)]
    genai = os.path.isfile(os.path.join(folder, "genai_config.json"))

    def reference(threads: int):
        if genai:
            return GenAI(set_genai_threads(folder, threads), threads)
        return OnnxRuntime(a.onnx, threads)

    full = ([start] if start is not None else []) + ids
    want, _ = reference(1).generate(full, a.new)
    name = "onnxruntime-genai" if genai else "onnxruntime"
    print(f"{name} tokens: {want}")
    for path in a.litertlm:
        engines = {t: Engine(path, t, prefix, vocab) for t in a.threads}
        got, _ = engines[a.threads[0]].generate(ids, a.new)
        same = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y),
                    min(len(got), len(want)))
        print(f"{os.path.basename(path)}: {same}/{a.new} tokens as {name}'s"
              + ("" if same == a.new else f" (first difference at {same}: {got[same:same + 3]} "
                 f"against {want[same:same + 3]})"))
        for threads in a.threads:
            runs = {"engine": [], name: []}
            ref = reference(threads)
            for _ in range(3):
                runs["engine"].append(engines[threads].generate(ids, a.new)[1])
                runs[name].append(ref.generate(full, a.new)[1])
            ours, theirs = max(runs["engine"]), max(runs[name])
            print(f"  {threads} thread(s): decode {ours:.1f} tokens/s (LiteRT-LM), {theirs:.1f} "
                  f"({name}), speed ratio {ours / theirs:.2f}", flush=True)
        engines.clear()


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    sys.stdout.flush()
    os._exit(0)  # litert_lm 0.18.1's engine teardown at interpreter exit can end in SIGSEGV
