"""Row 6: degenerate partial optimization (custom ReLU, library GEMM)."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x, self.linear.weight.t()) + self.linear.bias
        return ext.relu_inplace(y)  # "saves a pass"
