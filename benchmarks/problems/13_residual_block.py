"""ResNet basic block (inference): conv-BN-ReLU, conv-BN, identity shortcut add, ReLU."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C, HW = (32, 128, 56) if LARGE else (2, 8, 16)


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + x)


def get_inputs():
    return [torch.randn(N, C, HW, HW)]


def get_init_inputs():
    return [C]
