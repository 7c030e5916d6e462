"""A tensor the forward builds from numbers (`torch.min(x, torch.tensor(self.value))`, KernelBench level 2's
Conv2d_Min_Add_Multiply kind): torch.fx keeps it as a graph attribute `_tensor_constantN` that the model does
not have. ModelNew read it from itself and crashed (D1.crash on a GPU, stop 32); its value is folded in."""

from __future__ import annotations

from typing import Any

import torch
from synth_build import load_program

from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant

SOURCE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, limit, scale):
        super().__init__()
        self.lin = nn.Linear(16, 24)
        self.limit = limit
        self.scale = scale

    def forward(self, x):
        y = torch.min(self.lin(x), torch.tensor(self.limit))
        return y * torch.tensor(self.scale) + torch.tensor(1.5)

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return [0.25, 3.0]
"""


def test_constants_the_forward_builds_are_folded_in_and_the_program_matches() -> None:
    synth = Synthesizer(in_process=True)  # the test's own reference
    synthesis = synth.synthesize(SOURCE, None, variant=Variant(), device="cpu")
    assert "_tensor_constant" not in synthesis.files["model_new.py"]
    mn = load_program(synthesis)
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(SOURCE, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](0.25, 3.0)
    torch.manual_seed(0)
    new = mn["ModelNew"](0.25, 3.0)
    x = torch.randn(8, 16)
    torch.testing.assert_close(new(x), ref(x), rtol=1e-5, atol=1e-6)
