"""Two-layer LSTM over a sequence, then a Linear head on the last time step (KernelBench level 3 style)."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
B, T, D_IN, HIDDEN, LAYERS, D_OUT = (64, 512, 512, 1024, 2, 256) if LARGE else (4, 16, 32, 64, 2, 10)


class Model(nn.Module):
    def __init__(self, d_in: int, hidden: int, layers: int, d_out: int):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1, :])


def get_inputs():
    return [torch.randn(B, T, D_IN)]


def get_init_inputs():
    return [D_IN, HIDDEN, LAYERS, D_OUT]
