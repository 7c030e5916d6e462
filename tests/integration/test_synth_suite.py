"""Every suite problem's synthesized CPU program passes the Verifier, within the optimize loop.

For each problem the Coder generates a program, the Verifier judges it, and while it is rejected the
Coder's optimize skill answers the verdict (as the platform's loop does) for up to three rounds. Builds
are cached by the Verifier, so a rerun costs only the verification.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.api.v1 import jobs_pb2, plan_pb2
from stitchcuda.coder.service import CoderService
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.coder.synth.synthesizer import Synthesizer

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PROBLEMS = Path(__file__).resolve().parents[2] / "benchmarks" / "problems"
SUITE = sorted(p.stem for p in PROBLEMS.glob("[0-9]*.py"))
MAX_ROUNDS = 3


@pytest.fixture(scope="module")
def coder() -> CoderService:
    return CoderService(CoderSettings(rag_enabled=False), synthesizer=Synthesizer())


@pytest.fixture(scope="module")
def verifier():  # type: ignore[no-untyped-def]
    service = pytest.importorskip("stitchcuda.verifier.service")
    return service.VerifierService()


@pytest.mark.parametrize("name", SUITE)
def test_synthesized_cpu_program_is_accepted(coder: CoderService, verifier, name: str) -> None:  # type: ignore[no-untyped-def]
    source = (PROBLEMS / f"{name}.py").read_text()
    plan = plan_pb2.Plan(problem_name=name, device=jobs_pb2.DEVICE_CPU, dtype="float32")
    (candidate,) = coder.generate(source, plan, job_id=f"suite-{name}")
    history = []
    for round_ in range(MAX_ROUNDS):
        assert not candidate.failure, candidate.failure
        verdict = verifier.verify(source, candidate, device="cpu")
        history.append(f"round {round_} [{candidate.variant.get('gemm')}]: {verdict.reason}")
        if verdict.accepted:
            assert verdict.correct and verdict.compiled
            return
        (candidate, *_) = coder.optimize(
            source, plan, candidate, verdict, job_id=f"suite-{name}", round_=round_ + 1
        )
    pytest.fail("not accepted within the loop:\n" + "\n".join(history))
