"""Cross-entropy with int64 class-index targets (KernelBench level 1 problem 95's kind): the built-in Coder
writes it for both devices, and its CPU build (slow) matches PyTorch in float64 for every form torch offers
without class weights: classes along dim 1 of a 2-D or N-D input, ignore_index, label smoothing, class
probabilities as targets, and each reduction. An int64 input used for anything but class indices is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synth_build import load_program
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate, write_dir
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy

SOURCE = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, smoothing):
        super().__init__()
        self.loss = nn.CrossEntropyLoss(label_smoothing=smoothing, reduction="sum")

    def forward(self, logits, labels, maps, pixel_labels, soft):
        plain = F.cross_entropy(logits, labels)
        spatial = F.cross_entropy(maps, pixel_labels, ignore_index=2, reduction="none")
        smoothed = self.loss(logits, labels)
        probabilities = F.cross_entropy(logits, soft.softmax(dim=1), label_smoothing=0.2)
        return plain + smoothed + probabilities + spatial.mean(dim=(1, 2)).sum()


def get_inputs():
    return [
        torch.randn(6, 7),
        torch.randint(0, 7, (6,)),
        torch.randn(3, 5, 4, 2),
        torch.randint(0, 5, (3, 4, 2)),
        torch.randn(6, 7),
    ]


def get_init_inputs():
    return [0.1]
"""


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    # The reference is the test's own: traced in this process (the service uses a subprocess).
    return Synthesizer(in_process=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cross_entropy_is_written_under_both_policies(synth: Synthesizer, device: str) -> None:
    for policy in (STRICT, LIBRARY):
        synthesis = synth.synthesize(
            SOURCE, None, variant=Variant(), device=device, policy=KernelPolicy(policy)
        )
        validate(to_candidate(synthesis))
        # The targets reach the kernels as int64, not converted on the host.
        assert "int64_t" in synthesis.files["kernels.cu" if device == "cuda" else "forward.cpp"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_program_compiles(synth: Synthesizer, tmp_path: Path) -> None:
    # A row reduction reading four operands, one of them int64: read by index, never as float4, and no
    # row cache for so many operands (its stores named arrays never declared: an nvcc error).
    synthesis = synth.synthesize(SOURCE, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    write_dir(to_candidate(synthesis), tmp_path / "program")
    assert_program_compiles(tmp_path / "program", tmp_path)


@pytest.mark.slow
def test_compiled_cross_entropy_matches_pytorch(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(SOURCE, None, variant=Variant(), device="cpu", policy=KernelPolicy(STRICT))
    mn = load_program(synthesis)
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(SOURCE, "reference.py", "exec"), ns)
    ref = ns["Model"](0.1).double()  # type: ignore[operator]
    new = mn["ModelNew"](0.1)  # type: ignore[operator]
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        inputs = ns["get_inputs"]()  # type: ignore[operator]
        inputs[3][0, 0, 0] = 2  # at least one ignored pixel
        with torch.no_grad():
            want = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
            got = new(*inputs)
        assert got.dtype == torch.float32 and got.shape == want.shape
        rel = ((got.double() - want).abs() / want.abs()).item()
        assert rel < 1e-5, f"seed {seed}: relative error {rel:.2e}"


def test_integer_input_in_arithmetic_is_refused(synth: Synthesizer) -> None:
    source = SOURCE.replace("return plain + smoothed", "return (labels * 2).sum() + plain + smoothed")
    with pytest.raises(Unsupported, match="int64"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")
