"""Every decoder form converts to onnxruntime's tokens or is refused: convert each exported
decoder with a fixed-capacity cache (and, with --litertlm, as a .litertlm) and decode
greedily with the files, side by side with onnxruntime on the same ONNX.

    python benchmarks/decoder_forms.py NAME=MODEL.onnx|NAME=DIR [...]
        [--capacity 128] [--prompt 16] [--new 32] [--litertlm] [--out DIR]
        [--writer auto direct tf]

Each MODEL.onnx (benchmarks/export_decoder_kv.py with --exporter dynamo or torchscript,
`optimum-cli export onnx --task text-generation-with-past`, ...) is converted by the CLI with
`--kv_cache_capacity --signature prefill input_ids:1,P --signature decode input_ids:1,1
-odrqt -dms`; benchmarks/generate.py gives the tokens as onnxruntime's and the logits cosine
per step of the float32 and int8-weight files. With --litertlm (the tokenizer beside the
ONNX, a word-level one whose token k is a word `<letter><k>`), the same model is converted
with `--litertlm` and LiteRT-LM's engine decodes (benchmarks/litertlm_generate.py). One row
per model, writer and file, with the conversion's wall time and peak RSS (with --writer
tf direct, TF's converter and the direct writer side by side); a conversion that exits 1
is a row saying so, with its first line.

NAME=DIR: an encoder-decoder as `optimum-cli export onnx --task
automatic-speech-recognition-with-past` (Whisper) or `--task text2text-generation-with-past`
(T5, BART, Marian) writes it (DIR/encoder_model.onnx, decoder_model.onnx,
decoder_with_past_model.onnx): one file with `encode`, `prefill` (decoder_model.onnx) and
`decode` (decoder_with_past_model.onnx over the cache, the cross-attention caches as
`prefill` computes them) signatures, against onnxruntime running the same three files
(generate.py --encoder --first). NAME=DIR/decoder_model_merged.onnx: the same with the
merged decoder for `decode` (onnxruntime runs it too).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(command: list[str]) -> tuple[int, str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def seq2seq_signatures(model: str, prompt: int, source: int = 12
                       ) -> tuple[str, list[str], list[str]]:
    """Optimum's encoder-decoder: `model` its folder (decode: decoder_with_past_model.onnx)
    or its decoder_model_merged.onnx. (the -i model, the --signature flags, the extra
    generate.py flags). The encoder's output's length is measured by running it in
    onnxruntime; `decode` takes the cross-attention caches as `prefill` returns them. A
    text encoder (T5, BART, Marian: `input_ids` and `attention_mask` in) reads `source`
    ids, and its decoder's `encoder_attention_mask` is as long; the prompt starts with the
    config's decoder_start_token_id."""
    import json

    import numpy as np
    import onnxruntime as ort

    folder = model if os.path.isdir(model) else os.path.dirname(model)
    encoder, first, past = (os.path.join(folder, f"{name}.onnx") for name in (
        "encoder_model", "decoder_model", "decoder_with_past_model"))
    past = past if os.path.isdir(model) else model
    session = ort.InferenceSession(encoder, providers=["CPUExecutionProvider"])
    features = session.get_inputs()[0]
    text = "int" in features.type
    shape = [1, source] if text else [1, *features.shape[1:]]
    feeds = {i.name: np.ones(shape, np.int64 if text else np.float32)
             for i in session.get_inputs()}
    encoded = session.run(None, feeds)[0].shape
    inputs = [f"{name}:{','.join(map(str, shape))}" for name in feeds]
    mask = [f"encoder_attention_mask:1,{source}"] if text else []
    flags = ["--signature", "encode", encoder, *inputs,
             "--signature", "prefill", first, f"input_ids:1,{prompt}",
             f"encoder_hidden_states:{','.join(map(str, encoded))}", *mask,
             "--signature", "decode", "input_ids:1,1", *mask]
    extra = ["--encoder", encoder, "--first", first]
    if text:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        extra += ["--source", str(source), "--vocab", str(config["vocab_size"]),
                  "--start", str(config["decoder_start_token_id"])]
    return past, flags, extra


def is_seq2seq(model: str) -> bool:
    """An encoder-decoder's folder, or a decoder with encoder_model.onnx beside it."""
    folder = model if os.path.isdir(model) else os.path.dirname(model)
    return os.path.exists(os.path.join(folder, "encoder_model.onnx"))


