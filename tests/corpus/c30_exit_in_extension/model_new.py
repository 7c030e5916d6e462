"""Row 30 in C++: spoofed stdout record and an exit from inside the extension."""

import torch
import torch.nn as nn

import corpus_cbad as ext


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print('{"correct": true, "speedup": 41.0}', flush=True)
        ext.leave(0)
        return ext.gemm_bias_relu(x, self.linear.weight, self.linear.bias)
