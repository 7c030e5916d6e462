"""An identical program verified again in the same job reuses its verdict (issue 18): the real Verifier
worker and service behind the real Workflow, a coder that hands in the same program every round."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES, REF01

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.shared import transport
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.workflow import Workflow
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.worker import VerifierWorker

pytestmark = pytest.mark.slow


class CountingVerifier:
    """The session's VerifierService, counting real verifications."""

    def __init__(self, service: VerifierService) -> None:
        self.service = service
        self.verifications = 0

    def verify(self, *args: object, **kwargs: object) -> verify_pb2.Verdict:
        self.verifications += 1
        return self.service.verify(*args, **kwargs)  # type: ignore[arg-type]


def run_job(service: VerifierService, programs: list[code_pb2.Candidate], rounds: int):
    jobs, artifacts, inproc = MemoryJobStore(), MemoryArtifactStore(), transport.InProcessTransport()
    workflow = Workflow(jobs, artifacts, inproc)
    counting = CountingVerifier(service)
    worker = VerifierWorker(counting, workflow, artifacts, inproc)  # type: ignore[arg-type]
    queue = list(programs)

    def plan(data: bytes) -> None:
        workflow.record_plan(decode(data), plan_pb2.Plan(problem_name="elementwise"))

    def code(data: bytes) -> None:
        program = code_pb2.Candidate()
        program.CopyFrom(queue.pop(0))
        workflow.record_candidates(decode(data), [program])

    inproc.register(transport.PLANNER, plan)
    inproc.register(transport.CODER, code)
    inproc.register(transport.VERIFIER_CPU, worker.handle)
    spec = jobs_pb2.JobSpec(
        problem_name="elementwise",
        reference_source=REF01.read_text(),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=rounds, stagnation_rounds=5, min_improvement=0.0),
    )
    job = workflow.submit(spec, "acme")
    inproc.drain()
    return jobs.get(job.job_id), artifacts, counting.verifications


def verdicts(job: jobs_pb2.Job, artifacts: MemoryArtifactStore) -> list[verify_pb2.Verdict]:
    from stitchcuda.shared.artifacts import Keys

    return [
        verify_pb2.Verdict.FromString(artifacts.get(Keys.verdict(job.tenant_id, job.job_id, r, 0)))
        for r in range(len(job.rounds))
    ]


def test_an_identical_candidate_in_one_job_reuses_the_verdict(service: VerifierService):
    program = read_dir(FIXTURES / "honest_cpu")
    job, artifacts, verifications = run_job(service, [program, program, program], rounds=2)
    assert len(job.rounds) == 3
    assert verifications == 1
    first, *later = verdicts(job, artifacts)
    assert first.accepted and not any(f.rule == "verdict.reused" for f in first.findings)
    for round_, verdict in enumerate(later, start=1):
        assert verdict.candidate_id == f"r{round_}c0"
        assert any(f.rule == "verdict.reused" and "r0c0" in f.detail for f in verdict.findings)
        assert verdict.speedup_vs_eager == first.speedup_vs_eager
        assert verdict.timing.speedup_vs_eager_low == first.timing.speedup_vs_eager_low


def test_a_changed_candidate_is_verified_again(service: VerifierService):
    program = read_dir(FIXTURES / "honest_cpu")
    changed = code_pb2.Candidate()
    changed.CopyFrom(program)
    for f in changed.files:
        if f.path == "model_new.py":
            f.content += "\n# a comment changes the content hash\n"
    job, _, verifications = run_job(service, [program, changed, program], rounds=2)
    assert len(job.rounds) == 3
    assert verifications == 2
