"""verl's custom reward function over the same reward as the TRL trainer.

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info)` for each response (set
`custom_reward_function.path` to this file and `.name` to `compute_score`), or, with its batch reward
manager, `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos)` once per batch:
use the batch form so verifications run concurrently and each rollout is scored once.

The rows' `reward_model.ground_truth` is the reference program (the `reference` column of
stitchcuda.training.datasets) and `extra_info` carries `skill`, `target` and `feedback`. The reward service
is built from the STITCH_* environment (RewardSettings, STITCH_REWARD_DEVICE for where candidates run,
STITCH_REWARD_VERIFIER=queue for the cluster's Verifier workers) on first use, or set with `configure`.
verl itself need not be installed here: these are plain functions.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from stitchcuda.training.rollouts import Rollout, RolloutScorer

_scorer: RolloutScorer | None = None
_lock = threading.Lock()


def configure(scorer: RolloutScorer | None) -> None:
    """Uses this scorer (and its reward service) for the calls that follow; None goes back to the default."""
    global _scorer
    with _lock:
        _scorer = scorer


def _get() -> RolloutScorer:
    global _scorer
    with _lock:
        if _scorer is None:
            from stitchcuda.training.reward import RewardService
            from stitchcuda.training.settings import RewardSettings

            settings = RewardSettings()
            from stitchcuda.training.judge import RubricJudge
            from stitchcuda.training.verifier import build_verifier

            verifier = build_verifier(os.environ.get("STITCH_REWARD_VERIFIER", "in_process"), settings)
            service = RewardService(settings, verifier=verifier, judge=RubricJudge.from_settings(settings))
            _scorer = RolloutScorer(service, device=os.environ.get("STITCH_REWARD_DEVICE", "cuda"))
        return _scorer


def _rollout(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None) -> Rollout:
    info = extra_info or {}
    return Rollout(
        text=solution_str,
        reference=str(ground_truth),
        skill=str(info.get("skill", "generate")),
        target=str(info.get("target", "cuda")),
        feedback=str(info.get("feedback", "")),
    )


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One response's reward: verl reads `score`; the other keys are logged as reward extras."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info])[0]


def compute_score_batch(
    data_sources: list[str],
    solution_strs: list[str],
    ground_truths: list[Any],
    extra_infos: list[dict[str, Any] | None],
) -> list[dict[str, Any]]:
    rollouts = [_rollout(s, g, e) for s, g, e in zip(solution_strs, ground_truths, extra_infos, strict=True)]
    out = []
    for scored in _get().score(rollouts):
        result = scored.result
        out.append(
            {
                "score": scored.reward,
                "accepted": float(result.verdict.accepted) if result is not None else 0.0,
                "speedup": result.speedup if result is not None else 0.0,
                "rubric": result.rubric_score if result is not None else 0.0,
                "parsed": float(result is not None),
            }
        )
    return out
