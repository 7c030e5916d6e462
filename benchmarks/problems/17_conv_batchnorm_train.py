"""Convolution, then batch norm in training mode (batch statistics, running statistics updated), then ReLU."""

import os

import torch
from torch import nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C_IN, C_OUT, HW = (64, 32, 64, 64) if LARGE else (4, 3, 8, 12)


class Model(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3)
        # A module is in training mode until .eval(): the norm uses the batch's statistics.
        self.bn = nn.BatchNorm2d(c_out, momentum=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(N, C_IN, HW, HW) * 2 + 1]


def get_init_inputs():
    return [C_IN, C_OUT]
