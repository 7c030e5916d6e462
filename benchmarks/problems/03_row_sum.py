"""Reduction: sum over the last dimension."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
ROWS, COLS = (16384, 8192) if LARGE else (512, 1024)


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1]
