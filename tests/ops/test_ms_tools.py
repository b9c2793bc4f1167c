"""Graphs written by onnxruntime's own tools, converted and compared with onnxruntime (TF and
float32 TFLite): a BERT-style encoder and a GPT-2-style decoder (tiny, random weights,
exported from torch in the layouts of Hugging Face's BERT and GPT-2) after
`onnxruntime.transformers.optimizer`, and both after `MatMulNBitsQuantizer` (4-bit
weights)."""

from __future__ import annotations

import math
from collections import Counter

import onnx
import pytest

from harness import check_model, count_tflite_ops

torch = pytest.importorskip("torch")
nn = torch.nn

HIDDEN, HEADS, LAYERS, VOCAB, POSITIONS = 32, 4, 2, 50, 16


def _randomize(module):
    """Random weights everywhere, LayerNorm scales (around 1) and biases included: a fresh
    LayerNorm is all ones and zeros, which would hide a swapped gamma and beta."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            around = 1.0 if name.endswith("weight") and p.dim() == 1 else 0.0
            p.copy_(torch.randn_like(p) * 0.3 + around)
    return module.eval()


class BertLayer(nn.Module):
    """Post-LN encoder layer as Hugging Face's BertLayer exports it."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12), nn.LayerNorm(HIDDEN, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def heads(self, x):
        return x.view(x.size(0), x.size(1), HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS) + mask
        context = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
        x = self.ln1(self.out(context.view(context.size(0), context.size(1), HIDDEN)) + x)
        return self.ln2(self.fc2(nn.functional.gelu(self.fc1(x))) + x)


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word, self.position = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
        self.segment, self.ln = nn.Embedding(2, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer() for _ in range(LAYERS))

    def forward(self, ids, mask, segments):
        positions = torch.arange(ids.size(1), dtype=torch.long).unsqueeze(0)
        x = self.ln(self.word(ids) + self.position(positions) + self.segment(segments))
        additive = (1.0 - mask[:, None, None, :].to(torch.float32)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive)
        return x


class Conv1D(nn.Module):
    """GPT-2's dense layer: addmm on the flattened input."""

    def __init__(self, inputs, outputs):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(inputs, outputs))
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*shape)


class GptBlock(nn.Module):
    """Pre-LN causal decoder block as Hugging Face's GPT-2 (transformers 2.x-4.x) exports it."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.c_attn, self.c_proj = Conv1D(HIDDEN, 3 * HIDDEN), Conv1D(HIDDEN, HIDDEN)
        self.c_fc, self.mlp_proj = Conv1D(HIDDEN, 4 * HIDDEN), Conv1D(4 * HIDDEN, HIDDEN)
        causal = torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, POSITIONS, POSITIONS))
        self.register_buffer("masked_bias", torch.tensor(-1e4))

    def split_heads(self, x, key=False):
        x = x.view(*(x.size()[:-1] + (HEADS, HIDDEN // HEADS)))
        return x.permute(0, 2, 3, 1) if key else x.permute(0, 2, 1, 3)

    def attention(self, x):
        q, k, v = self.c_attn(x).split(HIDDEN, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k, key=True), self.split_heads(v)
        w = torch.matmul(q, k) / (float(v.size(-1)) ** 0.5)
        nd, ns = w.size(-2), w.size(-1)
        w = torch.where(self.bias[:, :, ns - nd: ns, :ns], w, self.masked_bias.to(w.dtype))
        a = torch.matmul(w.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view(*(a.size()[:-2] + (a.size(-2) * a.size(-1),))))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * torch.pow(h, 3))))
        return x + self.mlp_proj(h)


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
        self.h = nn.ModuleList(GptBlock() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), dtype=torch.long).unsqueeze(0))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


def _export(module, args, names, path, dynamic_axes=None, opset=14) -> str:
    torch.onnx.export(_randomize(module), args, str(path), dynamo=False, opset_version=opset,
                      input_names=names, output_names=["y"], dynamic_axes=dynamic_axes)
    return str(path)


def _optimize(path: str, model_type: str) -> onnx.ModelProto:
    """The optimizer as users run it: from the exported file to a saved file."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(path, model_type=model_type, num_heads=HEADS,
                               hidden_size=HIDDEN, opt_level=0)
    target = path.replace(".onnx", f"_{model_type}.onnx")
    optimized.save_model_to_file(target)
    return onnx.load(target)


