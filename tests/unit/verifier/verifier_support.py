"""Helpers for the Verifier tests: fast settings, fixture paths, candidate variants."""

from __future__ import annotations

import shutil
from pathlib import Path

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier.settings import VerifierSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROBLEMS = Path(__file__).resolve().parents[3] / "benchmarks" / "problems"
REF01 = PROBLEMS / "01_elementwise_chain.py"


def fast_settings(home: Path, **overrides: object) -> VerifierSettings:
    """Small, quick defaults: no torch.compile baseline, short run timeout, references reused."""
    values: dict[str, object] = {
        "home": home,
        "compile_baseline": False,
        "run_timeout_s": 90.0,
        "reference_timeout_s": 180.0,
        "reference_reuse": 100,
        "build_jobs": 2,
    }
    values.update(overrides)
    return VerifierSettings(**values)  # type: ignore[arg-type]


def variant(tmp_path: Path, model_new: str, base: str = "honest_cpu") -> Path:
    """A copy of a fixture candidate with its model_new.py replaced (the extension, and its build, stay)."""
    target = tmp_path / f"cand-{base}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(FIXTURES / base, target)
    (target / "model_new.py").write_text(model_new)
    return target


def rejects(verdict: verify_pb2.Verdict) -> list[str]:
    return [f.rule for f in verdict.findings if f.severity == verify_pb2.SEVERITY_REJECT]
