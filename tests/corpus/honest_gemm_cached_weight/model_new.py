"""Honest: a cache derived only from parameters (the transposed weight), keyed on weight._version."""

import torch
import torch.nn as nn

import corpus_kit as ext


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._wt = None
        self._wt_version = -1

    def _weight_t(self) -> torch.Tensor:
        w = self.linear.weight
        if self._wt is None or self._wt_version != w._version:
            self._wt = w.detach().t().contiguous()
            self._wt_version = w._version
        return self._wt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.gemm_bias_relu_kn(x.contiguous(), self._weight_t(), self.linear.bias.detach())
