"""Prometheus metrics of the reward service: reward components, hack rate, judge latency and failures.

Defined with stitchcuda.shared.metrics' specs (closed label sets, checked when emitted) and served on the
same registry as every service's metrics. The hack rate is
`rate(stitch_reward_rollouts_total{outcome="hack"}[5m]) / rate(stitch_reward_rollouts_total[5m])`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitchcuda.shared.metrics import Counter, Histogram, MetricSpec

if TYPE_CHECKING:
    from stitchcuda.training.reward import RewardResult

SKILL_LABELS = frozenset({"generate", "optimize"})
COMPONENTS = frozenset({"reward", "speedup_term", "rule_reward", "rubric_score"})
OUTCOMES = frozenset({"rewarded", "rejected", "hack", "error"})
SOURCES = frozenset({"judge", "judge-free"})
# Rewards run from 0 to (cap + bonus) = 5.3 by default; the rubric score from 0 to 1.
REWARD_BUCKETS = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.3, 1.5, 2.0, 3.0, 4.0, 5.3, 10.0)
JUDGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

REWARD_COMPONENT_SPEC = MetricSpec(
    "stitch_reward_component",
    "histogram",
    "Each component of a computed rollout reward (final reward, speedup term, rule reward, rubric score).",
    ("skill", "component"),
    REWARD_BUCKETS,
    values=(("skill", SKILL_LABELS), ("component", COMPONENTS)),
)
REWARD_ROLLOUTS_SPEC = MetricSpec(
    "stitch_reward_rollouts_total",
    "counter",
    "Rollouts scored, by outcome: rewarded, rejected by the Verifier, a hack (reward 0), no reward (error).",
    ("skill", "outcome"),
    values=(("skill", SKILL_LABELS), ("outcome", OUTCOMES)),
)
REWARD_RUBRIC_SPEC = MetricSpec(
    "stitch_reward_rubric_total",
    "counter",
    "Rollouts whose rubric came from the LLM judge or from the Verifier's signals alone.",
    ("source",),
    values=(("source", SOURCES),),
)
JUDGE_SECONDS_SPEC = MetricSpec(
    "stitch_judge_seconds",
    "histogram",
    "Wall time of one rubric judgement (every attempt included).",
    ("outcome",),
    JUDGE_BUCKETS,
    values=(("outcome", frozenset({"ok", "failed"})),),
)
JUDGE_FAILURES_SPEC = MetricSpec(
    "stitch_judge_failures_total",
    "counter",
    "Judgements with no valid answer after the retries (malformed, hostile or unreachable judge).",
)

SPECS = (
    REWARD_COMPONENT_SPEC,
    REWARD_ROLLOUTS_SPEC,
    REWARD_RUBRIC_SPEC,
    JUDGE_SECONDS_SPEC,
    JUDGE_FAILURES_SPEC,
)

REWARD_COMPONENT = Histogram(REWARD_COMPONENT_SPEC)
REWARD_ROLLOUTS = Counter(REWARD_ROLLOUTS_SPEC)
REWARD_RUBRIC = Counter(REWARD_RUBRIC_SPEC)
JUDGE_SECONDS = Histogram(JUDGE_SECONDS_SPEC)
JUDGE_FAILURES = Counter(JUDGE_FAILURES_SPEC)


def outcome(result: RewardResult) -> str:
    if result.error:
        return "error"
    if result.major_hack:
        return "hack"
    return "rewarded" if result.verdict.accepted else "rejected"


def record_reward(result: RewardResult) -> None:
    """One computed reward (call once per computation, not per cache hit)."""
    skill = result.skill
    for component, value in (
        ("reward", result.reward),
        ("speedup_term", result.speedup_term),
        ("rule_reward", result.rule_reward),
        ("rubric_score", result.rubric_score),
    ):
        REWARD_COMPONENT.observe(value, skill=skill, component=component)
    REWARD_ROLLOUTS.inc(skill=skill, outcome=outcome(result))
    REWARD_RUBRIC.inc(source=result.rubric_source)


def record_error(*, skill: str) -> None:
    REWARD_ROLLOUTS.inc(skill=skill, outcome="error")


def record_judge(seconds: float, *, ok: bool) -> None:
    JUDGE_SECONDS.observe(max(0.0, seconds), outcome="ok" if ok else "failed")
    if not ok:
        JUDGE_FAILURES.inc()
