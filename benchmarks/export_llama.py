"""Export a random-weight Llama-style decoder (no download: a transformers config) to ONNX
with external data: `input_ids` [1, seq] -> `logits` [1, seq, vocab], seq symbolic.

Needs torch, transformers and onnxscript (e.g. in a separate venv:
`pip install torch==2.13.0 transformers onnx onnxscript`). Usage:

    python benchmarks/export_llama.py OUT.onnx HIDDEN LAYERS HEADS KV_HEADS INTERMEDIATE [VOCAB]

The issue-29 sizes: 2048 10 16 4 5632 (582 M parameters, 2.33 GB) and 2048 22 32 4 5632
(about 1.1 G parameters, 4.4 GB).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def export(out: str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
           vocab: int = 32000) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         intermediate_size=intermediate, vocab_size=vocab,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    count = sum(p.numel() for p in model.parameters())
    print(f"{count / 1e6:.1f} M parameters, {count * 4 / 1e9:.2f} GB", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    ids = torch.randint(0, vocab, (1, 16))
    start = time.time()
    with torch.no_grad():
        torch.onnx.export(Prefill(model), (ids,), out, input_names=["input_ids"],
                          output_names=["logits"],
                          dynamic_shapes={"input_ids": {1: torch.export.Dim("seq", min=2,
                                                                             max=1024)}},
                          opset_version=18, dynamo=True, external_data=True)
    print(f"exported in {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    export(sys.argv[1], *(int(a) for a in sys.argv[2:]))
