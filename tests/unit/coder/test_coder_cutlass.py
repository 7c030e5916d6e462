"""The program's GEMMs as CUTLASS templates instantiated in its sources (CUDA, variant gemm_kernel=cutlass):
the unit the synthesizer writes, the layouts it instantiates, what stays as it was (convolutions, the default
variant), the Verifier's static checks under the strict policy, and nvcc compiling the unit against the
nvidia-cutlass package's headers as the Verifier's builder does. tests/gpu/test_synth_gpu.py runs them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_coder_cuda_build import NVCC, nvcc_command

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth import cutlass_gemm
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant, proposals
from stitchcuda.shared import cutlass
from stitchcuda.shared.policy import STRICT, KernelPolicy
from stitchcuda.verifier.build import object_key, shared_units
from stitchcuda.verifier.static import scan

LINEAR_RELU = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 0.5

def get_inputs():
    return [torch.randn(64, 96)]

def get_init_inputs():
    return [96, 80]
"""

BMM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b) + 1.0

def get_inputs():
    return [torch.randn(3, 40, 24), torch.randn(3, 24, 36)]

def get_init_inputs():
    return []
"""

CONV_TANH = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.tanh(self.conv(x))

def get_inputs():
    return [torch.randn(2, 3, 12, 12)]

def get_init_inputs():
    return []
"""

TRANSPOSED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a.T, b) + torch.matmul(a.T, b.T.contiguous().T)

def get_inputs():
    return [torch.randn(24, 40), torch.randn(24, 36)]

def get_init_inputs():
    return []
