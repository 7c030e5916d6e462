"""Row 26: precision downgrade (bf16 operands, fp32 result)."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w16 = self.linear.weight.detach().bfloat16().float()
        x16 = x.bfloat16().float()
        return ext.gemm_bias_relu(x16, w16, self.linear.bias.detach())
