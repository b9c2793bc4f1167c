"""A few hundred steps of training for the tiny decoders the export scripts make, so that
their logits are as peaked as a trained model's (random weights leave the top two logits
nearly tied, and greedy decoding then flips on any rounding: a poor judge of int8 / int4
files). Nothing is downloaded: the text is synthetic, two kinds of sequence mixed:

- chains: each token follows its predecessor by a fixed random permutation of the
  vocabulary (1 in 10 tokens random instead): a next token the model learns to be sure of;
- repeats: a random segment of 8 tokens written 8 times: after its first copy every token is
  found by attending to the previous copy (an induction head: the KV cache matters).

    from train_tiny import train
    train(model, steps=300)   # a transformers causal LM, in place; returns the last loss

An encoder-decoder learns the same text under random input features (Whisper) or random
source ids (T5, BART), which it learns to disregard: its decoder is what the KV cache serves.
"""

from __future__ import annotations

import numpy as np
import torch


def batch(rng: np.random.Generator, follow: np.ndarray, size: int, length: int) -> np.ndarray:
    """`size` sequences of `length` tokens, half chains and half repeats."""
    vocab = len(follow)
    ids = np.empty((size, length), np.int64)
    ids[:, 0] = rng.integers(0, vocab, size)
    for t in range(1, length):
        noise = rng.random(size) < 0.1
        ids[:, t] = np.where(noise, rng.integers(0, vocab, size), follow[ids[:, t - 1]])
    repeats = size // 2
    segments = rng.integers(0, vocab, (repeats, 8))
    ids[:repeats] = np.tile(segments, (1, -(-length // 8)))[:, :length]
    return ids


def train(model, steps: int = 300, seed: int = 0, size: int = 16, length: int = 64,
          lr: float = 3e-3) -> float:
    rng = np.random.default_rng(seed)
    follow = rng.permutation(model.config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = float("nan")
    for _ in range(steps):
        ids = torch.from_numpy(batch(rng, follow, size, length))
        if getattr(model.config, "num_mel_bins", None):  # decoder inputs: labels shifted
            frames = 2 * model.config.max_source_positions
            features = torch.randn(size, model.config.num_mel_bins, frames)
            out = model(input_features=features, labels=ids)
        elif model.config.is_encoder_decoder:  # a text encoder (T5, BART): random source ids
            source = torch.randint(0, model.config.vocab_size, (size, 12))
            out = model(input_ids=source, labels=ids)
        else:
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = float(out.loss)
    model.eval()
    return loss
