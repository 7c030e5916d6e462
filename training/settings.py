"""Typed settings of the RL kit: the rubric judge (STITCH_JUDGE_*) and the reward (STITCH_REWARD_*)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from stitchcuda.shared.settings import CommonSettings

Skill = Literal["generate", "optimize"]


class RewardSettings(CommonSettings):
    """Everything the reward service reads: the judge's endpoint and sampling, the formula's constants,
    the cache and the bound on concurrent verifications. Field `judge_model` is STITCH_JUDGE_MODEL, and so on.

    No `judge_base_url` means no judge: the rubric comes from the Verifier's deterministic signals alone.
    """

    # ---- the rubric judge (any OpenAI-compatible endpoint; may differ from the Coder's) ----
    judge_base_url: str = ""
    judge_model: str = "stitchcuda-judge"
    judge_api_key: SecretStr = SecretStr("EMPTY")
    # Low temperature: the same candidate should get the same scores across rollouts.
    judge_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    judge_top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    judge_max_tokens: int = Field(default=1024, ge=64)
    # Answers that are not valid JSON for the schema are asked again this many times, then the judge fails.
    judge_retries: int = Field(default=2, ge=0, le=10)
    # Transport failures (connection, 5xx, 429) are retried inside the client this many times.
    judge_transport_retries: int = Field(default=2, ge=0, le=10)
    judge_backoff_s: float = Field(default=1.0, ge=0.0)
    judge_connect_timeout_s: float = Field(default=10.0, gt=0.0)
    judge_request_timeout_s: float = Field(default=120.0, gt=0.0)
    judge_structured_output: Literal["auto", "json", "text"] = "auto"
    # Characters of candidate and reference source shown to the judge (the rest is cut, and says so).
    judge_source_char_budget: int = Field(default=40_000, ge=1_000)
    # What a judge failure (no valid answer after the retries) turns into: the judge-free rubric, or 0.
    judge_failure_policy: Literal["judge_free", "zero"] = "judge_free"

    # ---- the reward formula (see stitchcuda.training.reward's docstring) ----
    reward_speedup_cap: float = Field(default=5.0, gt=0.0)
    reward_speedup_bonus: float = Field(default=0.3, ge=0.0)
    # Which measured speedup is the rule reward's: over eager PyTorch or over torch.compile.
    reward_baseline: Literal["eager", "compile"] = "eager"
    # How much of the rule reward the rubric scales, per skill (1 = fully, 0 = the rubric is ignored).
    reward_rubric_weight_generate: float = Field(default=1.0, ge=0.0, le=1.0)
    reward_rubric_weight_optimize: float = Field(default=0.7, ge=0.0, le=1.0)
    # Weights of the four dimensions in the normalised rubric score.
    reward_weight_anti_hacking: float = Field(default=1.0, ge=0.0)
    reward_weight_cuda_engineering: float = Field(default=1.0, ge=0.0)
    reward_weight_operator_coverage: float = Field(default=1.0, ge=0.0)
    reward_weight_skill_compliance: float = Field(default=1.0, ge=0.0)
    # An anti-hacking score at or below this is a major hack (reward 0), as is the judge's major_hack flag.
    reward_major_hack_at_most: int = Field(default=1, ge=-1, le=5)

    # ---- the reward service ----
    # Verifications (each builds, runs and times a candidate) in flight at once in this process.
    reward_max_concurrent: int = Field(default=2, ge=1, le=256)
    # "" keeps computed rewards in memory only; a redis:// URL also shares them across processes.
    reward_cache_url: str = ""
    reward_cache_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)
    reward_cache_prefix: str = "stitch:reward:"

    # ---- the queue verifier (reward.verifier = queue: the cluster's Verifier workers) ----
    # The tenant its verification jobs run under (GPU-seconds are metered to it; a gateway tenant id).
    reward_queue_tenant: str = Field(default="training", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    # How long one verification may take, queue wait included, before its rollout gets no reward (an
    # error, not the candidate's rejection); the Verifier's own limits are 1500 s to build, 1800 s to run.
    reward_queue_timeout_s: float = Field(default=1800.0, gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> RewardSettings:
        weights = (
            self.reward_weight_anti_hacking,
            self.reward_weight_cuda_engineering,
            self.reward_weight_operator_coverage,
            self.reward_weight_skill_compliance,
        )
        if sum(weights) <= 0:
            raise ValueError("at least one rubric dimension weight must be positive")
        return self

    def rubric_weight(self, skill: str) -> float:
        return (
            self.reward_rubric_weight_optimize if skill == "optimize" else self.reward_rubric_weight_generate
        )

    def dimension_weights(self) -> dict[str, float]:
        return {
            "anti_hacking": self.reward_weight_anti_hacking,
            "cuda_engineering": self.reward_weight_cuda_engineering,
            "operator_coverage": self.reward_weight_operator_coverage,
            "skill_compliance": self.reward_weight_skill_compliance,
        }


class TrainingSettings(RewardSettings):
    """The RL kit's settings: the reward's and the judge's, which the trainer's entry points extend."""
