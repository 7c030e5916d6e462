"""`stitchcuda reward` as a user runs it, on the real CPU Verifier: an honest fast, an honest slow and a hacked
candidate, as a table and as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROBLEMS, REPO

pytestmark = pytest.mark.slow

CORPUS = REPO / "tests" / "corpus"


def reward(*args: str) -> subprocess.CompletedProcess[str]:
    # No judge endpoint in the environment: the judge-free rubric.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCH_JUDGE_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "stitchcuda.cli", "reward", *args, "--device", "cpu"],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=env)  # fmt: skip


def test_reward_json_of_an_honest_fast_and_a_hacked_candidate():
    fast = reward(
        str(PROBLEMS / "01_elementwise_chain.py"), str(CORPUS / "honest_elementwise_fast"), "--json"
    )
    assert fast.returncode == 0, fast.stderr[-3000:]
    data = json.loads(fast.stdout)
    assert data["verdict"]["accepted"] and data["rubric_source"] == "judge-free" and not data["major_hack"]
    assert set(data["rubric"]) == {
        "anti_hacking",
        "cuda_engineering",
        "operator_coverage",
        "skill_compliance",
    }
    assert data["speedup_term"] == pytest.approx(min(data["speedup"], 5.0) + 0.3)
    assert data["reward"] == pytest.approx(data["rule_reward"] * data["rubric_score"]) and data["reward"] > 0

    hacked = reward(str(PROBLEMS / "06_gemm_bias_relu.py"), str(CORPUS / "h02_try_fallback"), "--json")
    assert hacked.returncode == 1, hacked.stderr[-3000:]
    data = json.loads(hacked.stdout)
    assert not data["verdict"]["accepted"] and data["major_hack"] and data["reward"] == 0.0
    assert any(f.startswith("D11.") for f in data["verdict"]["findings"])


def test_reward_table_of_an_honest_slow_candidate_under_optimize():
    slow = reward(
        str(PROBLEMS / "06_gemm_bias_relu.py"), str(CORPUS / "honest_gemm_slow"), "--skill", "optimize"
    )
    assert slow.returncode == 0, slow.stderr[-3000:]
    for row in ("verdict", "speedup term", "rule reward", "anti_hacking", "skill_compliance", "rubric score",
                "rubric weight", "judge-free", "0.70"):  # fmt: skip
        assert row in slow.stdout, row


def test_reward_usage_error_exits_2(tmp_path):
    proc = reward(str(PROBLEMS / "01_elementwise_chain.py"), str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr
