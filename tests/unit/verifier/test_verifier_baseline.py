"""Every verdict has the torch.compile figure or a finding that says why it has none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier import evaluate
from stitchcuda.verifier.evaluate import FindingList


def findings_for(timing: dict[str, Any], *, requested: bool) -> list[verify_pb2.Finding]:
    ref = SimpleNamespace(
        timing=timing,
        compile_ms=float(timing.get("compile", {}).get("device", {}).get("median", 0.0)),
        compile_available="compile" in timing,
        device="cuda",
    )
    policy = SimpleNamespace(compile_baseline=requested)
    found = FindingList([])
    evaluate._compile_baseline_finding(ref, policy, found)  # type: ignore[arg-type]
    return found.items


def test_a_timed_baseline_needs_no_finding() -> None:
    assert findings_for({"compile": {"device": {"median": 0.5}}}, requested=True) == []


def test_a_failed_compile_says_why() -> None:
    (finding,) = findings_for({"compile_error": "BackendCompilerFailed: triton not found"}, requested=True)
    assert finding.rule == "D7.compile-baseline" and finding.severity == verify_pb2.SEVERITY_WARNING
    assert "triton not found" in finding.detail


def test_a_baseline_that_never_came_back_or_was_turned_off_is_said_so() -> None:
    (missing,) = findings_for({}, requested=True)
    assert "gave no torch.compile timing" in missing.detail
    (off,) = findings_for({}, requested=False)
    assert off.severity == verify_pb2.SEVERITY_INFO and "turned the baseline off" in off.detail
