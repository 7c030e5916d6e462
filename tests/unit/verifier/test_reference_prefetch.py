"""A job's reference is computed while its first program is written and built (issue 12, time to verdict):
the embedded platform, with the real planner, built-in Coder and Verifier on the CPU."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from verifier_support import REF01, fast_settings

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.embedded import EmbeddedPlatform
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.verifier.service import VerifierService

pytestmark = pytest.mark.slow


def test_the_first_verification_finds_the_reference_ready(
    tmp_path: Path, build_store: LocalArtifactStore
) -> None:
    verifier = VerifierService(fast_settings(tmp_path / "home", reference_reuse=4), artifacts=build_store)
    threads: list[str] = []
    original = verifier.references.run

    def run(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    verifier.references.run = run  # type: ignore[method-assign]
    platform = EmbeddedPlatform(
        CommonSettings(reference_prefetch="all"), artifact_root=tmp_path / "artifacts", verifier=verifier
    )
    spec = jobs_pb2.JobSpec(
        problem_name="elementwise",
        reference_source=REF01.read_text(),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=1, stagnation_rounds=2, samples=1),
    )
    job = platform.run(spec)
    assert job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, job.status.message
    # One reference run, on its own thread while the Coder wrote the program; both rounds reused it.
    assert len(threads) == 1 and threads[0].startswith("reference-"), threads
    assert len(job.rounds) == 2 and all(r.accepted for r in job.rounds)
    verifier.close()
