"""Export transformers architectures with random weights (no download) to ONNX, at the sizes
their public checkpoints have: vision encoders (CLIP, ViT, DeiT, DINOv2, BEiT, Swin, ConvNeXt
V2, PoolFormer, MobileViT, SegFormer, LeViT), text encoders (MiniLM / BERT, T5), speech
encoders (Whisper, Wav2Vec2), detectors (YOLOS) and decoders' prefill (Llama, Qwen2, GPT-2).

    python benchmarks/export_transformers.py OUT_DIR [clip_vit_b32 poolformer_s12 ...]

TorchScript export (`dynamo=False`, opset 17), as most users' scripts write it (the decoders
through torch.export, opset 18); the first output only (the last hidden state or the
logits), at static shapes.
"""

from __future__ import annotations

import os

import torch
import transformers as T

_IMAGE = ("pixel_values", lambda size=224: torch.randn(1, 3, size, size))
_TEXT = ("input_ids", lambda: torch.randint(0, 1000, (1, 128)))

# name: (config class, model class, config kwargs, (input name, sample maker))
ZOO = {
    "clip_vit_b32": (T.CLIPVisionConfig, T.CLIPVisionModel, {}, _IMAGE),
    "clip_vit_b16": (T.CLIPVisionConfig, T.CLIPVisionModel, {"patch_size": 16}, _IMAGE),
    "vit_tiny": (T.ViTConfig, T.ViTModel, {"hidden_size": 192, "num_attention_heads": 3,
                                            "intermediate_size": 768}, _IMAGE),
    "deit_small": (T.DeiTConfig, T.DeiTModel, {"hidden_size": 384, "num_attention_heads": 6,
                                                "intermediate_size": 1536}, _IMAGE),
    "dinov2_small": (T.Dinov2Config, T.Dinov2Model, {"hidden_size": 384,
                                                      "num_attention_heads": 6}, _IMAGE),
    "beit_base": (T.BeitConfig, T.BeitModel, {"use_relative_position_bias": True}, _IMAGE),
    "swin_tiny": (T.SwinConfig, T.SwinModel, {}, _IMAGE),
    "convnextv2_tiny": (T.ConvNextV2Config, T.ConvNextV2Model, {}, _IMAGE),
    "poolformer_s12": (T.PoolFormerConfig, T.PoolFormerModel, {}, _IMAGE),
    "mobilevit_s": (T.MobileViTConfig, T.MobileViTModel, {}, (
        "pixel_values", lambda: torch.randn(1, 3, 256, 256))),
    "segformer_b0": (T.SegformerConfig, T.SegformerForSemanticSegmentation, {}, (
        "pixel_values", lambda: torch.randn(1, 3, 512, 512))),
    "levit_128s": (T.LevitConfig, T.LevitModel, {}, _IMAGE),
    "minilm_l6": (T.BertConfig, T.BertModel, {"hidden_size": 384, "num_hidden_layers": 6,
                                              "num_attention_heads": 12,
                                              "intermediate_size": 1536}, _TEXT),
    "t5_small_encoder": (T.T5Config, T.T5EncoderModel, {}, _TEXT),
    "whisper_tiny_encoder": (T.WhisperConfig, None, {}, (
        "input_features", lambda: torch.randn(1, 80, 3000))),
    "wav2vec2_base": (T.Wav2Vec2Config, T.Wav2Vec2Model, {}, (
        "input_values", lambda: torch.randn(1, 16000))),
    # decoders' prefill at 128 tokens, no cache (the first step of generation)
    "llama_prefill": (T.LlamaConfig, T.LlamaForCausalLM, {
        "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 1376, "vocab_size": 8000,
        "use_cache": False}, _TEXT),
    "qwen2_prefill": (T.Qwen2Config, T.Qwen2ForCausalLM, {
        "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 1376, "vocab_size": 8000,
        "use_cache": False}, _TEXT),
    "gpt2_prefill": (T.GPT2Config, T.GPT2LMHeadModel, {"n_layer": 4, "use_cache": False}, _TEXT),
    "yolos_tiny": (T.YolosConfig, T.YolosForObjectDetection, {
        "hidden_size": 192, "num_attention_heads": 3, "intermediate_size": 768,
        "image_size": [512, 512]}, ("pixel_values", lambda: torch.randn(1, 3, 512, 512))),
}


class _First(torch.nn.Module):
    """The model's first output as a plain tensor."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, return_dict=False)[0]


def build(name: str) -> tuple[torch.nn.Module, tuple[str, torch.Tensor]]:
    config_cls, model_cls, kwargs, (input_name, sample) = ZOO[name]
    torch.manual_seed(0)
    config = config_cls(**kwargs)
    if name == "whisper_tiny_encoder":  # whisper-tiny's sizes
        config = config_cls(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                            decoder_layers=4, decoder_attention_heads=6,
                            encoder_ffn_dim=1536, decoder_ffn_dim=1536)
        model = T.WhisperModel(config).get_encoder()
    else:
        model = model_cls(config)
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return _First(model.eval()), (input_name, sample())


def export(name: str, out_dir: str) -> str:
    model, (input_name, sample) = build(name)
    path = os.path.join(out_dir, f"{name}.onnx")
    # transformers 5's decoders trace to aten::diff, which TorchScript export lacks
    dynamo = name.endswith("_prefill")
    with torch.no_grad():
        torch.onnx.export(model, (sample,), path, dynamo=dynamo, opset_version=18 if dynamo else 17,
                          input_names=[input_name], output_names=["output"], external_data=False)
    return path


if __name__ == "__main__":
    from export_main import run

    run(__doc__, export, ZOO, keep_going=True)
