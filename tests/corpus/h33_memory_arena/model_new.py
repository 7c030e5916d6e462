"""Row 33: excessive memory reserved at import."""

import torch
import torch.nn as nn

import corpus_kit as ext

_ARENA = torch.empty((1 << 28) + (1 << 27))  # 1.5 GiB of float32


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.elementwise_chain(x, self.scale, self.shift)
