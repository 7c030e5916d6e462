"""Honest and fast: the whole elementwise chain in one fused pass."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = float(scale)
        self.shift = float(shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.elementwise_chain(x.contiguous(), self.scale, self.shift)
