"""Row 6 in the load format: only the ReLU epilogue is custom."""

import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        here = os.path.dirname(__file__)
        self.ext = load(name="corpus_kit", sources=[os.path.join(here, "kit.cpp")], extra_cflags=["-O2"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x, self.linear.weight.t()) + self.linear.bias
        return self.ext.relu_inplace(y)
