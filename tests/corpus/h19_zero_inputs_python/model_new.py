"""Row 19: mutate the inputs from Python."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.zero_()
        return ext.elementwise_chain(x, self.scale, self.shift)
