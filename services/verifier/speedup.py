"""The verdict's speedups and their intervals from the candidate run's timing rounds (D7), in the parent.

The candidate runner times the candidate and the eager reference in alternating blocks ("rounds") in
one process and device state; each round gives one ratio, and the speedup is the median of the
per-round ratios with a confidence interval for that median (harness.stats). Where the eager reference
could not be timed beside the candidate, the reference run's cached figure is the baseline and the
interval reflects the candidate's own rounds only. torch.compile is never timed in the candidate's
process (compiling takes seconds to minutes): its figure is the reference run's, scaled by how much
slower or faster the eager reference ran beside the candidate than in the reference run, so both
speedups describe the same machine state. The verdict names each baseline's source.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier.harness import stats

INTERLEAVED = "interleaved"
CACHED = "cached"
SCALED = "scaled"


def rounds_of(raw: Any) -> list[list[float]]:
    """The run's per-round device times, dropping anything that is not a list of numbers."""
    if not isinstance(raw, list):
        return []
    out: list[list[float]] = []
    for block in raw:
        if isinstance(block, list):
            values = [float(x) for x in block if isinstance(x, int | float) and not isinstance(x, bool)]
            if values:
                out.append(values)
    return out


def fill(
    t: verify_pb2.TimingResult,
    run_timing: dict[str, Any],
    eager_ms: float,
    compile_ms: float,
    noise: float,
) -> None:
    """Sets the speedups, their intervals, the rounds and the baselines' sources on `t` (whose
    median_ms is already set). `eager_ms` and `compile_ms` are the reference run's figures (0: none)."""
    cand = rounds_of(run_timing.get("rounds"))
    eager = rounds_of(run_timing.get("eager_rounds"))
    t.confidence = stats.CONFIDENCE
    t.noise_threshold = noise
    t.rounds = len(cand)
    medians = [stats.median(block) for block in cand]
    if medians:
        t.median_low_ms, t.median_high_ms = stats.median_interval(medians)
    interleaved = bool(eager) and len(eager) == len(cand)
    if interleaved:
        t.eager_source = INTERLEAVED
        t.eager_ms = stats.median([x for block in eager for x in block])
        ratios = stats.round_ratios(cand, eager)
    else:
        t.eager_source = CACHED
        t.eager_ms = eager_ms
        per_round = medians or ([t.median_ms] if t.median_ms > 0 else [])
        ratios = [eager_ms / m for m in per_round if m > 0] if eager_ms > 0 else []
    if ratios:
        t.speedup_vs_eager = stats.median(ratios)
        t.speedup_vs_eager_low, t.speedup_vs_eager_high = stats.median_interval(ratios)
        t.noisy = len(ratios) > 1 and stats.half_width(ratios) > noise
    if compile_ms <= 0 or t.speedup_vs_eager <= 0:
        return
    if interleaved and eager_ms > 0:
        # The reference run's compile/eager ratio, applied to the eager reference timed just now.
        scale = compile_ms / eager_ms
        t.compile_source = SCALED
        t.compile_ms = scale * t.eager_ms
    else:
        scale = compile_ms / eager_ms if eager_ms > 0 else 0.0
        t.compile_source = CACHED
        t.compile_ms = compile_ms
    if scale <= 0:
        return
    t.speedup_vs_compile = scale * t.speedup_vs_eager
    t.speedup_vs_compile_low = scale * t.speedup_vs_eager_low
    t.speedup_vs_compile_high = scale * t.speedup_vs_eager_high


def interval_text(value: float, low: float, high: float) -> str:
    """'1.23x (1.18-1.30x)', or '1.23x' when there is no interval."""
    if value <= 0:
        return "n/a"
    if high > low > 0:
        return f"{value:.2f}x ({low:.2f}-{high:.2f}x)"
    return f"{value:.2f}x"
