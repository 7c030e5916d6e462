"""Profiling extras: torch.compile timing (or a warning saying why not) and a deadline per phase."""

from __future__ import annotations

import shutil

import pytest
from planner_support import fast_settings, source

from stitchcuda.planner.service import PlannerService


def test_a_slow_torch_compile_costs_only_its_own_measurement() -> None:
    service = PlannerService(fast_settings(profile_compile=True, compile_timeout_s=1.0))
    plan = service.plan(source("02"), problem_name="02_swish_clamp", device="cpu", profile=True)
    assert plan.compile_ms == 0.0
    assert any(w == "torch.compile did not finish within 1 s: compile_ms not measured" for w in plan.warnings)
    assert plan.eager_ms > 0 and not plan.last_resort and plan.subtasks


def test_profile_false_measures_nothing_but_still_runs_the_reference() -> None:
    plan = PlannerService(fast_settings()).plan(source("03"), problem_name="03_row_sum", profile=False)
    assert plan.eager_ms == 0.0 and plan.profiler == "" and not plan.kernels
    assert all(p.time_ms == 0.0 for p in plan.profile)
    assert plan.subtasks[0].time_share == 1.0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
def test_torch_compile_is_timed_on_cpu() -> None:
    service = PlannerService(fast_settings(profile_compile=True, compile_timeout_s=400.0))
    plan = service.plan(source("01"), problem_name="01_elementwise_chain", device="cpu", profile=True)
    assert plan.compile_ms > 0, list(plan.warnings)
    assert any(n.startswith("torch.compile: ") for n in plan.orchestration.notes)
