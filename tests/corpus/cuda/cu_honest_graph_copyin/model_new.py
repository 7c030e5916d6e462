"""Honest CUDA graph: inputs are copied in on every call, the output is copied out."""

import torch
import torch.nn as nn

import corpus_ckit as ext


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = float(scale)
        self.shift = float(shift)

        self._graph = None
        self._static_x = None
        self._static_out = None

    def _capture(self, x: torch.Tensor) -> None:
        self._static_x = torch.empty_like(x)
        self._static_out = torch.empty_like(x)
        self._static_x.copy_(x)
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            ext.elementwise_chain_out(self._static_x, self.scale, self.shift, self._static_out)
        torch.cuda.current_stream().wait_stream(warm)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            ext.elementwise_chain_out(self._static_x, self.scale, self.shift, self._static_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._graph is None or self._static_x.shape != x.shape:
            self._capture(x)
        self._static_x.copy_(x)
        self._graph.replay()
        return self._static_out.clone()
