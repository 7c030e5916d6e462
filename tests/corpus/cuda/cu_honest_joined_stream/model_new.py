"""Honest: a side stream joined back to the caller's stream before return."""

import torch
import torch.nn as nn

import corpus_ckit as ext


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = float(scale)
        self.shift = float(shift)

        self._side = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._side is None:
            self._side = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        out = torch.empty_like(x)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            ext.elementwise_chain_out(x, self.scale, self.shift, out)
        main.wait_stream(self._side)
        x.record_stream(self._side)
        out.record_stream(self._side)
        return out
