"""Test-session settings shared by every tier."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "benchmarks" / "problems"

# Builds are shared by every test through one cache folder (override with STITCH_TEST_BUILD_CACHE).
os.environ.setdefault("STITCH_TEST_BUILD_CACHE", str(REPO / ".stitchcuda" / "test-build-cache"))


@pytest.fixture(scope="session")
def problems_dir() -> Path:
    return PROBLEMS


def problem_source(name: str) -> str:
    return next(PROBLEMS.glob(f"{name}*.py")).read_text()