def _quantize_4bits(model: onnx.ModelProto | str, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if isinstance(model, str):
        model = onnx.load(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=16, is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul", "Gather"),
                                     quant_axes=(("MatMul", 0), ("Gather", 1)))
    quantizer.process()
    return quantizer.model.model


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(exported BERT's path, feeds): batch 2, 7 tokens, the second row right-padded."""
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]])
    folder = tmp_path_factory.mktemp("bert")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    # opset 14 for the optimizer (as Hugging Face exports); 18 for the 4-bit quantizer, which
    # moves the model to opset 21 (ReduceMean's axes attribute would be invalid there)
    paths = {opset: _export(Bert(), (ids, mask, segments), names,
                            folder / f"bert{opset}.onnx", opset=opset) for opset in (14, 18)}
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
             "token_type_ids": segments.numpy()}
    return paths, feeds


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    # dynamic axes: the optimizer's GPT-2 attention pattern reads the lengths with Shape
    axes = {"input_ids": {0: "batch", 1: "sequence"}}
    return _export(Gpt(), (ids,), ["input_ids"], path, axes), {"input_ids": ids.numpy()}


def _check(model, feeds, fused: dict[str, int], tol: float, static: bool = False):
    """The tool wrote the fused ops expected; the conversion matches onnxruntime. With
    `static`, the input shapes are fixed to the feeds' (-ois) first."""
    ops = Counter(n.op_type for n in model.graph.node)
    assert {op: ops[op] for op in fused} == fused, ops
    shapes = [f"{name}:{','.join(map(str, a.shape))}" for name, a in feeds.items()]
    converted = check_model(model, feeds, tol=tol,
                            overwrite_input_shape=shapes if static else None)
    return count_tflite_ops(converted.tflite)


def test_bert_after_transformers_optimizer(bert):
    paths, feeds = bert
    fused = {"EmbedLayerNormalization": 1, "Attention": LAYERS,
             "SkipLayerNormalization": 2 * LAYERS, "BiasGelu": LAYERS}
    census = _check(_optimize(paths[14], "bert"), feeds, fused, tol=1e-4)
    assert census.get("TRANSPOSE", 0) == 2 * LAYERS  # to and from [B, N, S, D] per attention


def test_gpt2_after_transformers_optimizer(gpt):
    model, feeds = gpt
    fused = {"EmbedLayerNormalization": 1, "Attention": LAYERS,
             "SkipLayerNormalization": 2 * LAYERS, "FastGelu": LAYERS}
    census = _check(_optimize(model, "gpt2"), feeds, fused, tol=1e-4)
    assert census.get("TRANSPOSE", 0) == 2 * LAYERS


def test_gpt2_optimized_then_4bit_weights(gpt):
    """The GenAI-style chain: fused attention, then MatMulNBits for the dense layers."""
    model, feeds = gpt
    quantized = _quantize_4bits(_optimize(model, "gpt2"), symmetric=True)
    _check(quantized, feeds, {"MatMulNBits": 3 * LAYERS, "Attention": LAYERS}, tol=1e-4,
           static=True)


def test_bert_4bit_weights_and_embeddings(bert):
    """Asymmetric 4-bit MatMulNBits (packed zero points) and GatherBlockQuantized (uint4)."""
    paths, feeds = bert
    quantized = _quantize_4bits(paths[18], symmetric=False)
    _check(quantized, feeds, {"MatMulNBits": 6 * LAYERS, "GatherBlockQuantized": 3}, tol=1e-4)
