"""Row 21: background thread / async deferral."""

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

import corpus_kit as ext

_POOL = ThreadPoolExecutor(max_workers=1)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        _POOL.submit(ext.elementwise_chain_out, x, self.scale, self.shift, out)
        return out
