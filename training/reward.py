"""The reward of one Coder rollout: the Verifier's rule reward shaped by the rubric, computed once each.

Formula (issue 17; DESIGN.md section 7 — a rule reward for correctness and speed, shaped by a rubric reward
that stops reward hacking and degenerate solutions; every constant is a RewardSettings field):

    s  = the verdict's speedup over eager PyTorch      (reward_baseline=compile: over torch.compile)
    t  = min(s, C) + b                                 speedup term; C = reward_speedup_cap = 5,
                                                       b = reward_speedup_bonus = 0.3
    r  = t if the Verifier accepted the candidate and no major hack was found, else 0      rule reward
    q  = sum_d w_d * score_d / (5 * sum_d w_d)         normalised rubric in [0, 1]; d over anti_hacking,
                                                       cuda_engineering, operator_coverage,
                                                       skill_compliance; w_d = reward_weight_<d> = 1
    a  = reward_rubric_weight_<skill>                  1.0 for generate, 0.7 for optimize
    R  = r * ((1 - a) + a * q)                         the reward

A major hack is a hack-class rejection by the Verifier, text in the candidate addressed to the judge, the
judge's major_hack flag, or an anti-hacking score at or below reward_major_hack_at_most (1). The rubric comes
from the LLM judge when one is configured (its anti-hacking and coverage scores bounded by the Verifier's
signals, stitchcuda.training.rubric.bounded_by_signals), else from those signals alone; a judge that gives no
valid answer after its retries falls back to the judge-free rubric (judge_failure_policy=judge_free, the
failure reported in the result) or zeroes the reward (=zero). A rejected candidate is not sent to the judge.

Each rollout is computed once: results are keyed by a hash of the reference, the candidate's content (files
and build manifest, not its id), the skill, the device and the feedback, kept in memory and, with
reward_cache_url, in Redis; a key already in flight is waited for, not computed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from stitchcuda.api.v1 import code_pb2, verify_pb2
from stitchcuda.shared.errors import StitchError
from stitchcuda.training import metrics as reward_metrics
from stitchcuda.training.judge import Judge, JudgeOutcome, JudgeRequest
from stitchcuda.training.rubric import DIMENSIONS, SKILLS, RubricScores, Signals, judge_free, signals
from stitchcuda.training.settings import RewardSettings
from stitchcuda.training.verifier import InProcessVerifier, VerifierPort

__all__ = [
    "RewardRequest",
    "RewardResult",
    "RewardService",
    "RewardSettings",
    "VerdictSummary",
    "compute_reward",
    "reward_key",
]

log = logging.getLogger("stitchcuda.training.reward")


@dataclass(frozen=True)
class RewardRequest:
    """One rollout to score."""

    reference_source: str
    candidate: code_pb2.Candidate
    skill: str = "generate"
    device: str = "cpu"
    feedback: str = ""


@dataclass(frozen=True)
class VerdictSummary:
    """The verdict's headline, as the reward saw it."""

    accepted: bool
    compiled: bool
    correct: bool
    reason: str
    speedup_vs_eager: float
    speedup_vs_compile: float
    custom_share: float
    findings: tuple[str, ...] = ()
    seconds: float = 0.0

    @classmethod
    def of(cls, verdict: verify_pb2.Verdict) -> VerdictSummary:
        names = {verify_pb2.SEVERITY_WARNING: "warning", verify_pb2.SEVERITY_REJECT: "reject"}
        return cls(
            accepted=verdict.accepted,
            compiled=verdict.compiled,
            correct=verdict.correct,
            reason=verdict.reason,
            speedup_vs_eager=verdict.speedup_vs_eager,
            speedup_vs_compile=verdict.speedup_vs_compile,
            custom_share=verdict.custom_kernel_share,
            findings=tuple(
                f"{f.rule} ({names[f.severity]})" for f in verdict.findings if f.severity in names
            ),
            seconds=verdict.seconds,
        )


@dataclass(frozen=True)
class RewardResult:
    """Every component of one rollout's reward (see the module docstring for how they combine)."""

    key: str
    skill: str
    device: str
    verdict: VerdictSummary
    speedup: float
    speedup_term: float
    rule_reward: float
    rubric: dict[str, int]
    rubric_score: float
    rubric_weight: float
    rubric_source: str
    major_hack: bool
    hack_reason: str
    reward: float
    judge_failure: str = ""
    rationale: str = ""
    judge_seconds: float = 0.0
    verify_seconds: float = 0.0
    cached: bool = False
    # Set when no reward could be computed (a broken reference, an unreachable verifier): reward is 0 and
    # the result is not cached, so a later call tries again.
    error: str = ""

    @property
    def judged(self) -> bool:
        return self.rubric_source == "judge"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"]["findings"] = list(self.verdict.findings)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewardResult:
        fields = dict(data)
        verdict = dict(fields.pop("verdict"))
        verdict["findings"] = tuple(verdict.get("findings", ()))
        return cls(verdict=VerdictSummary(**verdict), **fields)


