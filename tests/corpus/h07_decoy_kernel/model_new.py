"""Row 7: decoy kernel, then PyTorch does the work."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ext.touch(self.linear.weight)  # "l2 prefetch"
        return F.relu(F.linear(x, self.linear.weight, self.linear.bias))
