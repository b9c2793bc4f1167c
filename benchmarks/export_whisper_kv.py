"""Export a tiny random-weight Whisper-style model (no download: a transformers config) to ONNX as
an encoder and a decoder with self-attention past key/values, for testing KV-cache conversion.

Needs torch, transformers, onnx and onnxscript (e.g. in a separate venv). Usage:

    python benchmarks/export_whisper_kv.py OUT_DIR [--d-model 256] [--layers 2] [--heads 4]
        [--vocab 1000] [--mels 80] [--frames 200] [--train-steps N]
        [--save-pretrained DIR | --from-pretrained DIR]
        [--exporter dynamo|torchscript]

OUT_DIR/encoder.onnx: `input_features` [batch, mels, frames] -> `encoder_hidden_states` [batch,
frames / 2, d_model]. OUT_DIR/decoder_kv.onnx: inputs `input_ids`, `position_ids` [batch,
sequence], `attention_mask` [batch, past_sequence + sequence] (int64), `encoder_hidden_states`,
`past_key_values.{i}.key` / `.value` [batch, heads, past_sequence, head_dim]; outputs `logits`
[batch, sequence, vocab], `present.{i}.key` / `.value` [batch, heads, past_sequence + sequence,
head_dim], each the Concat (axis 2) of its past input and the new keys or values. Positions come
from `position_ids`; cross-attention keys/values are recomputed from `encoder_hidden_states` on
every call (there is no cross-attention cache). --train-steps trains the random weights first
on a synthetic text (benchmarks/train_tiny.py).
"""

from __future__ import annotations

import argparse
import copy
import os

import onnx
import torch
from export_decoder_kv import check_concats, fill_cache
from transformers import (
    DynamicCache,
    EncoderDecoderCache,
    WhisperConfig,
    WhisperForConditionalGeneration,
)


class Encoder(torch.nn.Module):
    """input_features -> encoder_hidden_states."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features):
        return self.encoder(input_features=input_features).last_hidden_state


class DecoderWithPast(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, encoder_hidden_states, *flat past) ->
    (logits, *flat present)."""

    def __init__(self, model, rebuild: str = "assign"):
        super().__init__()
        self.decoder, self.proj_out, self.rebuild = model.get_decoder(), model.proj_out, rebuild
        # WhisperConfig maps num_hidden_layers to encoder_layers: size the caches for the decoder
        self.cache_config = copy.deepcopy(model.config)
        self.cache_config.num_hidden_layers = model.config.decoder_layers

    def forward(self, input_ids, attention_mask, position_ids, encoder_hidden_states, *past):
        self_cache = fill_cache(DynamicCache(config=self.cache_config), past, self.rebuild)
        # An empty cross-attention cache: each layer computes its cross K/V from
        # encoder_hidden_states (and stores them there, which we discard)
        cache = EncoderDecoderCache(self_cache, DynamicCache(config=self.cache_config))
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, encoder_hidden_states=encoder_hidden_states,
                           cache=cache, use_cache=True)
        return (self.proj_out(out.last_hidden_state),
                *(t for layer in self_cache.layers for t in (layer.keys, layer.values)))


