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
