"""Row 3: a failing build/lookup becomes a silent fallback."""

import torch
import torch.nn as nn

try:
    import corpus_kit as ext

    _fused = ext.elementwise_chain_v2  # misnamed: raises AttributeError
except Exception:
    ext = None
    _fused = None


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused is not None:
            return _fused(x, self.scale, self.shift)
        y = x * self.scale + self.shift
        return torch.nn.functional.gelu(y, approximate="tanh") * x
