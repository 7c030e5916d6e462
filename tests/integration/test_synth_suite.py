"""Every suite problem's synthesized CPU program passes the Verifier, within the optimize loop.

For each problem the Coder generates a program, the Verifier judges it, and while it is rejected the
Coder's optimize skill answers the verdict (as the platform's loop does) for up to three rounds. Builds
are cached by the Verifier, so a rerun costs only the verification.

CI runs one problem of each kind of program the synthesizer writes (about 40 s each on CI's two cores):
a pointwise chain, a row reduction, a GEMM with the synthesizer's own kernel (the strict kernel policy)
and through the library (the `library` policy), and attention (batched GEMMs around a softmax). The rest
carry the marker `manual` that CI deselects; run them by hand with
`python -m pytest -m manual tests/integration/test_synth_suite.py` (the last run's command, log and
times are in benchmarks/results/synth_suite_cpu.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.api.v1 import jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.service import CoderService
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PROBLEMS = Path(__file__).resolve().parents[2] / "benchmarks" / "problems"
SUITE = sorted(p.stem for p in PROBLEMS.glob("[0-9]*.py"))
MAX_ROUNDS = 3
# (problem, kernel policy): one of each kind of program runs in CI, the rest by hand.
IN_CI = {
    ("01_elementwise_chain", STRICT),
    ("03_row_sum", STRICT),
    ("06_gemm_bias_relu", STRICT),
    ("06_gemm_bias_relu", LIBRARY),
    ("12_attention", STRICT),
}
CASES = [(name, STRICT) for name in SUITE] + [
    (name, LIBRARY) for name in ("06_gemm_bias_relu", "07_conv_relu")
]


def case(name: str, policy: str) -> object:
    marks = () if (name, policy) in IN_CI else (pytest.mark.manual,)
    return pytest.param(name, policy, marks=marks, id=name if policy == STRICT else f"{name}-{policy}")


@pytest.fixture(scope="module")
def coder() -> CoderService:
    return CoderService(CoderSettings(rag_enabled=False), synthesizer=Synthesizer())


@pytest.fixture(scope="module")
def verifier():  # type: ignore[no-untyped-def]
    service = pytest.importorskip("stitchcuda.verifier.service")
    return service.VerifierService()


@pytest.mark.parametrize(("name", "policy"), [case(*c) for c in CASES])
def test_synthesized_cpu_program_is_accepted(coder: CoderService, verifier, name: str, policy: str) -> None:  # type: ignore[no-untyped-def]
    source = (PROBLEMS / f"{name}.py").read_text()
    plan = plan_pb2.Plan(problem_name=name, device=jobs_pb2.DEVICE_CPU, dtype="float32")
    kernels, verify_policy = KernelPolicy(policy), verify_pb2.VerifyPolicy(kernel_policy=policy)
    (candidate,) = coder.generate(source, plan, job_id=f"suite-{name}", policy=kernels)
    # GEMMs and convolutions: the synthesizer's own kernels under strict, the library's under `library`.
    assert candidate.variant["gemm"] == ("library" if kernels.accepts_library else "custom")
    history = []
    for round_ in range(MAX_ROUNDS):
        assert not candidate.failure, candidate.failure
        verdict = verifier.verify(source, candidate, device="cpu", policy=verify_policy)
        history.append(f"round {round_} [{candidate.variant.get('gemm')}]: {verdict.reason}")
        if verdict.accepted:
            assert verdict.correct and verdict.compiled and verdict.kernel_policy == policy
            return
        (candidate, *_) = coder.optimize(
            source, plan, candidate, verdict, job_id=f"suite-{name}", round_=round_ + 1, policy=kernels
        )
    pytest.fail("not accepted within the loop:\n" + "\n".join(history))
