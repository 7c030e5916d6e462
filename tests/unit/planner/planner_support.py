"""Helpers shared by the Planner tests (imported by conftest and the test modules)."""

from __future__ import annotations

from pathlib import Path

from stitchcuda.planner.settings import PlannerSettings

PROBLEMS = Path(__file__).resolve().parents[3] / "benchmarks" / "problems"
SUITE = sorted(PROBLEMS.glob("[0-9][0-9]_*.py"))


def fast_settings(**overrides: object) -> PlannerSettings:
    base: dict[str, object] = {
        "profile_compile": False,
        "profile_warmup": 1,
        "profile_iters": 3,
        "profile_op_iters": 2,
        "nsys_enabled": False,
        "llm_enabled": False,
        "analysis_timeout_s": 240.0,
        "profile_timeout_s": 240.0,
    }
    base.update(overrides)
    return PlannerSettings(**base)  # type: ignore[arg-type]


def source(stem_prefix: str) -> str:
    return next(PROBLEMS.glob(f"{stem_prefix}*.py")).read_text()
