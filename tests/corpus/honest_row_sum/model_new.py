"""Honest row sum over the last dimension."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim not in (-1, x.dim() - 1):
            raise ValueError("this kernel reduces the last dimension only")
        if x.numel() == 0:
            return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        return ext.row_sum(x.contiguous())