def convert(model: str, out: str, capacity: int, prompt: int, litertlm: bool,
            writer: str = "auto") -> tuple[int, str]:
    """The CLI run in a small child that reports its peak RSS (bench_model._MEASURED):
    (exit code, output ending with a `PEAK_KIB n` line)."""
    from bench_model import _MEASURED

    command = [sys.executable, "-c", _MEASURED, "-i", model, "-o", out, "-dms", "-n",
               "-odrqt", "--kv_cache_capacity", str(capacity), "--tflite_writer", writer]
    if is_seq2seq(model):
        model, flags, _ = seq2seq_signatures(model, prompt)
        command[4] = model
        command += flags
    elif litertlm:
        command += ["--litertlm", "--tokenizer", os.path.dirname(os.path.abspath(model)),
                    "--litertlm_prefill", str(prompt)]
    else:
        command += ["--signature", "prefill", f"input_ids:1,{prompt}", "--signature",
                    "decode", "input_ids:1,1"]
    return run(command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="NAME=MODEL.onnx")
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--litertlm", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--writer", nargs="+", default=["auto"], choices=["auto", "direct", "tf"],
                        help="--tflite_writer of each conversion (several: a row each)")
    a = parser.parse_args()
    root = a.out or tempfile.mkdtemp(prefix="decoder_forms_")
    print("| model | writer | file | tokens as onnxruntime's | cosine min | conversion s | "
          "peak MB |")
    print("|---|---|---|---|---|---|---|")
    for item, writer in ((m, w) for m in a.models for w in a.writer):
        name, model = item.split("=", 1)
        out = os.path.join(root, f"{name}_{writer}")
        start = time.perf_counter()
        code, text = convert(model, out, a.capacity, a.prompt, False, writer)
        seconds = time.perf_counter() - start
        peak = [int(line.split()[1]) >> 10 for line in text.splitlines()
                if line.startswith("PEAK_KIB ")]
        measured = f"{seconds:.1f} | {peak[-1] if peak else '?'}"
        if code:
            first = next((line for line in text.splitlines() if line.startswith("error")), "")
            print(f"| {name} | {writer} | exit {code} | {first[:160]} | | {measured} |")
            continue
        extra = []
        if is_seq2seq(model):
            model, _, extra = seq2seq_signatures(model, a.prompt)
        stem = os.path.splitext(os.path.basename(model))[0]
        files = [os.path.join(out, f"{stem}_{v}.tflite") for v in ("float32",
                                                                  "dynamic_range_quant")]
        code, text = run([sys.executable, os.path.join(HERE, "generate.py"), model, *files,
                          *extra, "--prompt", str(a.prompt), "--new", str(a.new),
                          "--threads", "1"])
        for line in text.splitlines():
            found = re.match(r"\S+/(\S+\.tflite): (\d+) of (\d+) tokens.*cosine per step min "
                             r"([\d.\-]+)", line)
            if found:
                print(f"| {name} | {writer} | {found[1].replace(stem + '_', '')} | "
                      f"{found[2]}/{found[3]} | {found[4]} | {measured} |")
        if code:
            print(f"| {name} | {writer} | generate.py exit {code} | "
                  f"{text.splitlines()[-1][:160]} | | |")
        if not a.litertlm or extra:  # LiteRT-LM runs decoders alone
            continue
        code, text = convert(model, out + "_litertlm", a.capacity, a.prompt, True, writer)
        if code:
            first = next((line for line in text.splitlines() if line.startswith("error")), "")
            print(f"| {name} | {writer} | .litertlm: exit {code} | {first[:160]} | | | |")
            continue
        bundles = [os.path.join(out + "_litertlm", f"{stem}_{v}.litertlm")
                   for v in ("float32", "dynamic_range_quant")]
        code, text = run([sys.executable, os.path.join(HERE, "litertlm_generate.py"), model,
                          *bundles, "--prompt", str(a.prompt), "--new", str(a.new),
                          "--threads", "1"])
        for line in text.splitlines():
            found = re.match(r"(\S+\.litertlm): (\d+)/(\d+) tokens", line)
            if found:
                print(f"| {name} | {writer} | {found[1].replace(stem + '_', '')} (LiteRT-LM "
                      f"engine) | {found[2]}/{found[3]} | | |")
        if code:
            print(f"| {name} | {writer} | litertlm_generate.py exit {code} | "
                  f"{text.splitlines()[-1][:160]} | | |")


if __name__ == "__main__":
    main()
