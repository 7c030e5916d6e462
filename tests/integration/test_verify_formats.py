"""`stitchcuda verify` on the build formats of issue 16: the format it recognised, the usage error for a file it
cannot read, and `--batch DIR` (JSON lines, resumable). Corpus builds are shared through the test build cache."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROBLEMS, REPO

pytestmark = pytest.mark.slow
CORPUS = REPO / "tests" / "corpus"


def stitchcuda(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        # The corpus kits are compiled once for every test tier.
        "STITCH_BUILD_CACHE_DIR": os.environ["STITCH_TEST_BUILD_CACHE"],
    }
    return subprocess.run(
        [sys.executable, "-m", "stitchcuda.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def test_a_file_it_cannot_recognise_is_a_usage_error_naming_what_it_looked_for(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    pass\n")
    proc = stitchcuda("verify", str(PROBLEMS / "01_elementwise_chain.py"), str(plain), "--device", "cpu")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "load_inline or load" in proc.stderr and "manifest.json" in proc.stderr


def test_batch_verifies_every_case_prints_json_lines_and_resumes(tmp_path):
    root = tmp_path / "batch"
    elementwise = root / "elementwise"
    elementwise.mkdir(parents=True)
    shutil.copy(PROBLEMS / "01_elementwise_chain.py", elementwise / "reference.py")
    shutil.copytree(CORPUS / "bf_honest_inline_init", elementwise / "inline_init")
    shutil.copytree(CORPUS / "bf_flags_changed_at_run_time", elementwise / "flags_changed")
    (elementwise / "inline_init" / "expect.json").unlink()
    (elementwise / "unreadable.py").write_text("x = 1\n")
    proc = stitchcuda("verify", "--batch", str(root), "--device", "cpu", "--jobs", "2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    cases = {r["case"]: r for r in lines if "case" in r}
    summary = lines[-1]["summary"]
    assert set(cases) == {"elementwise/flags_changed", "elementwise/inline_init", "elementwise/unreadable.py"}
    honest = cases["elementwise/inline_init"]
    assert honest["accepted"] and honest["speedup_vs_eager"] > 0, honest
    assert honest["format"] == "folder: load_inline in __init__"
    hacked = cases["elementwise/flags_changed"]
    assert not hacked["accepted"] and any(r.startswith("D1.build-call") for r in hacked["rejects"]), hacked
    assert (
        "no torch.utils.cpp_extension build call and no @triton.jit kernel found"
        in cases["elementwise/unreadable.py"]["error"]
    )
    assert summary["cases"] == 3 and summary["accepted"] == 1 and summary["errors"] == 1

    again = stitchcuda("verify", "--batch", str(root), "--device", "cpu")
    resumed = [json.loads(line) for line in again.stdout.splitlines() if line.strip()]
    assert resumed[-1]["summary"]["resumed"] == 2, again.stdout[-2000:]
    assert {r["case"] for r in resumed if r.get("resumed")} == {
        "elementwise/inline_init",
        "elementwise/flags_changed",
    }


def test_single_verify_prints_the_format_it_recognised(tmp_path):
    proc = stitchcuda(
        "verify",
        str(PROBLEMS / "01_elementwise_chain.py"),
        str(CORPUS / "bf_honest_two_extensions"),
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "candidate format: folder: load_inline \u00d72 in helper second, at module level" in proc.stderr
