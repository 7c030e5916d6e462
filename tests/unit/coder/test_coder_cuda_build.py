"""The CUDA programs of the built-in synthesizer compile where no GPU is: kernels.cu through nvcc with no torch
header (seconds), forward.cpp through the host compiler with the light torch headers, and the launchers that
the host file calls are the ones the kernels' object exports. Skipped where nvcc is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy

PROBLEMS = Path(__file__).resolve().parents[3] / "benchmarks" / "problems"
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def nvcc_include() -> str:
    """The CUDA toolkit's include folder (nvcc may be a wrapper script on the PATH)."""
    assert NVCC is not None
    done = subprocess.run([NVCC, "--dryrun", "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"INCLUDES=\"?-I\"?([^\"\s]+)", done.stdout + done.stderr)
    candidates = [found.group(1)] if found else []
    candidates += [str(Path(NVCC).resolve().parents[1] / "include"), "/usr/local/cuda/include"]
    return next((c for c in candidates if (Path(c) / "cuda_runtime.h").is_file()), candidates[-1])


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    synth = Synthesizer(in_process=True)  # the suite's references are trusted
    root = tmp_path_factory.mktemp("cuda-programs")
    out = {}
    for name, policy in [("12_attention", STRICT), ("14_lstm", LIBRARY), ("04_softmax", STRICT)]:
        cand = to_candidate(
            synth.synthesize(
                (PROBLEMS / f"{name}.py").read_text(),
                None,
                variant=Variant(),
                device="cuda",
                policy=KernelPolicy(policy),
            )
        )
        write_dir(cand, root / name)
        out[name] = root / name
    return out


def nvcc_command(kernels: Path, obj: Path) -> list[str]:
    """nvcc compiling a program's kernels.cu alone, as the Verifier's builder does (sm_90)."""
    assert NVCC is not None
    return [NVCC, "-c", str(kernels), "-o", str(obj), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC"]  # fmt: skip


def host_syntax_command(forward: Path, scratch: Path) -> list[str]:
    """c++ -fsyntax-only of a program's forward.cpp against this torch's headers (a CPU build of torch
    lacks one generated CUDA header: a stub under `scratch`)."""
    stub = scratch / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    includes = [f"-I{scratch / 'stub'}", f"-I{nvcc_include()}"]
    includes += [f"-isystem{p}" for p in cpp_extension.include_paths()]
    includes.append(f"-isystem{sysconfig.get_paths()['include']}")
    return ["c++", "-fsyntax-only", "-std=c++17", "-DTORCH_EXTENSION_NAME=stitch_test",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *includes, str(forward)]  # fmt: skip


def host_unit(folder: Path, scratch: Path) -> Path:
    """forward.cpp and binding.cpp as one file to parse: a binding whose declaration of forward() differs
    from the definition is then an ambiguous overload, a compile error (apart, a missing symbol at import)."""
    scratch.mkdir(parents=True, exist_ok=True)
    unit = scratch / f"{folder.name}_host.cpp"
    unit.write_text(f'#include "{folder / "forward.cpp"}"\n#include "{folder / "binding.cpp"}"\n')
    return unit


def assert_program_compiles(folder: Path, scratch: Path) -> None:
    """A written CUDA program: its host code parses and its kernels compile (the two at once)."""
    host = subprocess.Popen(
        host_syntax_command(host_unit(folder, scratch), scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    kernels = subprocess.run(
        nvcc_command(folder / "kernels.cu", scratch / "kernels.o"),
        capture_output=True,
        text=True,
        check=False,
    )
    out, _ = host.communicate(timeout=600)
    assert kernels.returncode == 0, kernels.stderr[-3000:]
    assert host.returncode == 0, out[-3000:]


def symbols(obj: Path, kind: str) -> set[str]:
    listing = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    return {
        line.split()[-1] for line in listing.splitlines() if f" {kind} " in line and "stitch_launch" in line
    }


@pytest.mark.parametrize("name", ["12_attention", "14_lstm", "04_softmax"])
def test_kernels_compile_with_nvcc_alone_in_seconds(
    programs: dict[str, Path], name: str, tmp_path: Path
) -> None:
    assert NVCC is not None
    folder = programs[name]
    obj = tmp_path / "kernels.o"
    started = time.monotonic()
    done = subprocess.run(
        nvcc_command(folder / "kernels.cu", obj), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exported = symbols(obj, "T")
    assert exported, "the kernels' object exports its launchers"
    print(f"{name}: kernels.cu in {time.monotonic() - started:.1f} s")


def test_host_code_parses_with_the_light_headers(programs: dict[str, Path], tmp_path: Path) -> None:
    """forward.cpp against this torch's headers (a CPU build lacks one generated CUDA header: a stub)."""
    procs = {
        name: subprocess.Popen(
            host_syntax_command(host_unit(folder, tmp_path), tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, folder in programs.items()
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
        host = (programs[name] / "forward.cpp").read_text()
        assert "torch/extension.h" not in host and "pybind" not in host, "the binding is its own unit"
        assert "PYBIND11_MODULE" in (programs[name] / "binding.cpp").read_text()
        declared = set(re.findall(r"^void (\w+_launch)\(", host, re.MULTILINE))
        kernels = (programs[name] / "kernels.cu").read_text()
        exported = set(
            re.findall(r"^void (\w+_launch)\(", kernels.split("namespace stitch_launch {")[1], re.MULTILINE)
        )
        assert declared == exported, name


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
