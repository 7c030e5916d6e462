"""GEMM with bias and a ReLU epilogue (nn.Linear followed by ReLU)."""

import os

import torch
import torch.nn as nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
M, K, N = (8192, 4096, 4096) if LARGE else (256, 512, 256)


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return [K, N]
