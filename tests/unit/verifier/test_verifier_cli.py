"""`stitchcuda verify` (stitchcuda.verifier.cli): JSON verdict and exit codes."""

from __future__ import annotations

import json

import pytest
from verifier_support import FIXTURES, REF01

from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.verifier.cli import main


def test_missing_reference_is_a_usage_error(tmp_path, capsys):
    code = main([str(tmp_path / "missing.py"), str(FIXTURES / "honest_cpu"), "--device", "cpu", "--json"])
    assert code == 2
    out = json.loads(capsys.readouterr().out)
    assert out["accepted"] is False and "missing.py" in out["error"]


@pytest.mark.slow
def test_json_verdict_and_exit_codes(build_store: LocalArtifactStore, tmp_path, monkeypatch, capsys):
    # The CLI's fresh service shares the test build cache through the artifact folder: no compile.
    monkeypatch.setenv("STITCH_HOME", str(tmp_path))
    monkeypatch.setenv("STITCH_ARTIFACT_DIR", str(build_store.root))
    code = main(
        [str(REF01), str(FIXTURES / "honest_cpu"), "--device", "cpu", "--json", "--no-compile-baseline"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out["reason"]
    assert out["accepted"] is True and out["compiled"] is True and out["correct"] is True
    assert out["device"] == "cpu" and out["speedup_vs_eager"] > 0 and out["custom_kernel_share"] >= 0.5
    assert all({"rule", "severity", "detail"} <= set(f) for f in out["findings"])
    assert "speedup_vs_compile" in out
    code = main(
        [str(REF01), str(FIXTURES / "broken_build"), "--device", "cpu", "--json", "--no-compile-baseline"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["compiled"] is False and out["reason"].startswith("build.failed")
