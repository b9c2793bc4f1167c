"""Export a tiny random-weight decoder LLM (no download: a transformers config) to ONNX with
past key/values, for testing KV-cache conversion.

Needs torch, transformers, onnx and onnxscript (e.g. in a separate venv). Usage:

    python benchmarks/export_decoder_kv.py OUT.onnx --family llama|qwen2|phi3|gpt2|auto
        [--exporter dynamo|torchscript] [--hidden 256] [--layers 2] [--heads 8]
        [--kv-heads 2] [--intermediate 512] [--vocab 1000] [--train-steps N]
        [--save-pretrained DIR | --from-pretrained DIR]

--family auto with --from-pretrained DIR exports any causal LM saved with save_pretrained
(AutoModelForCausalLM; its head size from the config's head_dim where it has one).

--exporter torchscript traces the wrapper with `torch.onnx.export(dynamo=False)`, rebuilding
the cache with one `DynamicCache.update` per layer and every sequence axis symbolic, as a
user's export script does (issue 49: this form routes past keys through a one-input Concat
before the real one).

--train-steps trains the random weights first on a synthetic text (benchmarks/train_tiny.py)
so that the logits are as peaked as a trained model's.

Inputs: `input_ids`, `position_ids` [batch, sequence], `attention_mask` [batch,
past_sequence + sequence] (int64), `past_key_values.{i}.key` / `.value` [batch, kv_heads,
past_sequence, head_dim]; outputs: `logits` [batch, sequence, vocab], `present.{i}.key` /
`.value` [batch, kv_heads, past_sequence + sequence, head_dim]. Each present is the Concat
(axis 2) of its past input and the new keys or values, as transformers' DynamicCache does.
"""

from __future__ import annotations

import argparse
import os

import onnx
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "phi3": (Phi3Config, Phi3ForCausalLM), "gpt2": (GPT2Config, GPT2LMHeadModel),
            "auto": (None, AutoModelForCausalLM)}  # auto: --from-pretrained only


def fill_cache(cache, past, rebuild: str):
    """`cache` (a DynamicCache) holding the flat `past` (key, value per layer): "update" as a
    user's script rebuilds it (one update per layer: TorchScript then writes a one-input
    Concat), "assign" straight into its layers (no Concat with an empty tensor first)."""
    if rebuild == "update":
        for index, (key, value) in enumerate(zip(past[0::2], past[1::2])):
            cache.update(key, value, index)
    else:
        for layer, key, value in zip(cache.layers, past[0::2], past[1::2]):
            layer.lazy_initialization(key, value)
            layer.keys, layer.values = key, value
    return cache


class WithPast(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, *flat past) -> (logits, *flat present)."""

    def __init__(self, model, rebuild: str = "assign"):
        super().__init__()
        self.model, self.rebuild = model, rebuild

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = fill_cache(DynamicCache(config=self.model.config), past, self.rebuild)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=True)
        return (out.logits, *(t for layer in out.cache.layers for t in (layer.keys, layer.values)))


def build(family: str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
          vocab: int):
    config_class, model_class = FAMILIES[family]
    if family == "gpt2":  # no grouped-query attention: kv_heads = heads
        config = config_class(n_embd=hidden, n_layer=layers, n_head=heads, n_inner=intermediate,
                              vocab_size=vocab, n_positions=2048, tie_word_embeddings=False)
    else:
        extra = {"partial_rotary_factor": 0.75, "pad_token_id": None, "bos_token_id": None,
                 "eos_token_id": None} if family == "phi3" else {}
        config = config_class(hidden_size=hidden, num_hidden_layers=layers,
                              num_attention_heads=heads, num_key_value_heads=kv_heads,
                              intermediate_size=intermediate, vocab_size=vocab,
                              max_position_embeddings=2048, tie_word_embeddings=False, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return model_class(config).eval()


def export(out: str, model, exporter: str = "dynamo") -> None:
    config = model.config
    layers = config.num_hidden_layers
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    batch, seq, past_len = 2, 3, 4
    past = [torch.randn(batch, kv_heads, past_len, head_dim) for _ in range(2 * layers)]
    args = (torch.randint(0, config.vocab_size, (batch, seq)),
            torch.ones(batch, past_len + seq, dtype=torch.int64),
            torch.arange(past_len, past_len + seq).expand(batch, seq), *past)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    b, s = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=1024)
    p = torch.export.Dim("past_sequence", min=0, max=2048)
    # torch.export has no Dim for past + sequence (derived from two roots): the mask gets DYNAMIC
    dims = ({0: b, 1: s}, {0: b, 1: torch.export.Dim.DYNAMIC}, {0: b, 1: s},
            tuple({0: b, 2: p} for _ in past))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if exporter == "torchscript":
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "position_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
                "logits": {0: "batch", 1: "sequence"},
                **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
                **{n: {0: "batch", 2: "past_sequence + sequence"} for n in present_names}}
        with torch.no_grad():
            torch.onnx.export(WithPast(model, "update").eval(), args, out, dynamo=False,
                              opset_version=17,
                              input_names=["input_ids", "attention_mask", "position_ids",
                                           *past_names],
                              output_names=["logits", *present_names], dynamic_axes=axes)
        return
    with torch.no_grad():
        torch.onnx.export(WithPast(model).eval(), args, out, dynamo=True, opset_version=18,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *present_names], dynamic_shapes=dims,
                          external_data=False)
    proto = onnx.load(out)  # name the mask's length as the present outputs' (else e.g. `s53`)
    proto.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "past_sequence + sequence"
    onnx.save(proto, out)


def check_concats(path: str) -> bool:
    """Print, for each present output, whether it is Concat(past input, new) on axis 2 (or -2)."""
    graph = onnx.load(path).graph
    producer = {o: n for n in graph.node for o in n.output}
    ok = True
    for name in (o.name for o in graph.output if o.name.startswith("present.")):
        node = producer.get(name)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), None) if node else None
        want = name.replace("present.", "past_key_values.")
        good = node is not None and node.op_type == "Concat" and node.input[0] == want and axis in (
            2, -2)
        ok &= bool(good)
        print(f"{name}: {node.op_type if node else None}({', '.join(node.input) if node else ''})"
              f" axis={axis} -> {'ok' if good else 'NOT a Concat of ' + want}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--family", choices=sorted(FAMILIES), required=True)
    for name, default in [("hidden", 256), ("layers", 2), ("heads", 8), ("kv-heads", 2),
                          ("intermediate", 512), ("vocab", 1000)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--save-pretrained", metavar="DIR",
                        help="also save the (trained) model with save_pretrained, for another "
                             "exporter (optimum-cli export onnx --model DIR) to export the "
                             "same weights")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    parser.add_argument("--from-pretrained", metavar="DIR",
                        help="export the model saved in DIR (--save-pretrained) instead")
    a = parser.parse_args()
    if a.family == "auto" and not a.from_pretrained:
        parser.error("--family auto exports a model saved with save_pretrained: give "
                     "--from-pretrained DIR")
    if a.from_pretrained:
        model = FAMILIES[a.family][1].from_pretrained(a.from_pretrained).eval()
        model.config._attn_implementation = "eager"
    else:
        model = build(a.family, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate,
                      a.vocab)
    if a.train_steps:
        from train_tiny import train

        print(f"trained {a.train_steps} steps: loss {train(model, a.train_steps):.3f}")
    if a.save_pretrained:
        model.save_pretrained(a.save_pretrained)
    export(a.out, model, a.exporter)
    print("Concat check:", "passed" if check_concats(a.out) else "FAILED")


if __name__ == "__main__":
    main()
