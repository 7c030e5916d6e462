"""Planner test fixtures: fast settings and the suite's plans, made once per session (each plan is a subprocess)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from planner_support import SUITE, fast_settings

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.service import PlannerService


@pytest.fixture(scope="session")
def planner() -> PlannerService:
    return PlannerService(fast_settings())


@pytest.fixture(scope="session")
def suite_plans(planner: PlannerService) -> dict[str, plan_pb2.Plan]:
    """Every suite problem planned with a profile on the CPU (two at a time: each is a subprocess)."""

    def one(path: Path) -> tuple[str, plan_pb2.Plan]:
        return path.stem, planner.plan(path.read_text(), problem_name=path.stem, device="cpu", profile=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, SUITE))
