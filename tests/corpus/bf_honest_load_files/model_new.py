"""Honest: builds the C++ file it ships with torch.utils.cpp_extension.load."""

import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

ext = load(
    name="corpus_kit",
    sources=[os.path.join(os.path.dirname(__file__), "kit.cpp")],
    extra_cflags=["-O2"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # a parameter container, never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight.contiguous()
        b = self.linear.bias.contiguous()
        return ext.gemm_bias_relu(x.contiguous(), w, b)
