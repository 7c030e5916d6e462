"""The candidate runner's Triton support, logic only (the GPU tests run it for real): kernel launches wrapped
in the token's ranges, and the audit hook letting Triton's own toolchain run while refusing the candidate's."""

from __future__ import annotations

import importlib
import site
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import stitchcuda.verifier.harness as harness_pkg

sys.path.insert(0, str(Path(harness_pkg.__file__).parent))
runner: Any = importlib.import_module("candidate_runner")
triton_launch: Any = importlib.import_module("triton_launch")
triton = pytest.importorskip("triton")

KERNELS = """
import triton
import triton.language as tl


@triton.jit
def plain_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


NOT_A_KERNEL = 3
"""


def candidate_module(tmp_path: Path) -> types.ModuleType:
    path = tmp_path / "model_new.py"
    path.write_text(KERNELS)
    module = types.ModuleType("model_new_triton_test")
    module.__file__ = str(path)
    exec(compile(KERNELS, str(path), "exec"), module.__dict__)
    return module


def test_every_kernel_launch_runs_inside_a_range_named_after_its_jit_function(tmp_path):
    module = candidate_module(tmp_path)
    launched: list[str] = []
    for name in ("plain_kernel", "tuned_kernel"):
        # Stand-ins for the GPU launch, so the wrapping is seen without a device.
        getattr(module, name).run = lambda *a, _n=name, **k: launched.append(_n)
    ranges: list[str] = []

    class Range:
        def __init__(self, label: str) -> None:
            ranges.append(label)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    counter, prof_on = [0], [True]
    names = triton_launch.wrap_kernels([module], "tok", counter, prof_on, Range)
    assert sorted(names) == ["plain_kernel", "tuned_kernel"]
    module.plain_kernel[(1,)](None, 4, BLOCK=64)
    module.tuned_kernel[(1,)](None, 4)
    assert launched == ["plain_kernel", "tuned_kernel"]
    assert ranges == ["tok::triton::plain_kernel", "tok::triton::tuned_kernel"]
    assert counter == [2]


def run_at(path: str, source: str, **scope: Any) -> None:
    """Runs source as if it were code of the file at `path` (a candidate file, or one of the triton package)."""
    exec(compile(source, path, "exec"), dict(scope))


def auditor(tmp_path: Path) -> Any:
    roots = {name: str(tmp_path / name) for name in ("cand", "ext", "work")}
    for root in roots.values():
        Path(root).mkdir(exist_ok=True)
    audit = runner.Auditor(runner.Findings(), roots)
    audit.phase = "first-call"
    return audit, roots


# subprocess.Popen(["ptxas", ...]) audits (executable=None, args, cwd, env) from the stdlib's subprocess.py.
POPEN = "audit.hook('subprocess.Popen', (None, [{tool!r}, '-v'], None, None))"


def test_triton_compiling_a_kernel_from_forward_may_run_ptxas_and_cc(tmp_path):
    audit, roots = auditor(tmp_path)
    triton_file = str(Path(site.getsitepackages()[0]) / "triton" / "backends" / "nvidia" / "compiler.py")
    forward = str(Path(roots["cand"]) / "model_new.py")
    for tool in ("/usr/bin/ptxas", "cc"):
        # forward (candidate code) launches a kernel; triton's compiler starts the tool.
        run_at(
            forward, "launch()", launch=lambda t=tool: run_at(triton_file, POPEN.format(tool=t), audit=audit)
        )
    assert audit.findings.items == []


def test_the_candidate_starting_the_same_tool_itself_is_refused(tmp_path):
    audit, roots = auditor(tmp_path)
    with pytest.raises(PermissionError):
        run_at(str(Path(roots["cand"]) / "model_new.py"), POPEN.format(tool="cc"), audit=audit)
    assert [i["rule"] for i in audit.findings.items] == ["D9.process"]


def test_triton_starting_a_tool_outside_the_toolchain_is_refused(tmp_path):
    audit, roots = auditor(tmp_path)
    triton_file = str(Path(site.getsitepackages()[0]) / "triton" / "runtime" / "build.py")
    with pytest.raises(PermissionError):
        run_at(triton_file, POPEN.format(tool="/bin/sh"), audit=audit)


def test_a_directory_scanned_by_its_fd_is_judged_by_where_it_points(tmp_path):
    """shutil.rmtree and os.fwalk list a directory through its fd: Triton cleaning its folder in the run's
    temporary directory is its own business; the candidate listing /etc through an fd is a scan."""
    import os
    import tempfile

    audit, roots = auditor(tmp_path)
    triton_file = str(Path(site.getsitepackages()[0]) / "triton" / "runtime" / "cache.py")
    forward = str(Path(roots["cand"]) / "model_new.py")
    scratch = tempfile.mkdtemp()
    fds = [os.open(scratch, os.O_RDONLY), os.open("/etc", os.O_RDONLY)]
    try:
        scan = "audit.hook('os.scandir', ({fd},))"
        run_at(forward, "launch()", launch=lambda: run_at(triton_file, scan.format(fd=fds[0]), audit=audit))
        assert audit.findings.items == []
        run_at(forward, scan.format(fd=fds[1]), audit=audit)
        assert [(i["rule"], i["detail"]) for i in audit.findings.items] == [
            ("D9.file-scan", "listed /etc (os.scandir)")
        ]
    finally:
        for fd in fds:
            os.close(fd)
        os.rmdir(scratch)