def build(d_model: int, layers: int, heads: int, vocab: int, mels: int, frames: int):
    config = WhisperConfig(d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads,
                           encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model,
                           vocab_size=vocab, num_mel_bins=mels, max_source_positions=frames // 2,
                           max_target_positions=448, pad_token_id=vocab - 1,
                           bos_token_id=vocab - 2, eos_token_id=vocab - 2,
                           decoder_start_token_id=vocab - 3, suppress_tokens=None,
                           begin_suppress_tokens=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(config).eval()


def export(out_dir: str, model, exporter: str = "dynamo") -> None:
    c = model.config
    head_dim, frames = c.d_model // c.decoder_attention_heads, 2 * c.max_source_positions
    batch, seq, past_len = 2, 3, 4
    b, s = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=448)
    p = torch.export.Dim("past_sequence", min=0, max=448)
    os.makedirs(out_dir, exist_ok=True)
    enc_path = os.path.join(out_dir, "encoder.onnx")
    dec_path = os.path.join(out_dir, "decoder_kv.onnx")
    features = torch.randn(batch, c.num_mel_bins, frames)
    with torch.no_grad():
        torch.onnx.export(Encoder(model).eval(), (features,), enc_path, dynamo=True,
                          opset_version=18, input_names=["input_features"],
                          output_names=["encoder_hidden_states"], dynamic_shapes=({0: b},),
                          external_data=False)
        hidden = Encoder(model)(features)
    past = [torch.randn(batch, c.decoder_attention_heads, past_len, head_dim)
            for _ in range(2 * c.decoder_layers)]
    args = (torch.randint(0, c.vocab_size, (batch, seq)),
            torch.ones(batch, past_len + seq, dtype=torch.int64),
            torch.arange(past_len, past_len + seq).expand(batch, seq), hidden, *past)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(c.decoder_layers)
                  for kv in ("key", "value")]
    present_names = [name.replace("past_key_values.", "present.") for name in past_names]
    if exporter == "torchscript":  # dynamo=False tracing, every sequence axis symbolic
        names = ["input_ids", "attention_mask", "position_ids", "encoder_hidden_states"]
        axes = {"input_ids": {0: "batch", 1: "sequence"},
                "position_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
                "encoder_hidden_states": {0: "batch"}, "logits": {0: "batch", 1: "sequence"},
                **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
                **{n: {0: "batch", 2: "past_sequence + sequence"} for n in present_names}}
        with torch.no_grad():
            torch.onnx.export(DecoderWithPast(model, "update").eval(), args, dec_path,
                              dynamo=False, opset_version=17, input_names=[*names, *past_names],
                              output_names=["logits", *present_names], dynamic_axes=axes)
        return
    # torch.export has no Dim for past + sequence (derived from two roots): the mask gets DYNAMIC
    dims = ({0: b, 1: s}, {0: b, 1: torch.export.Dim.DYNAMIC}, {0: b, 1: s}, {0: b},
            tuple({0: b, 2: p} for _ in past))
    with torch.no_grad():
        torch.onnx.export(DecoderWithPast(model).eval(), args, dec_path, dynamo=True,
                          opset_version=18, input_names=["input_ids", "attention_mask",
                                                         "position_ids", "encoder_hidden_states",
                                                         *past_names],
                          output_names=["logits", *present_names], dynamic_shapes=dims,
                          external_data=False)
    proto = onnx.load(dec_path)  # name the mask's length as the present outputs' (else e.g. `s53`)
    proto.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "past_sequence + sequence"
    onnx.save(proto, dec_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    for name, default in [("d-model", 256), ("layers", 2), ("heads", 4), ("vocab", 1000),
                          ("mels", 80), ("frames", 200)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--save-pretrained", metavar="DIR",
                        help="also save the (trained) model with save_pretrained, for another "
                             "exporter (optimum-cli export onnx --model DIR) to export the "
                             "same weights")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                        help="the decoder's exporter (the encoder is always dynamo's)")
    parser.add_argument("--from-pretrained", metavar="DIR",
                        help="export the model saved in DIR (--save-pretrained) instead")
    a = parser.parse_args()
    if a.from_pretrained:
        model = WhisperForConditionalGeneration.from_pretrained(a.from_pretrained).eval()
        model.config._attn_implementation = "eager"
    else:
        model = build(a.d_model, a.layers, a.heads, a.vocab, a.mels, a.frames)
    if a.train_steps:
        from train_tiny import train

        print(f"trained {a.train_steps} steps: loss {train(model, a.train_steps):.3f}")
    if a.save_pretrained:
        model.save_pretrained(a.save_pretrained)
    export(a.out_dir, model, a.exporter)
    ok = check_concats(os.path.join(a.out_dir, "decoder_kv.onnx"))
    print("Concat check:", "passed" if ok else "FAILED")


if __name__ == "__main__":
    main()
