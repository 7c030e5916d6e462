"""LayerNorm over the hidden dimension of a (batch, tokens, hidden) tensor."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
B, T, D = (32, 2048, 4096) if LARGE else (4, 128, 512)


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(B, T, D)]


def get_init_inputs():
    return [D]
