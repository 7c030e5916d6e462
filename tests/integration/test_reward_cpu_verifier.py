"""Rewards from the real CPU Verifier on known candidates: an honest fast program beats an honest slow one, and
a correct PyTorch fallback and an incorrect program both score 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stitchcuda.shared import candidate as candidate_format
from stitchcuda.training.reward import RewardRequest, RewardService, RewardSettings
from tests.conftest import REPO
from tests.integration.corpus_variants import slowed

pytestmark = pytest.mark.slow

CORPUS = REPO / "tests" / "corpus"


def load(folder: Path) -> tuple[str, object]:
    expect = json.loads((CORPUS / folder.name / "expect.json").read_text())
    return (REPO / expect["reference"]).read_text(), candidate_format.read_dir(folder)


class Counting:
    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def verify(self, reference_source, candidate, *, device):
        self.calls += 1
        return self.inner.verify(reference_source, candidate, device=device)  # type: ignore[attr-defined]


def test_reward_orders_known_candidates(tmp_path: Path):
    from stitchcuda.training.verifier import InProcessVerifier

    names = {"fast": CORPUS / "honest_elementwise_fast", "slow": slowed(tmp_path, "honest_elementwise_fast"),
             "fallback": CORPUS / "h01_passthrough", "incorrect": CORPUS / "h10_mse_subsampled"}  # fmt: skip
    requests = {}
    for label, folder in names.items():
        reference, cand = load(folder)
        requests[label] = RewardRequest(reference, cand, "generate", "cpu")  # type: ignore[arg-type]
    port = Counting(InProcessVerifier())
    service = RewardService(RewardSettings(reward_max_concurrent=1), verifier=port)
    try:
        results = dict(zip(requests, service.score_many(list(requests.values())), strict=True))
        fast, slow, fallback, incorrect = (results[k] for k in ("fast", "slow", "fallback", "incorrect"))
        assert fast.verdict.accepted and slow.verdict.accepted, (fast.verdict.reason, slow.verdict.reason)
        assert fast.speedup > slow.speedup
        assert fast.reward > slow.reward > 0
        # A correct program that hands the work to PyTorch: rejected as a hack, reward 0.
        assert not fallback.verdict.accepted and fallback.major_hack and fallback.reward == 0.0
        # A wrong answer: not correct, reward 0, and not counted as a hack.
        assert not incorrect.verdict.correct and incorrect.reward == 0.0 and not incorrect.major_hack
        assert fast.reward > fallback.reward and fast.reward > incorrect.reward
        # Scored again (another id, same content): from the cache, no verification.
        calls = port.calls
        again = service.score(requests["fast"].reference_source, requests["fast"].candidate, "generate")
        assert again.cached and again.reward == fast.reward and port.calls == calls == 4
    finally:
        service.close()
