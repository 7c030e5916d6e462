"""The next job of a problem starts from the best variant an earlier one verified (issue 13, item 4): the
embedded platform, with the real planner, built-in Coder and Verifier on the CPU, two jobs of one problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from verifier_support import REF01, fast_settings

from stitchcuda.api.v1 import code_pb2, jobs_pb2
from stitchcuda.embedded import EmbeddedPlatform
from stitchcuda.shared import tuned
from stitchcuda.shared.artifacts import Keys, LocalArtifactStore
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.verifier.service import VerifierService

pytestmark = pytest.mark.slow


def test_a_second_job_starts_from_the_first_jobs_best_variant(
    tmp_path: Path, build_store: LocalArtifactStore
) -> None:
    verifier = VerifierService(fast_settings(tmp_path / "home"), artifacts=build_store)
    platform = EmbeddedPlatform(CommonSettings(), artifact_root=tmp_path / "artifacts", verifier=verifier)
    spec = jobs_pb2.JobSpec(
        problem_name="elementwise",
        reference_source=REF01.read_text(),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=1, stagnation_rounds=2, samples=1),
    )
    first = platform.run(spec)
    assert first.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, first.status.message
    record = tuned.lookup(platform.artifacts, "local", jobs_pb2.DEVICE_CPU, spec.reference_source, "")
    assert record is not None and record.job_id == first.job_id
    best = code_pb2.Candidate.FromString(
        platform.artifacts.get(Keys.result("local", first.job_id, "candidate.pb"))
    )
    assert record.variant == {k: v for k, v in best.variant.items() if k not in ("tried", "features")}
    second = platform.run(spec)
    assert second.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, second.status.message
    opening = code_pb2.Candidate.FromString(
        platform.artifacts.get(Keys.candidate("local", second.job_id, 0, 0))
    )
    assert {k: opening.variant[k] for k in record.variant} == record.variant
    assert f"tuned variant of job {first.job_id}" in opening.rationale
    verifier.close()
