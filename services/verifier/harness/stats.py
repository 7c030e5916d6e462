"""Statistics of interleaved timing rounds (stdlib only; the candidate runner and the parent share it).

A round times the candidate and the eager reference back to back, in alternating order, in the same
process and device state. Each round gives one ratio (eager median / candidate median); machine drift
that lasts longer than a round slows both sides of it and cancels in the ratio. The speedup is the
median of the per-round ratios, with a distribution-free confidence interval for that median from the
order statistics (no assumption about the noise's shape).
"""

from __future__ import annotations

import math

# The confidence of the intervals reported with a median.
CONFIDENCE = 0.9


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A `confidence` interval for the median: (x_(k), x_(n-k+1)) with the largest k whose coverage
    1 - 2 P(X < k) still reaches `confidence`; the whole range when there are too few values for that."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0, 0.0
    k = 0  # 0-based index of the lower order statistic
    # The interval (x_(k), x_(n-1-k)) misses the median with probability 2 P(X <= k).
    while k + 1 < n - 2 - k and 1.0 - 2.0 * _binom_cdf(k + 1, n) >= confidence:
        k += 1
    return ordered[k], ordered[n - 1 - k]


def ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Element-wise a/b of two equally long lists, skipping pairs with a non-positive denominator."""
    return [a / b for a, b in zip(numerators, denominators, strict=True) if b > 0 and a > 0]


def half_width(values: list[float], confidence: float = CONFIDENCE) -> float:
    """Half the interval's width relative to the median: 0.05 means the median is known to +-5 %."""
    mid = median(values)
    if mid <= 0:
        return math.inf
    low, high = median_interval(values, confidence)
    return (high - low) / (2.0 * mid)


def round_ratios(candidate: list[list[float]], eager: list[list[float]]) -> list[float]:
    """One ratio per round: the eager block's median over the candidate block's median."""
    return ratios([median(e) for e in eager], [median(c) for c in candidate])


def settled(
    candidate: list[list[float]],
    eager: list[list[float]],
    min_rounds: int,
    noise: float,
) -> bool:
    """Whether the rounds so far pin the speedup (or, with no eager rounds, the candidate's time) down to
    +-`noise`; never before `min_rounds` rounds."""
    if len(candidate) < min_rounds:
        return False
    values = round_ratios(candidate, eager) if eager else [median(c) for c in candidate]
    return half_width(values) <= noise
