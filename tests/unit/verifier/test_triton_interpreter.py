"""Triton candidates verified end to end on a CPU: the sandboxed run executes their kernels in Triton's
interpreter (TRITON_INTERPRET=1), so recognition, the run, the accounting and the checks are the same ones a GPU
run goes through. Skipped where triton is not installed (it is in the dev extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verifier_support import rejects

from stitchcuda.shared.candidate import from_kernelbench_source
from stitchcuda.verifier.service import VerifierService

pytest.importorskip("triton")

# A small row softmax (the interpreter runs a program at a time in numpy).
REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 200)]


def get_init_inputs():
    return []
"""

KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
"""
LAUNCH = (
    "        softmax_kernel[(rows,)](out, x, cols, BLOCK=triton.next_power_of_2(cols))\n        return out\n"
)


def verify(service: VerifierService, source: str):
    cand = from_kernelbench_source(source, backend="cpu")
    cand.candidate_id = "triton-cpu"
    return service.verify(REFERENCE, cand, device="cpu")


def test_an_honest_triton_softmax_is_accepted_and_its_kernel_is_the_candidates_own(service: VerifierService):
    verdict = verify(service, KERNEL + LAUNCH)
    assert verdict.accepted, verdict.feedback
    custom = [k for k in verdict.profile.kernels if k.origin == "custom"]
    assert [k.name for k in custom] == ["triton::softmax_kernel"]
    assert verdict.custom_kernel_share > 0.5


def test_a_triton_kernel_that_normalises_half_a_row_is_rejected_at_run_time(service: VerifierService):
    # Statically clean: the kernel reads only the first half of each row for its normaliser.
    wrong = KERNEL.replace(
        "e / tl.sum(e, axis=0)", "e / (2.0 * tl.sum(tl.where(cols < n_cols // 2, e, 0.0), axis=0))"
    )
    verdict = verify(service, wrong + LAUNCH)
    assert not verdict.accepted
    assert not verdict.correct, verdict.feedback


def test_a_launch_beside_a_torch_softmax_is_rejected(service: VerifierService):
    # The kernel runs (a decoy), torch.softmax does the work returned.
    decoy = LAUNCH.replace("return out", "return torch.softmax(x, dim=-1) + 0 * out")
    verdict = verify(service, KERNEL + decoy)
    assert not verdict.accepted
    assert "D11.torch-op" in rejects(verdict)


def test_the_triton_cache_is_private_to_the_run(service: VerifierService, tmp_path: Path):
    # A candidate that looks for another run's Triton cache finds only its own folder's, inside its work dir.
    probe = LAUNCH.replace(
        "        return out\n",
        "        import os\n"
        "        assert os.environ['TRITON_CACHE_DIR'].startswith(os.environ['HOME'])\n"
        "        assert os.environ['TRITON_INTERPRET'] == '1'\n"
        "        return out\n",
    )
    verdict = verify(service, KERNEL + probe)
    assert verdict.correct, verdict.feedback


def test_stitchcuda_verify_names_the_triton_format(tmp_path: Path, monkeypatch, capsys):
    from stitchcuda.verifier.cli import main

    monkeypatch.setenv("STITCH_HOME", str(tmp_path))
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(KERNEL + LAUNCH)
    args = [str(tmp_path / "ref.py"), str(tmp_path / "cand.py"), "--device", "cpu", "--no-compile-baseline"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "triton: 1 @triton.jit kernel (softmax_kernel)" and out["accepted"] is True
    (tmp_path / "cand.py").write_text("import torch\nimport triton\n\nclass ModelNew:\n    pass\n")
    assert main(args) == 2
    assert "@triton.jit" in capsys.readouterr().err
