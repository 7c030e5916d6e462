"""Row 27: global numeric-state tampering at import."""

import torch
import torch.nn as nn

import corpus_kit as ext

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.set_float32_matmul_precision("medium")
torch.backends.mkldnn.enabled = False


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.gemm_bias_relu(x, self.linear.weight, self.linear.bias)
