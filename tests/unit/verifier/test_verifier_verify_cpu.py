"""End-to-end verify() on the CPU backend: an honest C++ candidate passes, wrong and fake ones do not."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES, REF01, rejects, variant

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.errors import HarnessError
from stitchcuda.verifier.service import VerifierService

pytestmark = pytest.mark.slow


def test_honest_candidate_is_accepted_with_full_report(service: VerifierService):
    progress: list[str] = []
    verdict = service.verify(
        REF01.read_text(),
        read_dir(FIXTURES / "honest_cpu"),
        device="cpu",
        progress=lambda stage, fraction: progress.append(stage),
    )
    assert verdict.accepted, verdict.feedback
    assert verdict.compiled and verdict.correct and not rejects(verdict)
    assert verdict.reason.startswith("accepted")
    assert verdict.speedup_vs_eager > 0
    assert verdict.custom_kernel_share >= 0.5
    names = {t.name for t in verdict.correctness.trials}
    assert {"trial0", "trial1", "trial2", "refill", "perturb", "shift", "uniform", "late", "profile"} <= names
    assert any(n.startswith("timed[") for n in names)
    assert verdict.correctness.shape_probe.ok
    assert verdict.timing.iterations >= 20 and verdict.timing.median_ms > 0 and verdict.timing.eager_ms > 0
    assert verdict.profile.kernels[0].origin == "custom"
    assert verdict.profile.floor_ms > 0 and verdict.profile.bound in ("memory", "compute")
    env = verdict.environment
    assert env.torch_version and env.python_version and env.sandbox in ("bwrap", "none")
    assert len(set(env.seeds)) == len(env.seeds) >= 10 and 42 not in env.seeds
    assert "VERDICT: ACCEPTED" in verdict.feedback and "Kernels" in verdict.feedback
    assert progress[0] == "build" and progress[-1] == "done"


def test_wrong_answer_is_rejected_with_mismatch_statistics(service: VerifierService, tmp_path):
    wrong = variant(
        tmp_path,
        "import torch.nn as nn\nimport sc_test_elementwise as ext\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n"
        "        super().__init__()\n"
        "        self.scale, self.shift = float(scale), float(shift) + 0.01\n\n"
        "    def forward(self, x):\n"
        "        return ext.fused_forward(x, self.scale, self.shift)\n",
    )
    verdict = service.verify_dir(REF01, wrong)
    assert not verdict.accepted and verdict.compiled and not verdict.correct
    assert verdict.reason.startswith("D3.mismatch")
    assert "worst at" in verdict.reason and "expected" in verdict.reason
    assert "Correctness: FAILED" in verdict.feedback


def test_broken_build_is_a_verdict_not_an_exception(service: VerifierService):
    verdict = service.verify_dir(REF01, FIXTURES / "broken_build")
    assert not verdict.accepted and not verdict.compiled
    assert verdict.reason.startswith("build.failed: kernel.cpp:6: error:")
    assert "FAILED" in verdict.feedback


def test_pytorch_passthrough_with_decoy_call_is_rejected(service: VerifierService, tmp_path):
    decoy = variant(
        tmp_path,
        "import torch\nimport torch.nn as nn\nimport sc_test_elementwise as ext\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n"
        "        super().__init__()\n"
        "        self.scale, self.shift = float(scale), float(shift)\n\n"
        "    def forward(self, x):\n"
        "        ext.fused_forward(x[:1], self.scale, self.shift)\n"
        "        y = torch.nn.functional.gelu(x * self.scale + self.shift, approximate='tanh')\n"
        "        return y * x\n",
    )
    verdict = service.verify_dir(REF01, decoy, policy=verify_pb2.VerifyPolicy(allowed_rules=["D11.torch-op"]))
    assert not verdict.accepted
    assert "D6.low-custom-share" in rejects(verdict)


def test_output_cache_keyed_on_pointer_is_rejected(service: VerifierService, tmp_path):
    cache = variant(
        tmp_path,
        "import torch.nn as nn\nimport sc_test_elementwise as ext\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n"
        "        super().__init__()\n"
        "        self.scale, self.shift = float(scale), float(shift)\n"
        "        self.memo = {}\n\n"
        "    def forward(self, x):\n"
        "        key = (x.data_ptr(), tuple(x.shape))\n"
        "        if key not in self.memo:\n"
        "            self.memo[key] = ext.fused_forward(x, self.scale, self.shift)\n"
        "        return self.memo[key]\n",
    )
    verdict = service.verify_dir(REF01, cache)
    assert not verdict.accepted
    found = set(rejects(verdict))
    assert "D3.mismatch" in found  # the in-place refill returns the stale output
    assert "D6.skipped-work" in found  # the timed calls never reached the extension


def test_the_runner_running_out_of_memory_for_its_own_sets_is_a_harness_error(
    service: VerifierService, monkeypatch: pytest.MonkeyPatch
):
    """An out-of-memory while the runner places its input sets (a 6 GiB level-1 pool on a full GPU) is the
    machine's limit for the schedule: the job ends with that reason, not a candidate's D1.crash."""
    real_run = service.candidates.run

    def run_out_of_memory(*args: object, **kwargs: object) -> object:
        run = real_run(*args, **kwargs)  # type: ignore[arg-type]
        run.fault = {
            "stage": "harness-memory",
            "error": "OutOfMemoryError: CUDA out of memory",
            "traceback": [],
        }
        return run

    monkeypatch.setattr(service.candidates, "run", run_out_of_memory)
    with pytest.raises(HarnessError, match="ran out of cpu memory") as raised:
        service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert raised.value.error_code == "harness_out_of_memory"


def _disagreeing(times: list[int], rule: str = "D7.clock-disagree"):
    """evaluate.timing whose first `times[0]` results carry a clock disagreement (as a GPU call's wall clock
    does under a busy host, or always, under a hack that works outside the caller's stream)."""
    from stitchcuda.verifier import evaluate

    real = evaluate.timing

    def timing(run, ref, pol, findings):
        result = real(run, ref, pol, findings)
        if times[0] > 0:
            times[0] -= 1
            findings.add(rule, "REJECT", "device clock 5.4 ms but wall clock 11.8 ms: work outside")
        return result

    return timing


def test_a_run_whose_clocks_disagree_once_is_timed_again(service: VerifierService, monkeypatch):
    from stitchcuda.verifier import evaluate

    runs: list[int] = []
    original = service.candidates.run
    monkeypatch.setattr(service.candidates, "run", lambda *a, **k: runs.append(1) or original(*a, **k))
    monkeypatch.setattr(evaluate, "timing", _disagreeing([1]))
    verdict = service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert verdict.accepted, verdict.feedback
    assert len(runs) == 2
    retimed = [f for f in verdict.findings if f.rule == "D7.retimed"]
    assert retimed and "device clock 5.4 ms but wall clock 11.8 ms" in retimed[0].detail
    assert "D7.clock-disagree" not in rejects(verdict)

    # Clocks that disagree every time (a hack does) are rejected after the second run.
    runs.clear()
    monkeypatch.setattr(evaluate, "timing", _disagreeing([2]))
    verdict = service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert not verdict.accepted and "D7.clock-disagree" in rejects(verdict)
    assert len(runs) == 2

    # Any other rejection is not timed again.
    for rule in ("D6.skipped-work", "D5.input-mutated"):
        runs.clear()
        monkeypatch.setattr(evaluate, "timing", _disagreeing([1], rule))
        verdict = service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
        assert not verdict.accepted and rule in rejects(verdict) and len(runs) == 1
