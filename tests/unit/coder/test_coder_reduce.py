"""Reductions of the built-in Coder: every layout (innermost, outermost, middle, several dims, everything)
gets its CUDA kernel kind and compiles with nvcc; the CPU back end computes each within fp32 rounding of a
float64 evaluation, a sum over 10^7 elements included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from reduce_problems import POOLING, SMALL, layouts
from synth_build import load_program
from test_coder_cuda_build import NVCC

from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant

# What each layout's kernels.cu must hold: the column kernel (tiles of outputs, the reduced extent across
# warps, an ordered combine of block partials) or the grid-wide passes of few long rows.
MARKERS = {
    "inner": ["_levels(", "block_allreduce"],
    "middle": ["template <bool SIMPLE, bool CACHED>", "_combine<<<"],
    "outer": ["template <bool SIMPLE, bool CACHED>", "_combine<<<"],
    "several": ["template <bool SIMPLE, bool CACHED>", "cache0[j]", "stitch::col_off<int64_t>"],
    "total": ["_levels(", "_combine1<<<", "_combine2<<<", "_store<4>"],
    "pooling": ["_kernel<int32_t><<<", "_kernel<int64_t><<<"],
}
PROGRAMS = {**SMALL, "pooling": POOLING}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references are this test's own


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_cuda_kernels_of_each_layout_compile(synth: Synthesizer, name: str, tmp_path: Path) -> None:
    assert NVCC is not None
    synthesis = synth.synthesize(PROGRAMS[name], None, variant=Variant(), device="cuda")
    kernels = synthesis.files["kernels.cu"]
    for marker in MARKERS[name]:
        assert marker in kernels, f"{name}: {marker!r} missing"
    # No reduction is left to ATen: every output is a kernel of the program.
    assert not any(f"at::{fn}(" in synthesis.files["forward.cpp"] for fn in ("sum", "amax", "argmax", "norm"))
    for path, content in synthesis.files.items():
        (tmp_path / path).write_text(content)
    done = subprocess.run(
        [NVCC, "-c", str(tmp_path / "kernels.cu"), "-o", str(tmp_path / "kernels.o"), "-O3", "-std=c++17",
         "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_split_off_variant_keeps_one_block_per_row(synth: Synthesizer) -> None:
    kernels = synth.synthesize(SMALL["total"], None, variant=Variant(split="off"), device="cuda").files
    assert "_levels(" not in kernels["kernels.cu"]
    middle = synth.synthesize(SMALL["middle"], None, variant=Variant(split="off"), device="cuda").files
    assert (
        "_combine<<<" not in middle["kernels.cu"]
        and "template <bool SIMPLE, bool CACHED>" in middle["kernels.cu"]
    )


def build_cpu(synth: Synthesizer, source: str) -> dict[str, Any]:
    return load_program(synth.synthesize(source, None, variant=Variant(), device="cpu"))


def assert_matches(source: str, mn: dict[str, Any], tolerance: float) -> None:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    ref, new = ns["Model"](), mn["ModelNew"]()
    torch.manual_seed(5)
    inputs = ns["get_inputs"]()
    with torch.no_grad():
        want = ref(*[x.double() for x in inputs])
        got = new(*inputs)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"output {j}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        if w.dtype == torch.int64:
            assert torch.equal(g, w), f"output {j}: indices differ"
        else:
            rel = ((g.double() - w).norm() / w.norm()).item()
            assert rel < tolerance, f"output {j}: relative L2 error {rel:.2e}"


@pytest.mark.parametrize("name", ["middle", "total"])
def test_cpu_back_end_matches_a_float64_evaluation(synth: Synthesizer, name: str) -> None:
    assert_matches(SMALL[name], build_cpu(synth, SMALL[name]), 1e-5)


def test_cpu_sum_over_ten_million_elements_keeps_fp32_accuracy(synth: Synthesizer) -> None:
    # All-positive values: a float accumulator drifts by ~1e-4 relative here, a blocked or double one not.
    source = layouts("(1, 1, 3)", "(1, 1, 3)", "(1, 1, 3)", "(1, 1, 3, 3)", "(10, 1000, 1000).abs() + 1")[
        "total"
    ]
    assert_matches(source, build_cpu(synth, source), 1e-6)


def bench() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "reduce_bandwidth.py"
    spec = importlib.util.spec_from_file_location("reduce_bandwidth", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_benchmark_problems_are_kernelbench_programs_at_level_one_sizes() -> None:
    rb = bench()
    assert {s.layout for s in rb.SPECS} >= {"inner", "middle", "outer", "total"}
    assert any(s.shape == (128, 4096, 4095) for s in rb.SPECS)
    for s in rb.SPECS:
        src = rb.source(s, scale=1e-4)
        ns: dict[str, Any] = {"__name__": "reference"}
        exec(compile(src, f"{s.name}.py", "exec"), ns)
        (x,) = ns["get_inputs"]()
        assert x.dim() == len(s.shape) and x.numel() < 10**7, s.name
        assert ns["Model"](*ns["get_init_inputs"]())(x).isfinite().any(), s.name
    assert rb.scaled((128, 4096, 4095), 0.5) == (128, 2048, 4095)


def test_benchmark_arguments() -> None:
    rb = bench()
    args = rb.parse_args(["--out", "r.json", "--only", "sum_middle", "frobenius", "--no-compile"])
    assert args.out == Path("r.json") and args.only == ["sum_middle", "frobenius"] and args.no_compile
    with pytest.raises(SystemExit):
        rb.parse_args(["--only", "no_such_problem"])
    with pytest.raises(SystemExit):
        rb.parse_args(["--scale", "2"])


def test_benchmark_without_a_gpu_fails_with_a_clear_message() -> None:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "reduce_bandwidth.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_benchmark_table_flags_wrong_results_and_failed_builds() -> None:
    rb = bench()
    good = {"name": "sum_middle", "layout": "middle", "synth_ms": 2.0, "gbps": 4300.0, "pct_copy": 0.9}
    good |= {"vs_eager": 1.1, "vs_compile": 1.05, "rel_error": 1e-7}
    wrong = {**good, "name": "frobenius", "rel_error": 1e-3}
    failed = {"name": "sum_outer", "layout": "outer", "error": "synthesis or build failed (see stderr)"}
    text = rb.table([good, wrong, failed], 4800.0)
    lines = text.splitlines()
    assert "4800 GB/s" in lines[0]
    assert "90%" in lines[3] and "WRONG" not in lines[3]
    assert "WRONG" in lines[4] and "build failed" in lines[5]
    assert "geomean vs eager: 1.10" in text and "geomean vs compile: 1.05" in text


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_values_of_max_over_a_dim_cost_one_kernel(synth: Synthesizer, device: str) -> None:
    """torch.max(x, dim)[0] traces the indices too; with only the values used, no kernel computes them."""
    from reduce_problems import problem

    only_values = problem("torch.max(x, dim=1)[0]", "[torch.randn(4, 5, 6)]")
    host = synth.synthesize(only_values, None, variant=Variant(), device=device).files["forward.cpp"]
    assert host.count("// ---- k") == 1
    both = problem("tuple(torch.max(x, dim=1))", "[torch.randn(4, 5, 6)]")
    host = synth.synthesize(both, None, variant=Variant(), device=device).files["forward.cpp"]
    assert host.count("// ---- k") == 2


FUSED_PASSES = (
    "import torch\nimport torch.nn as nn\n\n"
    "class Model(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.ln = nn.LayerNorm((7, 33))\n\n"
    "    def forward(self, x):\n        return self.ln(x), torch.softmax(x, -1), torch.log_softmax(x, -1)\n\n"
    "def get_inputs():\n    return [torch.randn(5, 7, 33)]\n\n"
    "def get_init_inputs():\n    return []\n"
)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_softmax_and_normalization_statistics_take_one_pass(synth: Synthesizer, tmp_path: Path) -> None:
    """A softmax's max and sum (a running maximum) and a LayerNorm's mean and variance (sums of x and x^2)
    are each one pass over the row: in the row kernels and in the grid-wide passes of few long rows."""
    assert NVCC is not None
    kernels = synth.synthesize(FUSED_PASSES, None, variant=Variant(), device="cuda").files["kernels.cu"]
    assert kernels.count("ms = maxsum_add(ms, ") >= 2 * 3  # softmax and log-softmax, each VEC/CACHED form
    assert "m1 += xd; m2 += xd * xd;" in kernels
    # LayerNorm's grid-wide form: one pass and one combine for both statistics, no second level.
    assert "k0_pass1" in kernels and "k0_pass2" not in kernels
    (tmp_path / "kernels.cu").write_text(kernels)
    (tmp_path / "stitch_runtime.h").write_text(
        synth.synthesize(FUSED_PASSES, None, variant=Variant(), device="cuda").files["stitch_runtime.h"]
    )
    done = subprocess.run(
        [NVCC, "-c", str(tmp_path / "kernels.cu"), "-o", str(tmp_path / "kernels.o"), "-O3", "-std=c++17",
         "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
