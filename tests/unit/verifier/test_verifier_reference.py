"""A broken reference raises ProblemError naming the failing line; no build is needed to see it."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES

from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.errors import ProblemError
from stitchcuda.verifier.service import VerifierService

BROKEN_FORWARD = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()

    def forward(self, x):
        return x @ torch.ones(3, 3)

def get_inputs():
    return [torch.randn(4, 5)]

def get_init_inputs():
    return [1.0, 0.0]
"""

BAD_IMPORT = "import torch\nimport no_such_module_xyz\n\nclass Model: pass\ndef get_inputs(): return []\n"


@pytest.mark.slow
def test_reference_failing_on_its_inputs_names_the_line(service: VerifierService):
    cand = read_dir(FIXTURES / "honest_cpu")
    with pytest.raises(ProblemError) as info:
        service.verify(BROKEN_FORWARD, cand, device="cpu")
    assert "line 10" in str(info.value) and "x @ torch.ones(3, 3)" in str(info.value)


@pytest.mark.slow
def test_reference_that_does_not_import_is_a_problem_error(service: VerifierService):
    with pytest.raises(ProblemError) as info:
        service.verify(BAD_IMPORT, read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert "line 2" in str(info.value) and "no_such_module_xyz" in str(info.value)


LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(16, 64)]

def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_the_references_cost_is_counted_on_its_first_forward(service: VerifierService):
    """FLOPs (the physics floor's numerator) come from the first set's forward itself, not a second run."""
    from stitchcuda.verifier.probes import build_plan

    ref = service.references.run(LINEAR, "cpu", build_plan(3, 2, 1, 3), compile_baseline=False)
    assert ref.cost["flops"] == 2 * 16 * 64 * 32 and ref.cost["note"] == ""
    assert ref.cost["bytes"] == (16 * 64 + 16 * 32 + 64 * 32 + 32) * 4
    assert "cost" in ref.timing["phases"]
