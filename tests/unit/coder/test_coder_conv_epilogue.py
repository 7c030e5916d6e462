"""The pointwise kernel over an own convolution's or nn.Linear's output runs inside that kernel's store
(CUDA): the convolution or GEMM is launched at the pointwise kernel's step with its expression as the
epilogue, so the output is written once and never read back. Where another step reads the output, the
variant asks for separate kernels, or the program runs on the CPU, the op stays a launch of its own. The
kernels' side (the epilogue at each element's flat index) is emulated in test_coder_conv_igemm.py and
test_coder_gemm_tiles.py; GPU runs are in tests/gpu/test_synth_conv_gpu.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_coder_cuda_build import NVCC, assert_program_compiles
from test_coder_custom_conv import problem

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir
from stitchcuda.shared.policy import STRICT, KernelPolicy

# Level-2 shapes of epilogue: a broadcast parameter, a constant, an activation, a residual input; a plain and
# a transposed convolution, a Linear over 3-D input; one whose output a reduction also reads (not fusable).
FUSABLE = problem(
    [
        "nn.Conv2d(3, 16, 3, padding=1)",
        "nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)",
        "nn.Parameter(torch.randn(16, 1, 1))",
        "nn.Linear(10, 12)",
        "nn.Parameter(torch.randn(12))",
    ],
    "torch.tanh(self.l1(torch.relu(self.l0(x) + self.l2) * 0.5)) + r, "
    "torch.nn.functional.leaky_relu(self.l3(x[0]) * self.l4, 0.1)",
    "[torch.randn(2, 3, 9, 10), torch.randn(2, 8, 18, 20)]",
    args="x, r",
)
SHARED = problem(
    ["nn.Conv2d(3, 16, 3)"],
    "torch.relu(self.l0(x)) + self.l0(x).mean(dim=(2, 3), keepdim=True)",
    "[torch.randn(2, 3, 9, 10)]",
)


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


def program(synth: Synthesizer, source: str, device: str = "cuda", **variant: str) -> dict[str, str]:
    synthesis = synth.synthesize(
        source, None, variant=Variant(**variant), device=device, policy=KernelPolicy(STRICT)
    )
    return dict(synthesis.files)


def forward_of(files: dict[str, str]) -> str:
    """forward()'s definition in the host file."""
    host = files["forward.cpp"]
    return host[host.rindex(" forward(") :]


# Epilogues inside every store: a variant the optimize skill tries (the default keeps the implicit GEMM's out of
# its store since the H200's measurements), with the own GEMM kernels (a CUTLASS GEMM keeps its tail as a kernel).
FUSED = {"epilogue": "fused", "gemm_kernel": "own"}


def test_each_pointwise_kernel_over_a_convolution_runs_in_its_store(synth: Synthesizer) -> None:
    files = program(synth, FUSABLE, **FUSED)
    forward, kernels = forward_of(files), files["kernels.cu"]
    assert forward.count("stitch_conv_prepare(") == 2 and forward.count("stitch_linear_prepare(") == 1
    assert len(re.findall(r"\bk\d+_epilogue_launch\(", forward)) == 3
    assert "stitch_conv(" not in forward and "stitch_linear(" not in forward  # none launched on its own
    assert "void stitch_conv_launch(" not in kernels  # so the plain kernels are not built
    assert "void stitch_gemm_launch(" not in kernels
    assert kernels.count("_epi {") == 3
    assert "stitch_conv_with<true>(" in kernels and "stitch_conv_with<false>(" in kernels
    assert "stitch_gemm_with(lx, lw, lb, out, geom, e);" in kernels
    # The convolution's output is the epilogue's `v`, never loaded; the broadcast parameter is.
    functor = kernels[kernels.index("_epi {") : kernels.index("_epilogue_launch(")]
    assert "(v + in1[b1 + c * cs1])" in functor and "st_relu(v_add)" in functor


def test_a_convolution_another_step_reads_stays_a_launch_of_its_own(synth: Synthesizer) -> None:
    files = program(synth, SHARED, **FUSED)
    forward = forward_of(files)
    assert "stitch_conv(" in forward and "stitch_conv_prepare(" not in forward
    assert "void stitch_conv_launch(" in files["kernels.cu"]


def test_by_default_a_convolution_takes_its_epilogue_where_it_costs_least(synth: Synthesizer) -> None:
    """epilogue=auto: each convolution launches with its pointwise kernel through stitch_conv_tail (inside
    Hopper's, the depthwise and the direct kernels' stores, a pass after the implicit GEMM); the CUTLASS GEMM
    keeps its kernel."""
    files = program(synth, FUSABLE)
    forward, kernels = forward_of(files), files["kernels.cu"]
    assert forward.count("stitch_conv_prepare(") == 2 and "stitch_conv(" not in forward
    assert forward.count("stitch_linear(") == 1 and "stitch_linear_prepare(" not in forward
    assert "stitch_conv_tail<true>(lx, lw, lb, out, geom, e);" in kernels
    assert "stitch_conv_tail<false>(lx, lw, lb, out, geom, e);" in kernels
    assert "stitch_conv_with<true>(lx" not in kernels and "stitch_conv_with<false>(lx" not in kernels
    # The pass after the implicit GEMM reads back what it stored; the others apply it in their stores.
    tail = kernels[kernels.index("static void stitch_conv_tail(") :]
    assert "stitch_conv_run_with<kT, false>(x, w, bias, y, geom, epi);" in tail[: tail.index("\n}\n")]
    run = kernels[kernels.index("static void stitch_conv_run_with(") :]
    run = run[: run.index("\n}\n")]
    assert "} else if (stitch_conv_igemm<kT>(x, w, bias, y, g, StitchNoEpi{})) {" in run
    assert "stitch_conv_epi_pass<Epi><<<" in run
    assert "stitch_conv_tc_sm90(x, w, bias, y, geom, g, kT, epi)" in run


@pytest.mark.parametrize(
    ("device", "variant"),
    [
        ("cuda", {"epilogue": "kernel"}),
        ("cuda", {"epilogue": "kernel", "gemm_kernel": "own"}),
        ("cpu", FUSED),
    ],
)
def test_separate_kernels_where_the_variant_or_the_device_says_so(
    synth: Synthesizer, device: str, variant: dict[str, str]
) -> None:
    files = program(synth, FUSABLE, device, **variant)
    forward = forward_of(files)
    assert forward.count("stitch_conv(") == 2 and forward.count("stitch_linear(") == 1
    assert "_prepare(" not in forward


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_fused_programs_compile(synth: Synthesizer, tmp_path: Path) -> None:
    """kernels.cu with nvcc (every convolution kernel instantiated with each epilogue functor), forward.cpp
    parsed against this torch's headers."""
    candidate = to_candidate(
        synth.synthesize(FUSABLE, None, variant=Variant(**FUSED), device="cuda", policy=KernelPolicy(STRICT))
    )
    folder = tmp_path / "program"
    write_dir(candidate, folder)
    assert_program_compiles(folder, tmp_path)
