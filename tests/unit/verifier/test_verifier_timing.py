"""Interleaved timing through verify() on the CPU: the verdict carries the speedup's interval and
source, and a candidate that slows the eager reference beside it is rejected."""

from __future__ import annotations

import pytest
from verifier_support import FIXTURES, REF01, rejects, variant

from stitchcuda.shared.candidate import read_dir
from stitchcuda.verifier.service import VerifierService

pytestmark = pytest.mark.slow


def test_cpu_verdict_carries_interleaved_rounds_and_an_interval(service: VerifierService):
    verdict = service.verify(REF01.read_text(), read_dir(FIXTURES / "honest_cpu"), device="cpu")
    assert verdict.accepted, verdict.feedback
    t = verdict.timing
    settings = service.settings
    assert t.eager_source == "interleaved"
    assert settings.timing_rounds <= t.rounds <= settings.timing_max_rounds
    assert t.confidence == pytest.approx(0.9) and t.noise_threshold == settings.timing_noise_cpu
    assert 0 < t.speedup_vs_eager_low <= t.speedup_vs_eager <= t.speedup_vs_eager_high
    assert 0 < t.median_low_ms <= t.median_ms * 1.5 and t.median_high_ms >= t.median_low_ms
    assert verdict.speedup_vs_eager == t.speedup_vs_eager
    # The reason shows the interval, and a noisy result says so.
    assert f"({t.speedup_vs_eager_low:.2f}-{t.speedup_vs_eager_high:.2f}x)" in verdict.reason
    assert t.noisy == any(f.rule == "D7.noisy" for f in verdict.findings)


SLOW_BASELINE = """
import time
import sc_test_elementwise as ext
import torch
import torch.nn as nn


def _slow(module, args):
    if type(module).__name__ == "Model":
        time.sleep(0.002)


torch.nn.modules.module.register_module_forward_pre_hook(_slow)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = float(scale), float(shift)

    def forward(self, x):
        return ext.fused_forward(x, self.scale, self.shift)
"""


def test_a_candidate_that_slows_the_reference_beside_it_is_rejected(service: VerifierService, tmp_path):
    verdict = service.verify(REF01.read_text(), read_dir(variant(tmp_path, SLOW_BASELINE)), device="cpu")
    assert not verdict.accepted
    assert "D8.baseline-tampered" in rejects(verdict), verdict.reason
