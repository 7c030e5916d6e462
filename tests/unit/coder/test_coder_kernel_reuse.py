"""A deep model's repeated layers share one kernel per distinct body, and each launch's host code is a function
of its own: public ResNet-101 was 724 kernels in a 4.2 MB kernels.cu that nvcc did not finish, and one
forward() of 9,000 lines that took the host compiler 336 s at -O2 (stop 32)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from synth_build import load_program
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.coder.synth.codegen import KernelBodies
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir

# Four residual blocks of one shape (training-mode BatchNorm: several row kernels a block), and a fifth of
# another width, whose kernels have the same bodies: sizes are run-time arguments.
DEEP = """import torch
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(c) for _ in range(4)])
        self.widen = nn.Conv2d(c, 2 * c, 1)
        self.last = Block(2 * c)

    def forward(self, x):
        return self.last(self.widen(self.blocks(x))).mean(dim=(2, 3))

def get_inputs():
    return [torch.rand(2, 4, 6, 6)]

def get_init_inputs():
    return [4]
"""
KERNELBENCH = Path(
    os.environ.get("STITCH_KERNELBENCH", Path(__file__).resolve().parents[4] / "shared" / "kernelbench")
)


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the test's own reference and public benchmark files, read as data


def kernel_defs(source: str) -> list[str]:
    return re.findall(r"__global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(", source)


def launches(forward: str) -> list[str]:
    """The kernels forward() launches, in order (a name again where a later launch reuses a kernel)."""
    return re.findall(r"\b(k\d+)_launch\(", forward.rsplit(" forward(", 1)[1])


def test_equal_bodies_up_to_names_are_one_kernel_and_others_are_not() -> None:
    bodies = KernelBodies()
    a = "// k1: a row kernel: bn1\nstatic void k1(const float* in0) { float v_bn1__2 = in0[0]; k1_x(v_bn1__2); }"
    b = "// k7: a row kernel: bn9\nstatic void k7(const float* in0) { float v_bn9__5 = in0[0]; k7_x(v_bn9__5); }"
    # The same names in another order of use: not the same body.
    c = "static void k8(const float* in0) { float v_a = in0[0]; float v_b = v_a; k8_x(v_a, v_b); }"
    d = "static void k9(const float* in0) { float v_a = in0[0]; float v_b = v_a; k9_x(v_b, v_a); }"
    assert [bodies.add(n, s) for n, s in [("k1", a), ("k7", b), ("k8", c), ("k9", d)]] == [
        "k1",
        "k1",
        "k8",
        "k9",
    ]
    assert len(bodies.functions) == 3


def test_repeated_blocks_share_kernels_and_the_cpu_program_matches(synth: Synthesizer) -> None:
    cuda = synth.synthesize(DEEP, None, variant=Variant(), device="cuda")
    kernels, forward = cuda.files["kernels.cu"], cuda.files["forward.cpp"]
    launched = launches(forward)
    defined = {
        re.sub(r"_(kernel|stage\d|combine)$", "", k) for k in kernel_defs(kernels) if k.startswith("k")
    }
    assert len(launched) >= 5 * 3  # a few kernels a block
    assert set(launched) == defined  # every launch calls a kernel that is there, and each kernel is used
    assert len(defined) * 3 <= len(launched)
    # A kernel whose body an earlier one has launches the earlier one's entry point.
    sections = forward.rsplit(" forward(", 1)[1].split("// ---- ")[1:]  # one a launch: "k7 (row) covers ..."
    calls = [(sec.split(" ", 1)[0], re.findall(r"\b(k\d+)_launch\(", sec)) for sec in sections]
    assert any(called != [own] for own, called in calls)
    # Each launch's host code is a function of its own.
    assert forward.count("[&]() __attribute__((noinline)) {") == len(launched)

    program = synth.synthesize(DEEP, None, variant=Variant(), device="cpu")
    assert len(set(re.findall(r"\b(k\d+)\(O0_", program.files["forward.cpp"]))) * 3 <= len(launched)
    mn = load_program(program)
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(DEEP, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](4)
    torch.manual_seed(0)
    new = mn["ModelNew"](4)
    for _ in range(2):  # training mode: the running statistics change between calls, the same way
        x = torch.rand(2, 4, 6, 6)
        torch.testing.assert_close(new(x), ref(x), rtol=1e-4, atol=1e-5)
    for name, buf in ref.named_buffers():
        if not buf.is_floating_point():
            continue  # num_batches_tracked: only momentum=None reads it, and that is refused (normalize.py)
        torch.testing.assert_close(dict(new.named_buffers())[name], buf, rtol=1e-4, atol=1e-6)


def test_public_resnet101_is_a_few_dozen_kernels(synth: Synthesizer) -> None:
    path = KERNELBENCH / "level3" / "10_ResNet101.py"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    files = synth.synthesize(path.read_text(), None, variant=Variant(), device="cuda").files
    assert len(launches(files["forward.cpp"])) > 700
    assert len(kernel_defs(files["kernels.cu"])) < 60
    assert len(files["kernels.cu"]) < 200_000


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_deep_program_compiles_for_cuda(synth: Synthesizer, tmp_path: Path) -> None:
    write_dir(to_candidate(synth.synthesize(DEEP, None, variant=Variant(), device="cuda")), tmp_path / "p")
    assert_program_compiles(tmp_path / "p", tmp_path)


def test_the_verifier_attributes_every_kernel_the_program_defines(synth: Synthesizer) -> None:
    """The Verifier tells the program's own kernels from vendor ones by the `__global__` names it defines; a
    kernel it misses whose name says "gemm" is taken for cuBLAS (the GPU run of stop 32 rejected the new
    convolution as D6.library-kernel: its `__launch_bounds__` has a parenthesised argument)."""
    from stitchcuda.verifier.accounting import global_symbols

    mixed = DEEP.replace(
        "        self.last = Block(2 * c)\n",
        "        self.last = Block(2 * c)\n        self.fc = nn.Linear(2 * c, 5)\n",
    )
    mixed = mixed.replace(
        "return self.last(self.widen(self.blocks(x))).mean(dim=(2, 3))",
        "return self.fc(self.last(self.widen(self.blocks(x))).mean(dim=(2, 3)))",
    )
    kernels = synth.synthesize(mixed, None, variant=Variant(), device="cuda").files["kernels.cu"]
    defined = set(
        re.findall(r"__global__ void (?:__launch_bounds__\((?:[^()]|\([^()]*\))*\) )?(\w+)\(", kernels)
    )
    assert {"stitch_gemm_big_kernel", "stitch_gemm_kernel", "stitch_conv_igemm_kernel"} <= defined
    assert defined <= global_symbols({"kernels.cu": kernels})
