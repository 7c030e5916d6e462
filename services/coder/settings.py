"""The Coder's settings: the LLM endpoint, sampling, retries, the synthesizer's knobs and retrieval."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from stitchcuda.shared.settings import CommonSettings


def _env(name: str, *shared: str, **kwargs: Any) -> Any:
    """A field read from STITCH_CODER_<NAME>, then from the shared names given, settable by field name too."""
    return Field(validation_alias=AliasChoices(f"STITCH_CODER_{name.upper()}", *shared, name), **kwargs)


class CoderSettings(CommonSettings):
    """Common settings from STITCH_*, the Coder's own from STITCH_CODER_* (e.g. STITCH_CODER_BASE_URL).

    The endpoint fields also read the platform-wide STITCH_LLM_* names (shared with the Planner), so one
    `STITCH_LLM_BASE_URL` points every agent at the same vLLM; a STITCH_CODER_* name overrides it.
    """

    model_config = SettingsConfigDict(
        env_prefix="STITCH_", env_file=None, extra="ignore", populate_by_name=True
    )

    # ---- LLM backend (an OpenAI-compatible server: vLLM, or any hosted endpoint) ----
    base_url: str = _env("base_url", "STITCH_LLM_BASE_URL", default="http://127.0.0.1:8000/v1")
    model: str = _env("model", "STITCH_LLM_MODEL", default="stitchcuda-coder")
    api_key: SecretStr = _env("api_key", "STITCH_LLM_API_KEY", default=SecretStr("EMPTY"))
    # The LoRA adapter to request instead of the base model (vLLM serves adapters under their own name).
    lora_adapter: str = _env("lora_adapter", "STITCH_LLM_LORA", default="")
    temperature: float = _env("temperature", default=0.7, ge=0.0, le=2.0)
    top_p: float = _env("top_p", default=0.95, gt=0.0, le=1.0)
    max_tokens: int = _env("max_tokens", default=8192, ge=256)
    # Candidates per request when the caller does not say (the service argument wins).
    samples: int = _env("samples", default=1, ge=1, le=64)
    # Parallel requests when the server does not honour `n` (or n is off).
    max_parallel: int = _env("max_parallel", default=4, ge=1, le=64)
    use_n: bool = _env("use_n", default=True)
    connect_timeout_s: float = _env("connect_timeout_s", default=10.0, gt=0)
    request_timeout_s: float = _env("request_timeout_s", default=600.0, gt=0)
    retries: int = _env("retries", default=3, ge=0, le=10)
    backoff_s: float = _env("backoff_s", default=1.0, ge=0)
    backoff_max_s: float = _env("backoff_max_s", default=30.0, ge=0)
    # "auto": response_format=json_schema, plain text after a 4xx; "json": always; "text": never.
    structured_output: Literal["auto", "json", "text"] = _env("structured_output", default="auto")
    prompt_char_budget: int = _env("prompt_char_budget", default=60_000, ge=2_000)

    # ---- built-in synthesizer ----
    trace_timeout_s: float = _env("trace_timeout_s", default=300.0, gt=0)
    # The reference is traced in its own process through stitchcuda.shared.isolation: "auto" uses
    # bubblewrap (no network, read-only system) where it works; the address-space limit is in MiB.
    trace_sandbox: Literal["auto", "bwrap", "none"] = _env("trace_sandbox", default="auto")
    trace_memory_mb: int = _env("trace_memory_mb", default=8192, ge=0)
    # Default variant knobs ("key=value,key=value", see stitchcuda.coder.synth.variants.CHOICES).
    synth_variant: str = _env("synth_variant", default="")

    # ---- retrieval-augmented prompts ----
    rag_enabled: bool = _env("rag_enabled", default=True)
    # "auto": the packaged MiniLM embedder when it loads, else BM25; "bm25" or "minilm" to force one.
    rag_backend: Literal["auto", "bm25", "minilm"] = _env("rag_backend", default="auto")
    rag_top_k: int = _env("rag_top_k", default=4, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self) -> CoderSettings:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError("backoff_max_s must be at least backoff_s")
        return self

    def served_model(self) -> str:
        """The model name sent in requests: the LoRA adapter's when one is configured."""
        return self.lora_adapter or self.model
