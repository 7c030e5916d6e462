"""Row 1 behind aliases: a regex scan for torch.matmul / F.linear sees nothing."""

import torch
import torch.nn as nn
from torch.nn import functional as Fn

import corpus_kit as ext

t = torch
mm = t.matmul
act = getattr(t, "relu")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.add = Fn.linear

    def _project(self, x):
        return mm(x, self.linear.weight.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ext.touch(self.linear.weight)
        y = self._project(x) + self.linear.bias
        return act(y)
