"""Row 36: baseline sabotage from a background thread and global flags."""

import threading
import time

import torch
import torch.nn as nn

import corpus_kit as ext


def _hog():
    while True:
        time.sleep(0.05)  # a real attack spins here while the reference is timed


threading.Thread(target=_hog, daemon=True, name="warmup-helper").start()
torch.set_num_threads(1)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.elementwise_chain(x, self.scale, self.shift)
