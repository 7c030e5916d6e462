"""A 16 GiB-input problem is planned on the meta device, without allocating its inputs."""

from __future__ import annotations

import pytest
from planner_support import fast_settings, source

from stitchcuda.planner.runner import ReferenceRunner
from stitchcuda.planner.service import PlannerService

GIB = 1 << 30
ROWS, COLS = 16, 1 << 28


@pytest.fixture()
def huge(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("STITCHCUDA_SIZE", "huge")
    return source("16_huge")


def test_the_analysis_process_stays_small(huge: str) -> None:
    # 8 GiB of address space at most: had the harness allocated the 16 GiB input, it could not have.
    runner = ReferenceRunner(fast_settings(subprocess_memory_mb=8192))
    outcome = runner.plan(huge, device="cpu", run=True, profile=True)
    analysis = outcome.analysis
    assert analysis is not None and analysis.ok, outcome.stderr
    assert analysis.materialized == "meta"
    assert analysis.input_bytes == 16 * GIB
    assert not analysis.fits
    assert outcome.run is None, "too large to run: no real tensors"
    assert 0 < analysis.peak_rss_bytes < 2 * GIB


def test_a_16_gib_problem_gets_a_full_plan(huge: str) -> None:
    plan = PlannerService(fast_settings()).plan(
        huge, problem_name="16_huge_l2norm", device="cpu", profile=True
    )
    assert not plan.last_resort
    assert [list(t.shape) for t in plan.inputs] == [[ROWS, COLS]]
    assert plan.input_bytes == 16 * GIB
    assert plan.total_bytes == 32 * GIB  # read the input once, write the output once
    assert plan.total_flops == 3 * ROWS * COLS + 2 * ROWS
    assert plan.eager_ms == 0.0
    assert any("meta device only" in w for w in plan.warnings)
    assert any("estimated from their roofline" in w for w in plan.warnings)
    (st,) = plan.subtasks
    assert st.time_share == 1.0 and st.floor_ms == pytest.approx(plan.floor_ms)
