"""Model completions to rewards: each completion is parsed into a candidate by the Coder's own parser and
scored by the reward service in one batch; shared by the TRL reward function and the verl adapter."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stitchcuda.api.v1 import code_pb2
from stitchcuda.coder.llm.parse import ParseError, parse_answer
from stitchcuda.shared.candidate import ENTRY

if TYPE_CHECKING:
    from stitchcuda.training.reward import RewardResult, RewardService

log = logging.getLogger("stitchcuda.training.rollouts")


@dataclass(frozen=True)
class Rollout:
    """One completion of one prompt, with what its reward needs from the prompt's row."""

    text: str
    reference: str
    skill: str = "generate"
    target: str = "cpu"
    feedback: str = ""


@dataclass(frozen=True)
class Scored:
    reward: float
    # None when the completion held no program (no verification was spent on it).
    result: RewardResult | None
    parse_error: str = ""


def completion_text(completion: Any) -> str:
    """TRL passes a conversational completion as a list of messages, a plain one as a string."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(
            str(m.get("content", ""))
            for m in completion
            if isinstance(m, dict) and m.get("role") == "assistant"
        )
    return str(completion)


def to_candidate(text: str, target: str) -> code_pb2.Candidate:
    """The candidate the serving Coder would build from this answer; raises ParseError like it."""
    parsed = parse_answer(text, backend=target)
    return code_pb2.Candidate(
        schema_version=1,
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in parsed.files.items()],
        build=parsed.build,
        entry=ENTRY,
        coder="rollout",
        rationale=parsed.rationale,
    )


class RolloutScorer:
    """Scores batches of rollouts on a RewardService (in this process or over the cluster's queue, as the
    service's verifier port decides); unparseable completions score 0 without a verification."""

    def __init__(self, service: RewardService, *, device: str = "cpu") -> None:
        self.service = service
        self.device = device
        self._lock = threading.Lock()
        self.history: list[Scored] = []  # every scored rollout of this run, for logs and tests

    def score(self, rollouts: Sequence[Rollout]) -> list[Scored]:
        from stitchcuda.training.reward import RewardRequest

        out: list[Scored | None] = [None] * len(rollouts)
        requests: list[RewardRequest] = []
        slots: list[int] = []
        for i, rollout in enumerate(rollouts):
            try:
                candidate = to_candidate(rollout.text, rollout.target)
            except ParseError as exc:
                out[i] = Scored(0.0, None, str(exc))
                continue
            requests.append(
                RewardRequest(
                    reference_source=rollout.reference,
                    candidate=candidate,
                    skill=rollout.skill,
                    device=self.device,
                    feedback=rollout.feedback,
                )
            )
            slots.append(i)
        for i, result in zip(slots, self.service.score_many(requests), strict=True):
            out[i] = Scored(float(result.reward), result)
        scored = [s for s in out if s is not None]
        with self._lock:
            self.history.extend(scored)
        parsed = len(requests)
        log.info(
            "scored %d rollouts: %d parsed, %d rewarded, mean %.3f",
            len(scored),
            parsed,
            sum(1 for s in scored if s.reward > 0),
            sum(s.reward for s in scored) / max(len(scored), 1),
        )
        return scored


class TRLRewardFunction:
    """A TRL reward function: `(prompts, completions, **columns) -> rewards`, the dataset's columns
    (`reference`, `skill`, `target`, `feedback`) arriving as keyword lists, one entry per completion."""

    __name__ = "stitchcuda_reward"  # TRL names the logged reward after the function

    def __init__(self, scorer: RolloutScorer) -> None:
        self.scorer = scorer

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        n = len(completions)

        def column(name: str, default: str) -> list[str]:
            values = columns.get(name)
            return [str(v) if v is not None else default for v in values] if values else [default] * n

        references = columns.get("reference")
        if not references:
            raise ValueError("the training dataset needs a 'reference' column (stitchcuda.training.datasets)")
        rollouts = [
            Rollout(completion_text(c), str(r), s, t, f)
            for c, r, s, t, f in zip(
                completions,
                references,
                column("skill", "generate"),
                column("target", "cpu"),
                column("feedback", ""),
                strict=True,
            )
        ]
        return [s.reward for s in self.scorer.score(rollouts)]
