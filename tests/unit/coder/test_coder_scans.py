"""Scans (cumsum, cumprod; reverse, exclusive and masked forms), flips and triangular masks: the built-in
Coder writes one helper kernel call per op (reverse and exclusive forms folded into the scan), its CUDA
sources compile with nvcc, and (slow) each program passes the Verifier on CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir
from stitchcuda.shared.policy import STRICT, KernelPolicy


def problem(forward: str, inputs: str, args: str = "x", init: str = "[1]") -> str:
    """A KernelBench-format reference whose model keeps the scan dim as an int attribute."""
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, dim):\n        super().__init__()\n        self.dim = dim\n\n"
        f"    def forward(self, {args}):\n        return {forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        f"def get_init_inputs():\n    return {init}\n"
    )


# Rows of 1100 span two tiles of the CUDA row scan (1024 elements a tile).
PROBLEMS = {
    # cumsum along the last dim and along a middle dim, cumprod (values near 1 keep the products finite).
    "scans": problem(
        "torch.cumsum(x, dim=-1), x.cumsum(self.dim), torch.cumprod(x * 0.5 + 0.75, dim=2)",
        "[torch.rand(3, 5, 1100)]",
    ),
    # Reverse (flip, scan, flip), exclusive (minus the element; zeros then all but the last), masked.
    "reverse_exclusive_masked": problem(
        "(torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim), torch.cumsum(x, self.dim) - x, "
        "torch.cat([torch.zeros_like(x[:, :1]), x.cumsum(self.dim)[:, :-1]], dim=self.dim), "
        "torch.cumsum(x * mask, dim=self.dim))",
        "[torch.rand(6, 1100), torch.randint(0, 2, (6, 1100)).bool()]",
        args="x, mask",
    ),
    "flip_triangles": problem(
        "torch.flip(x, dims=[0, 2]), torch.triu(x, diagonal=1), torch.tril(x, diagonal=-1), x.flip(self.dim), x.flip(0)",
        "[torch.rand(2, 7, 9)]",
    ),
}

# The helper calls each program's forward makes, in order (scan: dim, prod, reverse, exclusive).
CALLS = {
    "scans": [
        "stitch_scan(T_x, 2, false, false, false)",
        "stitch_scan(T_x, 1, false, false, false)",
        "stitch_scan(T_add, 2, true, false, false)",
    ],
    "reverse_exclusive_masked": [
        "stitch_scan(T_x, 1, false, true, false)",
        "stitch_scan(T_x, 1, false, false, true)",
        "stitch_scan(T_x, 1, false, false, true)",
        "stitch_scan(T_mul, 1, false, false, false)",
    ],
    "flip_triangles": [
        "stitch_flip(T_x, std::vector<int64_t>{static_cast<int64_t>(0), static_cast<int64_t>(2)})",
        "stitch_tri(T_x, true, 1)",
        "stitch_tri(T_x, false, -1)",
        "stitch_flip(T_x, std::vector<int64_t>{static_cast<int64_t>(1)})",
        "stitch_flip(T_x, std::vector<int64_t>{static_cast<int64_t>(0)})",
    ],
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


def host_calls(source: str) -> list[str]:
    return re.findall(r"= (stitch_(?:scan|flip|tri)\(.*\));", source)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_each_op_is_one_call_of_its_own_kernel(synth: Synthesizer, name: str, device: str) -> None:
    synthesis = synth.synthesize(PROBLEMS[name], None, variant=Variant(), device=device)
    host = synthesis.files["forward.cpp"]
    # The reverse form is one scan from the end (no flip left), both exclusive forms one exclusive scan.
    assert host_calls(host) == CALLS[name]
    assert not re.search(r"at::(cumsum|cumprod|flip|triu|tril)\b", host)
    assert synthesis.build.libraries == []


@pytest.mark.parametrize(
    "forward",
    [
        "torch.cat([torch.zeros_like(x[:, :1]), x.cumsum(1)[:, 1:]], dim=1)",  # drops the first, not the last
        "torch.cat([torch.ones_like(x[:, :1]), x.cumsum(1)[:, :-1]], dim=1)",  # a fill other than 0
        "torch.cat([x.cumsum(1)[:, :-1], torch.zeros_like(x[:, :1])], dim=1)",  # the fill at the end
        "((c := torch.cumsum(x, 1)) - x, c)",  # the inclusive scan is read as well
        "torch.cumsum(x.flip(0), 1).flip(0)",  # flipped along another dim than the scan's
    ],
)
def test_lookalikes_of_reverse_and_exclusive_scans_are_not_folded(synth: Synthesizer, forward: str) -> None:
    source = problem(forward, "[torch.rand(4, 9)]")
    host = synth.synthesize(source, None, variant=Variant(), device="cpu").files["forward.cpp"]
    assert re.search(r"stitch_scan\(T_\w+, 1, false, false, false\)", host)
    assert not re.search(r"stitch_scan\(.*(true, false|false, true)\)", host)


def test_bool_mask_input_is_checked_as_bool(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(PROBLEMS["reverse_exclusive_masked"], None, variant=Variant(), device="cpu")
    assert 'T_mask.scalar_type() == at::kBool, "mask must be bool"' in synthesis.files["forward.cpp"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_sources_compile(synth: Synthesizer, tmp_path: Path) -> None:
    """kernels.cu with nvcc alone, forward.cpp parsed against this torch's headers (as test_coder_cuda_build)."""
    # One program with the three helpers: the scans' and the flip/triangle problems' outputs together.
    both = PROBLEMS["reverse_exclusive_masked"].replace(
        "torch.cumsum(x * mask, dim=self.dim))",
        "torch.cumsum(x * mask, dim=self.dim), torch.cumprod(x, 0), torch.triu(x, -1), x.flip(0))",
    )
    candidate = to_candidate(
        synth.synthesize(both, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    )
    write_dir(candidate, tmp_path / "program")
    folder = tmp_path / "program"
    for helper in ("stitch_scan_launch", "stitch_flip_launch", "stitch_tri_launch"):
        assert f"void {helper}(" in (folder / "kernels.cu").read_text()
    assert_program_compiles(folder, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_program_is_accepted_by_the_verifier_on_cpu(synth: Synthesizer, verifier, name: str) -> None:  # type: ignore[no-untyped-def]
    source = PROBLEMS[name]
    candidate = to_candidate(
        synth.synthesize(source, None, variant=Variant(), device="cpu", policy=KernelPolicy(STRICT))
    )
    verdict = verifier.verify(
        source, candidate, device="cpu", policy=verify_pb2.VerifyPolicy(kernel_policy=STRICT)
    )
    assert verdict.accepted and verdict.correct, verdict.reason
