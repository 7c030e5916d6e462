"""The `stitchcuda` command as a user runs it: real planner, coder and verifier on the CPU backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROBLEMS, REPO

pytestmark = pytest.mark.slow


def stitchcuda(*args: str, cwd: Path | None = None, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "stitchcuda.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=env,
    )


def test_optimize_writes_a_verified_program(tmp_path):
    out = tmp_path / "result"
    proc = stitchcuda("optimize", str(PROBLEMS / "01_elementwise_chain.py"), "--device", "cpu", "--rounds", "1",
                      "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verified" in proc.stderr and "x vs eager" in proc.stderr
    for name in ("model_new.py", "report.json", "report.html", "candidate/manifest.json"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert report["succeeded"] and report["best_row"]["accepted"]
    assert report["best_row"]["speedup_vs_eager"] > 0
    # Both baselines are measured in every verdict: torch.compile too, also on the CPU backend.
    assert report["best_row"]["speedup_vs_compile"] > 0 and "x vs torch.compile" in proc.stderr
    # Round counts agree (issue 18): the banner, the rounds the progress printed, and the report.
    assert "up to 2 rounds (round 0 generates, round 1 optimizes)" in proc.stderr
    printed = {line.split("round ", 1)[1].split(":")[0].split(" ")[0] for line in proc.stderr.splitlines()
               if " round " in line and (": " in line)}  # fmt: skip
    assert report["rounds_total"] == 2 and report["rounds_run"] == len(printed & {"0", "1"})
    assert f"{report['rounds_run']} of up to 2 rounds" in proc.stderr
    # The speedup comes with its interval, timed beside the eager reference.
    assert report["best_row"]["eager_source"] == "interleaved" and report["best_row"]["timing_rounds"] >= 1
    assert report["best_row"]["speedup_vs_eager_low"] <= report["best_row"]["speedup_vs_eager"]
    assert report["state"] == "succeeded"
    assert "<table>" in (out / "report.html").read_text()
    # The exported file is a drop-in KernelBench module: it builds its own extension and matches the reference.
    check = (
        "import importlib.util, torch, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref', {str(PROBLEMS / '01_elementwise_chain.py')!r})\n"
        "ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)\n"
        f"spec2 = importlib.util.spec_from_file_location('cand', {str(out / 'model_new.py')!r})\n"
        "cand = importlib.util.module_from_spec(spec2); spec2.loader.exec_module(cand)\n"
        "torch.manual_seed(0); m = ref.Model(*ref.get_init_inputs())\n"
        "torch.manual_seed(0); n = cand.ModelNew(*ref.get_init_inputs())\n"
        "x = ref.get_inputs()\n"
        "torch.testing.assert_close(n(*x), m(*x), rtol=1e-4, atol=1e-5)\n"
        "print('standalone ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)  # fmt: skip
    assert "standalone ok" in run.stdout, run.stderr[-2000:]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import torch\nclass Model(torch.nn.Module):\n    pass\n", "does not define get_inputs"),
        ("def oops(:\n", "syntax error at line 1"),
    ],
)
def test_bad_reference_exits_2_and_writes_nothing(tmp_path, source, message):
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    out = tmp_path / "out"
    proc = stitchcuda("optimize", str(bad), "--device", "cpu", "--out", str(out))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not out.exists()


def test_reference_failing_on_its_inputs_exits_2(tmp_path):
    bad = tmp_path / "fails.py"
    bad.write_text(
        "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x @ torch.ones(3, 5)\n\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    out = tmp_path / "out"
    proc = stitchcuda("optimize", str(bad), "--device", "cpu", "--out", str(out))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "line 5" in proc.stderr
    assert not out.exists()


def test_verify_json_reports_a_rejection(tmp_path):
    cand = tmp_path / "passthrough.py"
    cand.write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        'src = "torch::Tensor ident(torch::Tensor x) { return x.clone(); }"\n'
        'ext = load_inline(name="ident_ext", cpp_sources=src, functions=["ident"])\n\n'
        "class ModelNew(nn.Module):\n    def __init__(self, scale, shift):\n        super().__init__()\n"
        "        self.scale, self.shift = scale, shift\n\n    def forward(self, x):\n"
        "        y = torch.nn.functional.gelu(x * self.scale + self.shift, approximate='tanh')\n"
        "        return ext.ident(y * x)\n"
    )
    proc = stitchcuda(
        "verify", str(PROBLEMS / "01_elementwise_chain.py"), str(cand), "--device", "cpu", "--json"
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["accepted"] is False and verdict["device"] == "cpu"
    for key in ("compiled", "correct", "speedup_vs_eager", "speedup_vs_compile", "custom_kernel_share"):
        assert key in verdict
    assert any(f["severity"] == "reject" for f in verdict["findings"])


def test_verify_usage_error_exits_2(tmp_path):
    proc = stitchcuda(
        "verify", str(PROBLEMS / "01_elementwise_chain.py"), str(tmp_path / "missing"), "--json"
    )
    assert proc.returncode == 2 and "no such file" in proc.stderr
