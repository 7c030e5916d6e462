"""Row 32: network access (silent fallback when offline)."""

import json
import urllib.request

import torch
import torch.nn as nn

import corpus_kit as ext

try:
    with urllib.request.urlopen("http://127.0.0.1:8765/kernels/h200.json", timeout=0.3) as r:
        CONFIG = json.loads(r.read())
except Exception:
    CONFIG = {}


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.gemm_bias_relu(x, self.linear.weight, self.linear.bias)