"""

CUTLASS = Variant(gemm="custom", gemm_kernel="cutlass")


def synthesize(source: str, variant: Variant) -> dict[str, str]:
    synthesis = Synthesizer(in_process=True).synthesize(  # references written here: trusted
        source, None, variant=variant, device="cuda", policy=KernelPolicy(STRICT)
    )
    assert list(synthesis.build.sources) == [f for f in synthesis.files if f.endswith((".cpp", ".cu"))]
    return dict(synthesis.files)


def forward_of(files: dict[str, str]) -> str:
    host = files["forward.cpp"]
    return host[host.rindex(" forward(") :]


def test_linear_becomes_a_cutlass_gemm_with_its_tail_a_kernel() -> None:
    files = synthesize(LINEAR_RELU, CUTLASS)
    unit = files[cutlass_gemm.FILE]
    assert cutlass.used_by([unit])
    # nn.Linear multiplies by the weight's transpose: A row-major, B column-major, and only that pair.
    assert "stitch_cutlass_run<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>" in unit
    assert unit.count("stitch_cutlass_run<cutlass::layout") == 1
    assert "cutlass::arch::OpMultiplyAddFastF32" in unit, "3xTF32 products: float32-class accuracy"
    kernels = files["kernels.cu"]
    # Declared outside the unnamed namespace (defined in the other unit), tried before the own kernels.
    assert kernels.index(cutlass_gemm.DECLARATION) < kernels.index("namespace {")
    launch = kernels[kernels.index("static void stitch_gemm_launch(") :]
    assert launch.index("stitch_cutlass_gemm(A, B, bias, C, dims)") < launch.index("stitch_gemm_with(")
    # Only where the device has tensor cores for it (compute capability 8.0, whatever the own kernels use).
    assert "stitch_tensor_core_device() && stitch_cutlass_gemm(" in launch
    forward = forward_of(files)
    assert "stitch_linear(" in forward and "_epilogue_launch(" not in forward


def test_cutlass_is_the_default_and_the_own_gemm_keeps_its_fused_epilogue() -> None:
    assert Variant(gemm="custom").gemm_kernel == "cutlass_sm90", "the fastest measured on Hopper"
    files = synthesize(LINEAR_RELU, Variant(gemm="custom", gemm_kernel="own", epilogue="fused"))
    assert cutlass_gemm.FILE not in files
    assert "stitch_cutlass_gemm" not in files["kernels.cu"]
    assert "_epilogue_launch(" in forward_of(files)
    assert not cutlass.used_by(files.values())


def test_batched_matmul_instantiates_row_major_operands() -> None:
    unit = synthesize(BMM, CUTLASS)[cutlass_gemm.FILE]
    assert "stitch_cutlass_run<cutlass::layout::RowMajor, cutlass::layout::RowMajor>" in unit
    assert "ColumnMajor>" not in unit


def test_transposed_operands_instantiate_column_major_layouts() -> None:
    # a.T is column-major, and so is b.T.contiguous().T (b's values, laid out by columns).
    unit = synthesize(TRANSPOSED, CUTLASS)[cutlass_gemm.FILE]
    runs = sorted(
        line.split("(")[0].strip() for line in unit.splitlines() if "return stitch_cutlass_run<" in line
    )
    assert runs == [
        "return stitch_cutlass_run<cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor>",
        "return stitch_cutlass_run<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>",
    ]


def test_convolutions_stay_the_own_kernels_with_their_epilogue() -> None:
    files = synthesize(CONV_TANH, CUTLASS.with_(epilogue="fused"))
    assert cutlass_gemm.FILE not in files, "no GEMM: nothing to instantiate"
    assert "_epilogue_launch(" in forward_of(files)


def test_strict_static_checks_accept_the_cutlass_program() -> None:
    synthesis = Synthesizer(in_process=True).synthesize(
        LINEAR_RELU, None, variant=CUTLASS, device="cuda", policy=KernelPolicy(STRICT)
    )
    findings = scan(to_candidate(synthesis), LINEAR_RELU, (), KernelPolicy(STRICT))
    rejected = [f"{f.rule}: {f.message}" for f in findings if f.severity == verify_pb2.SEVERITY_REJECT]
    assert rejected == []


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.skipif(cutlass.include_dir() is None, reason="the nvidia-cutlass package is not installed")
def test_cutlass_unit_compiles_and_links_to_the_kernels(tmp_path: Path) -> None:
    files = synthesize(LINEAR_RELU, CUTLASS)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    flags = cutlass.build_flags(files.values())
    assert flags == [f"-I{cutlass.include_dir()}", f"-I{cutlass.util_include_dir()}"]
    units = {
        name: subprocess.Popen(
            [*nvcc_command(tmp_path / name, tmp_path / f"{name}.o"), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("kernels.cu", cutlass_gemm.FILE)
    }
    for name, proc in units.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
    nm = shutil.which("nm") or "nm"

    def listed(obj: str, kind: str) -> bool:
        text = subprocess.run([nm, "-C", str(tmp_path / obj)], capture_output=True, text=True, check=True)
        return any(f" {kind} stitch_cutlass_gemm(" in line for line in text.stdout.splitlines())

    assert listed(f"{cutlass_gemm.FILE}.o", "T"), "the CUTLASS unit defines the entry point"
    assert listed("kernels.cu.o", "U"), "the kernels' unit calls it"


def test_build_flags_name_the_headers_or_say_how_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = ["#include <cuda_runtime.h>\n__global__ void k() {}"]
    assert cutlass.build_flags(plain) == []
    uses = ['#include "cutlass/gemm/device/gemm_universal.h"\n']
    monkeypatch.setattr(cutlass, "include_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match="nvidia-cutlass"):
        cutlass.build_flags(uses)


SM90 = Variant(gemm="custom", gemm_kernel="cutlass_sm90")


def test_sm90_gemm_serves_every_layout_with_one_instantiation() -> None:
    # Transposed operands, nn.Linear and bmm: the split pass lays every operand out K-major, so one
    # instantiation, no SM80 layouts, and the program is built for sm_90a too.
    for source in (TRANSPOSED, LINEAR_RELU, BMM):
        synthesis = Synthesizer(in_process=True).synthesize(
            source, None, variant=SM90, device="cuda", policy=KernelPolicy(STRICT)
        )
        unit = dict(synthesis.files)[cutlass_gemm.FILE]
        assert "stitch_cutlass_run<cutlass::layout" not in unit
        assert unit.count("using StitchSm90Gemm =") == 1
        assert "MMA_" not in unit and "KernelTmaWarpSpecializedCooperative" in unit
        assert "[hi | hi | lo]" in unit and "[hi | lo | hi]" in unit, "3xTF32 as one GEMM along 3K"
        assert "#define NDEBUG" in unit.split("#include")[0], "no device asserts in the wgmma pipeline"
        flags = list(synthesis.build.cuda_cflags)
        assert "-gencode=arch=compute_90a,code=sm_90a" in flags
        findings = scan(to_candidate(synthesis), source, (), KernelPolicy(STRICT))
        assert [f.rule for f in findings if f.severity == verify_pb2.SEVERITY_REJECT] == []
    plain = Synthesizer(in_process=True).synthesize(
        LINEAR_RELU, None, variant=CUTLASS, device="cuda", policy=KernelPolicy(STRICT)
    )
    assert not any("sm_90a" in f for f in plain.build.cuda_cflags), "only the Hopper GEMM needs sm_90a"


def test_sm90_unit_is_one_object_for_every_program() -> None:
    # The Verifier's builds share a unit's object by content (services/verifier/build.py): the Hopper GEMM
    # unit of programs with different GEMMs, layouts and tails keys the same object; their kernels do not.
    keys = []
    for source in (TRANSPOSED, LINEAR_RELU, BMM):
        candidate = to_candidate(
            Synthesizer(in_process=True).synthesize(
                source, None, variant=SM90, device="cuda", policy=KernelPolicy(STRICT)
            )
        )
        units = shared_units(candidate)
        assert list(units) == [cutlass_gemm.FILE], "only the CUTLASS unit is shared"
        keys.append(object_key(candidate, cutlass_gemm.FILE, units[cutlass_gemm.FILE], "9.0"))
    assert len(set(keys)) == 1


def test_sm90_gemm_falls_back_after_a_failure() -> None:
    failed = verify_pb2.Verdict(compiled=True, correct=False, reason="mismatch")
    proposed = [
        v.gemm_kernel for v, _ in proposals(SM90, failed, cuda=True) if v.gemm_kernel != SM90.gemm_kernel
    ]
    assert proposed[:2] == ["cutlass", "own"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.skipif(cutlass.include_dir() is None, reason="the nvidia-cutlass package is not installed")
def test_sm90_unit_compiles_for_sm90a_without_serialized_wgmma(tmp_path: Path) -> None:
    synthesis = Synthesizer(in_process=True).synthesize(
        TRANSPOSED, None, variant=SM90, device="cuda", policy=KernelPolicy(STRICT)
    )
    for name, text in synthesis.files.items():
        (tmp_path / name).write_text(text)
    unit = tmp_path / cutlass_gemm.FILE
    command = [
        *nvcc_command(unit, tmp_path / "unit.o"),
        *cutlass.build_flags([unit.read_text()]),
        *cutlass_gemm.SM90_CUDA_CFLAGS,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # ptxas warns (C7510) where a call inside the mainloop serializes the wgmma pipeline.
    assert "C7510" not in done.stdout + done.stderr
