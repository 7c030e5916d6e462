"""Honest softmax with a blocked (different-order) reduction."""

import torch
import torch.nn as nn

import corpus_kit as ext

BLOCK = 64


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.softmax_rows_blocked(x.contiguous(), BLOCK)
