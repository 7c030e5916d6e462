"""Swish, scale and clamp over a 4-D activation tensor."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C, H, W = (64, 128, 64, 64) if LARGE else (4, 16, 32, 32)


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.sigmoid(x) * self.scale
        return torch.clamp(y, min=-1.0, max=1.0)


def get_inputs():
    return [torch.randn(N, C, H, W)]


def get_init_inputs():
    return [2.0]
