"""Memory limits derived from the host and the problem; the compact schedule for large problems."""

from __future__ import annotations

from pathlib import Path

import pytest
from verifier_support import FIXTURES, REF01, fast_settings, rejects

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.errors import HarnessError
from stitchcuda.verifier import limits
from stitchcuda.verifier.limits import GIB, HostMemory, ProblemSize
from stitchcuda.verifier.probes import build_plan
from stitchcuda.verifier.runner import usable_steps
from stitchcuda.verifier.service import VerifierService

# The elementwise chain at 2048 x 8192: 64 MiB in, 64 MiB out per call, about 3.3 GiB of input sets
# and results for the full schedule; the honest fixture candidate takes any shape.
LARGE_REF = REF01.read_text().replace("(256, 1024)", "(2048, 8192)")
LARGE_PLAN = plan_pb2.Plan(
    input_bytes=2048 * 8192 * 4,
    outputs=[plan_pb2.TensorSpec(name="out", shape=[2048, 8192], dtype="float32")],
)


def fake_host(monkeypatch: pytest.MonkeyPatch, available_gb: float, total_gb: float = 128.0) -> None:
    host = HostMemory(total=int(total_gb * GIB), available=int(available_gb * GIB))
    monkeypatch.setattr(limits, "host_memory", lambda: host)


def test_meminfo_is_read(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   120000000 kB\n")
    host = limits.host_memory(meminfo)
    assert host.available <= 120000000 * 1024 and host.total <= 131072000 * 1024
    assert host.available > 0


def test_the_limit_is_this_runs_share_of_the_free_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_host(monkeypatch, 100.0)
    derived = limits.memory_budget(fast_settings(tmp_path), "cuda")
    assert derived.limit == int(100 * GIB * 0.8) and "100.0 GiB available" in derived.how
    shared = limits.memory_budget(fast_settings(tmp_path, concurrent_runs=4), "cuda")
    assert shared.limit == derived.limit // 4 and "shared by 4 runs" in shared.how
    fixed = limits.memory_budget(fast_settings(tmp_path, memory_limit_gb=8), "cuda")
    assert fixed.limit == 8 * GIB and "STITCH_MEMORY_LIMIT_GB=8" in fixed.how
    fake_host(monkeypatch, 0.5)
    assert limits.memory_budget(fast_settings(tmp_path), "cpu").limit == limits.FLOOR_BYTES


def test_a_problem_too_large_for_the_host_is_refused_with_both_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_host(monkeypatch, 100.0)
    size = ProblemSize(inputs=8 * GIB, outputs=8 * GIB)  # a KernelBench-sized elementwise op
    # held whole (summaries and remade inputs off), 13 sets of it cannot fit 80 GiB
    whole = fast_settings(tmp_path, summary_min_numel=0, regen_input_mb=0)
    message = limits.memory_budget(whole, "cuda", size, sets=13).refuses()
    assert "GiB of host memory" in message and "80.0 GiB" in message
    # by default its sets are made again by the candidate's runner and its outputs summarised: it fits
    lean = limits.memory_budget(fast_settings(tmp_path), "cuda", size, sets=13)
    assert not lean.refuses() and lean.need < 60 * GIB
    assert limits.needs_compact(fast_settings(tmp_path), "cuda", size, 13)  # large: the compact schedule
    huge = ProblemSize(inputs=40 * GIB, outputs=8 * GIB)
    assert "GiB of host memory" in limits.memory_budget(fast_settings(tmp_path), "cuda", huge, 9).refuses()
    # the same problem with a small output (a reduction) fits in the compact schedule, not the full one
    reduction = ProblemSize(inputs=3 * GIB, outputs=4 << 20)
    settings = whole
    full, compact = len(build_plan(3, 3, 5, 20).sets), len(build_plan(3, 3, 5, 20, compact=True).sets)
    assert limits.needs_compact(settings, "cuda", reduction, full)
    assert not limits.needs_compact(settings, "cuda", reduction, compact)
    assert not limits.memory_budget(settings, "cuda", ProblemSize(), sets=13).refuses()  # size unknown


def test_problem_size_comes_from_the_plan() -> None:
    size = limits.problem_size(LARGE_PLAN)
    assert size.inputs == size.outputs == 64 << 20 and size.per_set == 256 << 20
    assert not limits.problem_size(None).known


def test_the_compact_schedule_keeps_every_check_that_needs_data() -> None:
    plan = build_plan(3, 3, 5, 20, compact=True)
    names = [s["name"] for s in plan.sets]
    assert names == ["trial0", "trial1", "refill", "perturb", "shift", "pool0", "pool1", "late", "profile"]
    assert plan.pool == ["pool0", "pool1"] and not plan.offshape
    assert {"trial0", "trial1", "refill", "perturb", "shift", "late", "profile"} <= set(plan.checked)
    assert usable_steps(plan.steps, set(names)) == plan.steps


def test_candidate_timeout_follows_the_reference() -> None:
    assert limits.run_timeout(180.0, 10.0) == 180.0
    assert limits.run_timeout(180.0, 200.0) == 430.0


@pytest.mark.slow
def test_a_problem_a_fixed_small_limit_refuses_verifies_under_the_derived_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_store: LocalArtifactStore
) -> None:
    candidate = read_dir(FIXTURES / "honest_cpu")
    small = VerifierService(
        fast_settings(tmp_path / "fixed", memory_limit_gb=3, standby=False), artifacts=build_store
    )
    try:
        with pytest.raises(HarnessError, match="GiB of host memory") as refused:
            small.verify(LARGE_REF, candidate, device="cpu", plan=LARGE_PLAN)
        assert refused.value.error_code == "machine_too_small"
    finally:
        small.close()
    # A host with 7.5 GiB free: the full schedule (about 6 GiB) does not fit its 6 GiB share, the
    # compact one does, and the candidate is verified on it.
    fake_host(monkeypatch, 7.5)
    derived = VerifierService(fast_settings(tmp_path / "derived", standby=False), artifacts=build_store)
    try:
        verdict = derived.verify(LARGE_REF, candidate, device="cpu", plan=LARGE_PLAN)
    finally:
        derived.close()
    assert verdict.accepted, verdict.feedback
    assert not rejects(verdict)
    names = {t.name for t in verdict.correctness.trials}
    assert {"trial0", "trial1", "refill", "perturb", "shift", "late"} <= names and "uniform" not in names
