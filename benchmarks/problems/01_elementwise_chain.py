"""Elementwise chain: scale, shift, GELU (tanh form), then a residual multiply."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
BATCH, DIM = (8192, 8192) if LARGE else (256, 1024)


class Model(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.shift
        y = torch.nn.functional.gelu(y, approximate="tanh")
        return y * x


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [1.5, 0.25]
