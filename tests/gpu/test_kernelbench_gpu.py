"""The main job on a GPU at KernelBench scale: a public level-2 problem end to end through `stitchcuda
optimize --device cuda` (the Planner, the built-in Coder, the Verifier with its torch.compile baseline).

Run on the device machine with the public problems copied beside the checkout (they are not in the
repository): `STITCH_KERNELBENCH=.kb pytest tests/gpu/test_kernelbench_gpu.py -m gpu -q`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
KERNELBENCH = Path(os.environ.get("STITCH_KERNELBENCH", ROOT.parent / "shared" / "kernelbench"))
PROBLEM = "12_Gemm_Multiply_LeakyReLU.py"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not (KERNELBENCH / "level2" / PROBLEM).is_file(), reason=f"no level2/{PROBLEM} under {KERNELBENCH}"
    ),
]


def test_a_public_level2_problem_is_verified_end_to_end_with_both_baselines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "STITCH_HOME": str(tmp_path / "home")}
    problem = str(KERNELBENCH / "level2" / PROBLEM)
    options = ["--device", "cuda", "--rounds", "0", "--policy", "library", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "stitchcuda.cli", "optimize", problem, *options],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["succeeded"], report.get("reason")
    best = report["best"]
    timing = best["timing"]
    # The verdict carries both baselines, measured beside the candidate on this GPU.
    assert timing["eager_ms"] > 0 and timing["compile_ms"] > 0 and timing["compile_available"]
    assert best["reason"].startswith("accepted"), best["reason"]
    assert (out / "model_new.py").is_file()
