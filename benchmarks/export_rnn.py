"""Export recurrent models (torch, random weights) to ONNX for latency work on RNNs.

    python benchmarks/export_rnn.py OUT_DIR [gru1 lstm2 ...]

Each takes x [batch, 100, features] (batch_first, as most torch code) and returns the
output sequence; the `_dyn` variants have a dynamic batch axis, so their initial states are
built in the graph at run time. Time them with `benchmarks/bench_model.py OUT_DIR/*.onnx`.
"""

from __future__ import annotations

import os

import torch

STEPS = 100
# name: (module class, input features, hidden, layers, bidirectional, dynamic batch)
MODELS = {
    "gru1": (torch.nn.GRU, 64, 128, 1, False, False),
    "gru2": (torch.nn.GRU, 64, 128, 2, True, False),
    "gru_big": (torch.nn.GRU, 80, 256, 2, False, False),
    "lstm_big": (torch.nn.LSTM, 512, 1024, 2, False, False),  # 50 MB of weights
    "lstm1": (torch.nn.LSTM, 64, 128, 1, False, False),
    "lstm2": (torch.nn.LSTM, 64, 128, 2, True, False),
    "gru1_dyn": (torch.nn.GRU, 64, 128, 1, False, True),
    "lstm2_dyn": (torch.nn.LSTM, 64, 128, 2, True, True),
}


class Sequence(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


def export(name: str, out_dir: str) -> str:
    cls, features, hidden, layers, bidirectional, dynamic = MODELS[name]
    torch.manual_seed(0)
    model = Sequence(cls(features, hidden, num_layers=layers, bidirectional=bidirectional,
                         batch_first=True)).eval()
    path = os.path.join(out_dir, f"{name}.onnx")
    axes = {"x": {0: "batch"}, "y": {0: "batch"}} if dynamic else None
    torch.onnx.export(model, (torch.randn(1, STEPS, features),), path, dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes=axes)
    return path


if __name__ == "__main__":
    from export_main import run

    run(__doc__, export, MODELS)
