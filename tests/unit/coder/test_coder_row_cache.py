"""Row kernels that read more operands than their register cache holds (a LayerNorm or a softmax over a sum of
three tensors, Swin-MLP's blocks): no pass of theirs may use the cache, whose arrays are then not declared;
nvcc rejects a use even in a discarded `if constexpr` branch (the GPU run of stop 31 found it in SwinMLP)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir

THREE_OPERANDS = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)

    def forward(self, a, b, c):
        x = a + self.fc(b) + c * 2.0
        return self.norm(x) + torch.softmax(x + a, dim=-1)

def get_inputs():
    return [torch.rand(8, 64), torch.rand(8, 64), torch.rand(8, 64)]

def get_init_inputs():
    return []
"""
KERNELBENCH = Path(
    os.environ.get("STITCH_KERNELBENCH", Path(__file__).resolve().parents[4] / "shared" / "kernelbench")
)


def undeclared_caches(kernels: str) -> dict[str, set[str]]:
    """Per kernel template: the cache arrays its body uses but does not declare."""
    out = {}
    for body in re.split(r"\ntemplate <", kernels)[1:]:
        name = re.search(r"(\w+)_kernel\(", body)
        used = set(re.findall(r"\bcache(\d+)\[it\]", body))
        declared = set(re.findall(r"float4 cache(\d+)\[", body))
        if used - declared:
            out[name.group(1) if name else "?"] = used - declared
    return out


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the test's own reference and public benchmark files, read as data


def test_a_row_kernel_over_three_operands_declares_every_cache_it_uses(synth: Synthesizer) -> None:
    kernels = synth.synthesize(THREE_OPERANDS, None, variant=Variant(), device="cuda").files["kernels.cu"]
    assert "_RCACHE" in kernels  # a row kernel was made
    assert undeclared_caches(kernels) == {}


def test_public_swin_mlp_declares_every_cache_it_uses(synth: Synthesizer) -> None:
    path = KERNELBENCH / "level3" / "29_SwinMLP.py"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    kernels = synth.synthesize(path.read_text(), None, variant=Variant(), device="cuda").files["kernels.cu"]
    assert undeclared_caches(kernels) == {}


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_three_operand_program_compiles_for_cuda(synth: Synthesizer, tmp_path: Path) -> None:
    write_dir(
        to_candidate(synth.synthesize(THREE_OPERANDS, None, variant=Variant(), device="cuda")), tmp_path / "p"
    )
    assert_program_compiles(tmp_path / "p", tmp_path)
