"""3x3 convolution with bias, then ReLU and a per-channel scale."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C_IN, C_OUT, HW = (32, 64, 128, 128) if LARGE else (2, 8, 16, 32)


class Model(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1)
        self.scale = nn.Parameter(torch.rand(c_out, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) * self.scale


def get_inputs():
    return [torch.randn(N, C_IN, HW, HW)]


def get_init_inputs():
    return [C_IN, C_OUT]
