"""A small CNN block: conv -> batch norm (inference) -> ReLU -> 2x2 max-pool."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C_IN, C_OUT, HW = (32, 64, 128, 112) if LARGE else (2, 4, 8, 16)


class Model(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.pool = nn.MaxPool2d(2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


def get_inputs():
    return [torch.randn(N, C_IN, HW, HW)]


def get_init_inputs():
    return [C_IN, C_OUT]
