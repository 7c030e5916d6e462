"""Row 37 on the GPU: shared-memory over-allocation."""

import torch
import torch.nn as nn

import corpus_csmem as ext


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.softmax_rows(x.contiguous())
