"""What ships: the wheel built from this checkout, installed outside it, runs the main job and the Verifier."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import PROBLEMS, REPO

pytestmark = pytest.mark.slow

# The folders setup.py maps onto the `stitchcuda` import name.
ROOTS = {
    "services": "stitchcuda",
    "shared": "stitchcuda/shared",
    "proto/stitchcuda/api": "stitchcuda/api",
    "training": "stitchcuda/training",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = out.glob("stitchcuda-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def run_installed(
    target: Path, *args: str, cwd: Path, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """Runs the installed package from a folder outside the checkout (the checkout is not importable there)."""
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_every_tracked_source_and_data_file_is_in_the_wheel(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    missing = []
    for path in tracked.stdout.split():
        for source, package in ROOTS.items():
            if path.startswith(source + "/"):
                inside = f"{package}/{path[len(source) + 1 :]}"
                if inside not in names:
                    missing.append(path)
    assert not missing, f"not in the wheel: {missing[:20]}"
    for folder in ("stitchcuda/coder/synth/", "stitchcuda/coder/llm/", "stitchcuda/shared/templates/",
                   "stitchcuda/training/rubrics/"):  # fmt: skip
        assert any(n.startswith(folder) for n in names), folder


def test_the_installed_package_is_whole_and_runs_optimize_then_verify(installed: Path, tmp_path: Path):
    check = run_installed(installed, "-m", "stitchcuda.shared.selfcheck", cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    assert str(installed) in check.stdout, "the checkout, not the installed wheel, was imported"

    out = tmp_path / "result"
    problem = str(PROBLEMS / "01_elementwise_chain.py")
    optimize = run_installed(installed, "-m", "stitchcuda.cli", "optimize", problem, "--device", "cpu",
                             "--rounds", "0", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert optimize.returncode == 0, optimize.stderr[-3000:]
    assert (out / "report.html").is_file() and (out / "model_new.py").is_file()

    verify = run_installed(installed, "-m", "stitchcuda.cli", "verify", problem, str(out / "candidate"),
                           "--device", "cpu", cwd=tmp_path)  # fmt: skip
    assert verify.returncode == 0, (verify.stdout + verify.stderr)[-3000:]
    assert "accepted" in (verify.stdout + verify.stderr).lower()
