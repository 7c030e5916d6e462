"""Interleaved timing statistics: per-round ratios, the median's interval, when rounds stop, the sources."""

from __future__ import annotations

import random

import pytest

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier import speedup
from stitchcuda.verifier.harness import stats


def test_median_interval_uses_order_statistics_with_the_asked_coverage():
    values = [float(v) for v in range(1, 13)]
    random.Random(3).shuffle(values)
    # n = 12 at 90 %: (x_3, x_10) covers 96 %, (x_4, x_9) only 85 %.
    assert stats.median_interval(values, 0.9) == (3.0, 10.0)
    assert stats.median_interval([float(v) for v in range(1, 9)], 0.9) == (2.0, 7.0)
    # Too few values for the confidence: the whole range, never an interval narrower than the data allow.
    assert stats.median_interval([5.0, 1.0, 3.0], 0.9) == (1.0, 5.0)
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_interleaved_rounds_cancel_a_machine_that_slows_down_ninefold():
    """The issue's 0.65 ms then 5.88 ms: the machine's load changes between and within rounds. Timed
    beside the candidate, the eager reference slows the same way and each round's ratio stays 2x."""
    load = [1.0, 1.2, 9.0, 3.5, 1.1, 6.0, 2.0, 1.4]
    cand = [[0.65 * f, 0.66 * f, 0.64 * f] for f in load]
    eager = [[1.30 * f, 1.32 * f, 1.28 * f] for f in load]
    t = verify_pb2.TimingResult(median_ms=stats.median([x for b in cand for x in b]))
    speedup.fill(t, {"rounds": cand, "eager_rounds": eager}, eager_ms=1.3, compile_ms=0.65, noise=0.05)
    assert t.eager_source == "interleaved" and t.rounds == len(load)
    assert t.speedup_vs_eager == pytest.approx(2.0)
    assert t.speedup_vs_eager_low == pytest.approx(2.0) and t.speedup_vs_eager_high == pytest.approx(2.0)
    assert not t.noisy
    # torch.compile was 2x faster than eager in the reference run: the same ratio applies now.
    assert t.compile_source == "scaled" and t.speedup_vs_compile == pytest.approx(1.0)

    # The same candidate rounds against the cached eager figure: the swing shows up as a wide interval.
    cached = verify_pb2.TimingResult(median_ms=t.median_ms)
    speedup.fill(cached, {"rounds": cand}, eager_ms=1.3, compile_ms=0.65, noise=0.05)
    assert cached.eager_source == "cached" and cached.compile_source == "cached"
    assert cached.noisy
    assert cached.speedup_vs_eager_high / cached.speedup_vs_eager_low > 3
    assert cached.speedup_vs_eager_low <= cached.speedup_vs_eager <= cached.speedup_vs_eager_high


def test_noisy_ratios_are_flagged_with_their_interval():
    rng = random.Random(7)
    cand = [[1.0] for _ in range(10)]
    eager = [[1.5 * rng.uniform(0.6, 1.4)] for _ in range(10)]
    t = verify_pb2.TimingResult(median_ms=1.0)
    speedup.fill(t, {"rounds": cand, "eager_rounds": eager}, eager_ms=1.5, compile_ms=0.0, noise=0.05)
    assert t.noisy
    assert t.speedup_vs_eager_low < t.speedup_vs_eager < t.speedup_vs_eager_high
    assert t.compile_source == "" and t.speedup_vs_compile == 0.0
    assert speedup.interval_text(1.234, 1.1, 1.3) == "1.23x (1.10-1.30x)"
    assert speedup.interval_text(1.234, 0.0, 0.0) == "1.23x"


def test_rounds_stop_once_settled_and_never_before_the_minimum():
    steady_c = [[1.0, 1.01]] * 6
    steady_e = [[2.0, 2.02]] * 6
    assert not stats.settled(steady_c[:5], steady_e[:5], min_rounds=6, noise=0.05)
    assert stats.settled(steady_c, steady_e, min_rounds=6, noise=0.05)
    swinging_e = [[2.0], [3.0], [1.5], [2.6], [1.2], [2.9]]
    assert not stats.settled(steady_c, swinging_e, min_rounds=6, noise=0.05)
    # Without eager rounds the candidate's own per-round medians decide.
    assert stats.settled(steady_c, [], min_rounds=6, noise=0.05)


def test_malformed_rounds_from_the_runner_are_dropped():
    assert speedup.rounds_of([[1.0, "x", True, 2], "junk", [], [3]]) == [[1.0, 2.0], [3.0]]
    assert speedup.rounds_of({"a": 1}) == []
    t = verify_pb2.TimingResult(median_ms=2.0)
    # Eager rounds that do not pair with the candidate's are not used: the cached figure is.
    speedup.fill(
        t, {"rounds": [[2.0], [2.0]], "eager_rounds": [[4.0]]}, eager_ms=3.0, compile_ms=0.0, noise=0.1
    )
    assert t.eager_source == "cached" and t.speedup_vs_eager == pytest.approx(1.5)