def reward_key(
    reference_source: str, candidate: code_pb2.Candidate, skill: str, device: str, feedback: str = ""
) -> str:
    """sha256 over what decides a reward: the reference, the candidate's files and build, skill, device,
    feedback. Ids, rounds and the coder's name are left out: the same program scores the same."""
    h = hashlib.sha256()

    def part(text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(reference_source)
    for f in sorted(candidate.files, key=lambda f: f.path):
        part(f.path)
        part(f.content)
    part(candidate.build.SerializeToString(deterministic=True))
    part(candidate.failure)
    part(skill)
    part(device)
    part(feedback)
    return h.hexdigest()


def normalised_rubric(scores: RubricScores, settings: RewardSettings) -> float:
    weights = settings.dimension_weights()
    total = sum(weights.values())
    values = scores.as_dict()
    return sum(weights[d] * values[d] for d in DIMENSIONS) / (5.0 * total)


def compute_reward(
    *,
    key: str,
    skill: str,
    device: str,
    verdict: verify_pb2.Verdict,
    scores: RubricScores,
    source: str,
    settings: RewardSettings,
    sig: Signals,
    judge_failure: str = "",
) -> RewardResult:
    """The formula of the module docstring over one verdict and one rubric; pure."""
    s = verdict.speedup_vs_compile if settings.reward_baseline == "compile" else verdict.speedup_vs_eager
    speedup = max(0.0, s)
    term = min(speedup, settings.reward_speedup_cap) + settings.reward_speedup_bonus
    reasons = [h.rule for h in sig.hacks()]
    if sig.judge_directed:
        reasons.append("text addressed to the judge")
    if scores.major_hack and source == "judge":
        reasons.append("the judge found a major hack")
    if scores.anti_hacking <= settings.reward_major_hack_at_most and not reasons:
        reasons.append(f"anti-hacking score {scores.anti_hacking}")
    major = bool(reasons) or scores.major_hack
    rule = term if verdict.accepted and not major else 0.0
    q = normalised_rubric(scores, settings)
    weight = settings.rubric_weight(skill)
    reward = rule * ((1.0 - weight) + weight * q)
    if judge_failure and settings.judge_failure_policy == "zero":
        reward = 0.0
    return RewardResult(
        key=key,
        skill=skill,
        device=device,
        verdict=VerdictSummary.of(verdict),
        speedup=speedup,
        speedup_term=term,
        rule_reward=rule,
        rubric=scores.as_dict(),
        rubric_score=q,
        rubric_weight=weight,
        rubric_source=source,
        major_hack=major,
        hack_reason="; ".join(reasons),
        reward=reward,
        judge_failure=judge_failure,
        rationale=scores.rationale,
        verify_seconds=verdict.seconds,
    )


class _RedisCache:
    """Computed rewards shared across processes; any Redis failure degrades to the memory cache."""

    def __init__(self, url: str, prefix: str, ttl_s: int) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.prefix = prefix
        self.ttl_s = ttl_s

    def get(self, key: str) -> RewardResult | None:
        try:
            raw = self.client.get(self.prefix + key)
            return RewardResult.from_dict(json.loads(raw)) if raw else None
        except Exception as exc:
            log.warning("reward cache read failed: %s", exc)
            return None

    def put(self, result: RewardResult) -> None:
        try:
            self.client.set(self.prefix + result.key, json.dumps(result.to_dict()), ex=self.ttl_s)
        except Exception as exc:
            log.warning("reward cache write failed: %s", exc)


class RewardService:
    """Scores rollouts: verifies each (at most reward_max_concurrent at once), judges the accepted ones, and
    combines both; thread-safe. `judge=None` scores with the judge-free rubric."""

    def __init__(
        self,
        settings: RewardSettings | None = None,
        *,
        verifier: VerifierPort | None = None,
        judge: Judge | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings or RewardSettings()
        self.verifier: VerifierPort = verifier or InProcessVerifier()
        self.judge = judge
        self.clock = clock
        self._slots = threading.BoundedSemaphore(self.settings.reward_max_concurrent)
        self._memory: dict[str, RewardResult] = {}
        self._inflight: dict[str, Future[RewardResult]] = {}
        self._lock = threading.Lock()
        self._redis = (
            _RedisCache(
                self.settings.reward_cache_url,
                self.settings.reward_cache_prefix,
                self.settings.reward_cache_ttl_s,
            )
            if self.settings.reward_cache_url
            else None
        )
        self.computed = 0  # rewards computed here (not served from a cache), for tests and logs

    def score(
        self,
        reference_source: str,
        candidate: code_pb2.Candidate,
        skill: str,
        *,
        device: str = "cpu",
        feedback: str = "",
    ) -> RewardResult:
        """The reward of one rollout. Raises StitchError when none can be computed (a broken reference, a
        verifier that cannot be reached); a bad candidate or a failing judge never raises."""
        if skill not in SKILLS:
            raise ValueError(f"unknown skill {skill!r}: one of {', '.join(SKILLS)}")
        key = reward_key(reference_source, candidate, skill, device, feedback)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                return _as_cached(hit)
            pending = self._inflight.get(key)
            owner = pending is None
            if pending is None:
                pending = Future()
                self._inflight[key] = pending
        if not owner:
            return _as_cached(pending.result())
        try:
            stored = self._redis.get(key) if self._redis is not None else None
            result = (
                _as_cached(stored)
                if stored is not None
                else self._compute(key, reference_source, candidate, skill, device, feedback)
            )
            with self._lock:
                self._memory[key] = result
            if stored is None and self._redis is not None:
                self._redis.put(result)
            pending.set_result(result)
            return result
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def close(self) -> None:
        """Stops what the verifier port holds (an in-process Verifier's standby runner)."""
        close = getattr(self.verifier, "close", None)
        if callable(close):
            close()

    def score_many(self, items: list[RewardRequest]) -> list[RewardResult]:
        """Rewards of a batch, in order; at most reward_max_concurrent verifications at once. A rollout whose
        reward cannot be computed gets reward 0 with `error` set, so one broken problem spares the batch."""
        if not items:
            return []

        def one(item: RewardRequest) -> RewardResult:
            try:
                return self.score(
                    item.reference_source,
                    item.candidate,
                    item.skill,
                    device=item.device,
                    feedback=item.feedback,
                )
            except StitchError as exc:
                log.warning("no reward for a %s rollout: %s", item.skill, exc)
                reward_metrics.record_error(skill=item.skill)
                return _error_result(item, str(exc))

        workers = min(len(items), self.settings.reward_max_concurrent)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward") as pool:
            return list(pool.map(one, items))

    def _compute(
        self,
        key: str,
        reference_source: str,
        candidate: code_pb2.Candidate,
        skill: str,
        device: str,
        feedback: str,
    ) -> RewardResult:
        with self._slots:
            verdict = self.verifier.verify(reference_source, candidate, device=device)
        sig = signals(verdict, candidate)
        scores, source, failure, judge_seconds = judge_free(sig, skill), "judge-free", "", 0.0
        if self.judge is not None and verdict.accepted and not sig.judge_directed:
            outcome: JudgeOutcome = self.judge.judge(
                JudgeRequest(reference_source, candidate, skill, feedback, sig)
            )
            judge_seconds = outcome.seconds
            reward_metrics.record_judge(outcome.seconds, ok=outcome.scores is not None)
            if outcome.scores is not None:
                scores, source = outcome.scores, "judge"
            else:
                failure = outcome.failure or "the judge gave no valid answer"
        result = compute_reward(
            key=key,
            skill=skill,
            device=device,
            verdict=verdict,
            scores=scores,
            source=source,
            settings=self.settings,
            sig=sig,
            judge_failure=failure,
        )
        result = replace(result, judge_seconds=judge_seconds)
        with self._lock:
            self.computed += 1
        reward_metrics.record_reward(result)
        return result


def _as_cached(result: RewardResult) -> RewardResult:
    return result if result.cached else replace(result, cached=True)


def _error_result(item: RewardRequest, error: str) -> RewardResult:
    empty = verify_pb2.Verdict(reason=error)
    return RewardResult(
        key=reward_key(item.reference_source, item.candidate, item.skill, item.device, item.feedback),
        skill=item.skill,
        device=item.device,
        verdict=VerdictSummary.of(empty),
        speedup=0.0,
        speedup_term=0.0,
        rule_reward=0.0,
        rubric=dict.fromkeys(DIMENSIONS, 0),
        rubric_score=0.0,
        rubric_weight=0.0,
        rubric_source="none",
        major_hack=False,
        hack_reason="",
        reward=0.0,
        error=error,
    )
