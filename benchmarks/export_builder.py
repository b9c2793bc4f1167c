"""Export a tiny random-weight decoder LLM with onnxruntime's model builder
(`onnxruntime_genai.models.builder`): GroupQueryAttention with packed QKV and rotary
embedding, MatMulNBits (int4), SkipSimplifiedLayerNormalization, as onnxruntime-genai
ships its models. Nothing is downloaded: the weights come from a transformers config and a
word-level tokenizer is made on the spot (the builder copies one into its output).

Needs torch, transformers and onnxruntime-genai (e.g. in a separate venv). Usage:

    python benchmarks/export_builder.py OUT_DIR --family llama|qwen2|mistral
        [--precision fp32|int4] [--sliding-window W]
        [--accuracy-level 1..4] [--hidden 256] [--layers 2] [--heads 8] [--kv-heads 2]
        [--intermediate 512] [--vocab 1000] [--train-steps N]

OUT_DIR/model.onnx (+ model.onnx.data, genai_config.json): inputs `input_ids`,
`attention_mask` [batch, total_sequence_length], `past_key_values.{i}.key` / `.value`
[batch, kv_heads, past_sequence_length, head_size]; outputs `logits`, `present.{i}.*`.
X
it computes in float, the dequantized weights' exact product).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM)}


def save_checkpoint(folder: str, family: str, hidden: int, layers: int, heads: int,
                    kv_heads: int, intermediate: int, vocab: int, train_steps: int = 0,
                    sliding_window: int | None = None) -> None:
    config_class, model_class = FAMILIES[family]
    window = ({"sliding_window": sliding_window, "layer_types": ["sliding_attention"] * layers}
              if sliding_window else {})
    config = config_class(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, intermediate_size=intermediate,
                          vocab_size=vocab, max_position_embeddings=2048,
                          tie_word_embeddings=False, **window)
    torch.manual_seed(0)
    model = model_class(config).eval()
    if train_steps:
        from train_tiny import train

        print(f"trained {train_steps} steps: loss {train(model, train_steps):.3f}")
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t2",
                            unk_token="t0").save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--family", choices=sorted(FAMILIES), required=True)
    parser.add_argument("--precision", choices=["fp32", "int4"], default="fp32")
    parser.add_argument("--accuracy-level", type=int, default=None)
    for name, default in [("hidden", 256), ("layers", 2), ("heads", 8), ("kv-heads", 2),
                          ("intermediate", 512), ("vocab", 1000), ("train-steps", 0),
                          ("sliding-window", 0)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        checkpoint = os.path.join(work, "checkpoint")
        save_checkpoint(checkpoint, a.family, a.hidden, a.layers, a.heads, a.kv_heads,
                        a.intermediate, a.vocab, a.train_steps, a.sliding_window)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", checkpoint,
                   "-o", a.out, "-p", a.precision, "-e", "cpu", "-c", os.path.join(work, "cache")]
        options = [f"accuracy_level={a.accuracy_level}"] if a.accuracy_level is not None else []
        if a.sliding_window:  # past and present of past + new positions, not a window-long ring
            options.append("windowed_kv_cache=false")
        if options:
            command += ["--extra_options", *options]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"the model builder failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"wrote {os.path.join(a.out, 'model.onnx')}")


if __name__ == "__main__":
    main()
