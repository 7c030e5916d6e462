"""Honest CUDA MSE with non-deterministic atomics."""

import torch
import torch.nn as nn

import corpus_ckit as ext


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ext.mse_loss(predictions.contiguous(), targets.contiguous())
