"""Typed settings shared by every service; each service extends CommonSettings with its own fields."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "changeme", "minioadmin", "secret", "password", "dev-only-secret"})


def default_home() -> Path:
    return Path.home() / ".stitchcuda"


class CommonSettings(BaseSettings):
    """Settings every process reads from the environment (prefix STITCH_), validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="STITCH_", env_file=None, extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    log_level: str = "INFO"
    log_json: bool = False
    home: Path = Field(default_factory=default_home)

    # Stores: "memory"/"local" run embedded; "redis"/"s3" run the platform.
    job_store: Literal["memory", "redis"] = "memory"
    artifact_store: Literal["memory", "local", "s3"] = "local"
    redis_url: str = "redis://127.0.0.1:6379/0"
    artifact_dir: Path | None = None
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    s3_bucket: str = "stitchcuda"
    s3_secure: bool = False
    s3_region: str = "us-east-1"

    # Per-node bound on concurrent CUDA contexts (verifier workers on one node share the slots).
    gpu_slots_per_gpu: int = Field(default=1, ge=1)
    gpu_slot_dir: Path = Path("/tmp/stitchcuda-gpu-slots")
    # Processes that share a GPU (several slots, the Planner's runs) work on it at once but time alone:
    # GPU work takes the node's turn on the device shared, a timing takes it alone (verifier/harness/turns).
    gpu_turns: bool = True

    # HMAC key for API-key hashing and signed tokens.
    secret_key: SecretStr = SecretStr("dev-only-secret")
    max_reference_bytes: int = 256 * 1024
    # References up to this size live only in the job record (Redis), which carries the source anyway;
    # larger ones are also put to the artifact store before the job exists. 0 stores every one.
    inline_reference_bytes: int = Field(default=64 * 1024, ge=0)
    # Which jobs have their reference's results (inputs, ground truth, eager and torch.compile timings)
    # computed on the verifier while their first program is written and built: "cuda" jobs (the default;
    # the reference is most of a GPU verification's fixed cost), "all" jobs, or "off".
    reference_prefetch: Literal["off", "cuda", "all"] = "cuda"

    @model_validator(mode="after")
    def _refuse_placeholders_in_production(self) -> CommonSettings:
        if self.environment == "production":
            if self.secret_key.get_secret_value() in PLACEHOLDER_SECRETS:
                raise ValueError("STITCH_SECRET_KEY must be set to a real secret in production")
            if self.artifact_store == "s3" and self.s3_secret_key.get_secret_value() in PLACEHOLDER_SECRETS:
                raise ValueError("STITCH_S3_SECRET_KEY must be set to a real secret in production")
        return self

    def resolved_artifact_dir(self) -> Path:
        return self.artifact_dir or (self.home / "artifacts")
