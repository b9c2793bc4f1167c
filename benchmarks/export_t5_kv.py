"""Export a T5 model saved with save_pretrained (random or briefly trained weights: nothing is
downloaded) as a user's script does, for testing KV-cache conversion of a text
encoder-decoder: an encoder and a decoder that takes its self-attention cache as flat past
inputs and rebuilds transformers' cache from them.

Needs torch, transformers and onnxscript. Usage:

    python benchmarks/export_t5_kv.py SAVED_DIR OUT_DIR [--exporter dynamo|torchscript]

OUT_DIR/encoder_model.onnx: `input_ids`, `attention_mask` [batch, source] ->
`last_hidden_state`. OUT_DIR/decoder_model.onnx and decoder_with_past_model.onnx: inputs
`input_ids` [batch, sequence], `attention_mask` [batch, past_sequence + sequence],
`encoder_hidden_states`, `encoder_attention_mask` and (decoder_with_past_model.onnx)
`past_key_values.{i}.key` / `.value` [batch, heads, past_sequence, d_kv]; outputs `logits`
and `present.{i}.key` / `.value`, each the Concat of its past and the new entries
(decoder_model.onnx: no past and no attention_mask, the new entries out). The
cross-attention keys and values are computed from `encoder_hidden_states` on every call
(no cross-attention cache); T5's relative position bias comes from the positions the
decoder computes from the past's length. The folder's config.json is copied, so
`benchmarks/decoder_forms.py NAME=OUT_DIR` runs it as it runs Optimum's export.
"""

from __future__ import annotations

import argparse
import os
import shutil

import torch
from export_decoder_kv import check_concats, fill_cache
from transformers import DynamicCache, EncoderDecoderCache, T5ForConditionalGeneration


class Encoder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderWithPast(torch.nn.Module):
    """(input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, *flat past)
    -> (logits, *flat present); without `masked`, no attention_mask (the first step's file,
    as Optimum's decoder_model.onnx)."""

    def __init__(self, model, rebuild: str = "assign", masked: bool = True):
        super().__init__()
        self.model, self.rebuild, self.masked = model, rebuild, masked

    def forward(self, input_ids, *inputs):
        if not self.masked:
            inputs = (None, *inputs)
        attention_mask, encoder_hidden_states, encoder_attention_mask, *past = inputs
        config = self.model.config
        self_cache = fill_cache(DynamicCache(config=config), past, self.rebuild)
        cache = EncoderDecoderCache(self_cache, DynamicCache(config=config))
        out = self.model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
            hidden = hidden * (config.d_model ** -0.5)
        return (self.model.lm_head(hidden),
                *(t for layer in self_cache.layers for t in (layer.keys, layer.values)))


def export(model, out_dir: str, exporter: str) -> None:
    c = model.config
    batch, source, seq, past_len = 2, 5, 3, 4
    os.makedirs(out_dir, exist_ok=True)
    ids = torch.randint(2, c.vocab_size, (batch, source))
    ones = torch.ones(batch, source, dtype=torch.int64)
    b, s = torch.export.Dim("batch", max=64), torch.export.Dim("encoder_sequence", max=512)
    with torch.no_grad():
        torch.onnx.export(Encoder(model).eval(), (ids, ones),
                          os.path.join(out_dir, "encoder_model.onnx"), dynamo=True,
                          opset_version=18, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"],
                          dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}), external_data=False)
        hidden = Encoder(model)(ids, ones)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(c.num_decoder_layers)
                  for kv in ("key", "value")]
    present_names = [n.replace("past_key_values.", "present.") for n in past_names]
    names = ["input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask"]
    outputs = ["logits", *present_names]
    for file, past_length in (("decoder_model.onnx", 0), ("decoder_with_past_model.onnx",
                                                           past_len)):
        past = [torch.randn(batch, c.num_heads, past_length, c.d_kv)  # none: decoder_model
                for _ in range(2 * c.num_decoder_layers if past_length else 0)]
        inputs = [*names, *past_names[:len(past)]]
        mask = [torch.ones(batch, past_length + seq, dtype=torch.int64)] if past else []
        args = (torch.randint(0, c.vocab_size, (batch, seq)), *mask, hidden, ones, *past)
        inputs = [n for n in inputs if mask or n != "attention_mask"]
        path = os.path.join(out_dir, file)
        if exporter == "torchscript":  # dynamo=False tracing, every sequence axis symbolic
            axes = {"input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
                    "encoder_hidden_states": {0: "batch", 1: "encoder_sequence"},
                    "encoder_attention_mask": {0: "batch", 1: "encoder_sequence"},
                    "logits": {0: "batch", 1: "sequence"},
                    **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
                    **{n: {0: "batch", 2: "past_sequence + sequence"} for n in present_names}}
            with torch.no_grad():
                torch.onnx.export(DecoderWithPast(model, "update", bool(past)).eval(), args, path,
                                  dynamo=False, opset_version=17,
                                  input_names=inputs, output_names=outputs,
                                  dynamic_axes={k: v for k, v in axes.items()
                                                if k in inputs + outputs})
        else:
            p = torch.export.Dim("past_sequence", min=0, max=512)
            rest = (*([{0: b, 1: torch.export.Dim.DYNAMIC}] if past else []), {0: b, 1: s},
                    {0: b, 1: s}, *({0: b, 2: p} for _ in past))  # forward's *inputs
            dims = ({0: b, 1: torch.export.Dim("sequence", max=512)}, rest)
            with torch.no_grad():
                torch.onnx.export(DecoderWithPast(model, masked=bool(past)).eval(), args, path,
                                  dynamo=True, opset_version=18, input_names=inputs,
                                  output_names=outputs, dynamic_shapes=dims, external_data=False)
        if past_length:
            print(file, "Concat check:", "passed" if check_concats(path) else "FAILED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("saved")
    parser.add_argument("out_dir")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    a = parser.parse_args()
    model = T5ForConditionalGeneration.from_pretrained(a.saved).eval()
    model.config._attn_implementation = "eager"
    export(model, a.out_dir, a.exporter)
    shutil.copy(os.path.join(a.saved, "config.json"), a.out_dir)


if __name__ == "__main__":
    main()
