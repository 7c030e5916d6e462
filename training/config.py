"""The GRPO run's config file (YAML or TOML), validated before any model is loaded.

Every section refuses unknown keys, so a misspelt option is an error that names it, not a silent default.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stitchcuda.shared.errors import InvalidRequest


class ConfigError(InvalidRequest):
    """The config file cannot be read or does not validate; the message names the file and each field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    # A hub name or a local folder; the machine must already hold it (training never downloads at run time
    # unless the environment allows it).
    name_or_path: str = Field(min_length=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    trust_remote_code: bool = False
    # FlashAttention-2 on GPU machines that have it; "sdpa" works everywhere.
    attn_implementation: str = "sdpa"


class LoraSection(_Section):
    enabled: bool = True
    r: int = Field(default=16, ge=1, le=1024)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    # "all-linear" (peft's shorthand) or explicit module names (q_proj, k_proj, ...).
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class DataSection(_Section):
    # Ready-made chat JSONL files (stitchcuda.training.datasets), problem folders read in place
    # (KernelBench layout), and trajectory.json files or folders holding them.
    jsonl: list[Path] = []
    suites: list[Path] = []
    trajectories: list[Path] = []
    # Problem folders whose problems never enter training (matched by problem hash and name).
    eval_suites: list[Path] = []
    skills: list[Literal["generate", "optimize"]] = ["generate", "optimize"]
    target: Literal["cpu", "cuda"] = "cuda"
    kernel_policy: Literal["strict", "library"] = "strict"
    # Generate prompts from suites with the Planner's plan (runs each reference once) or without a plan.
    plan: bool = True
    # Only examples whose prompt fits this many characters (long optimize prompts crowd the context).
    max_prompt_chars: int = Field(default=60_000, ge=1_000)

    @model_validator(mode="after")
    def _some_data(self) -> DataSection:
        if not (self.jsonl or self.suites or self.trajectories):
            raise ValueError("give at least one of data.jsonl, data.suites, data.trajectories")
        return self


class GenerationSection(_Section):
    # vllm_server: TRL's client of a `trl vllm-serve` process (GPU machines); transformers: generate()
    # in the training process (CPU, or GPUs without vLLM).
    backend: Literal["vllm_server", "transformers"] = "vllm_server"
    vllm_host: str = "127.0.0.1"
    vllm_port: int = Field(default=8000, ge=1, le=65535)
    vllm_timeout_s: float = Field(default=240.0, gt=0)
    num_generations: int = Field(default=8, ge=2)
    max_prompt_tokens: int | None = Field(default=None, ge=16)
    max_completion_tokens: int = Field(default=4096, ge=8)
    temperature: float = Field(default=1.0, gt=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class TrainerSection(_Section):
    output_dir: Path = Path("train-out/grpo")
    max_steps: int = Field(default=200, ge=1)
    learning_rate: float = Field(default=1e-5, gt=0.0)
    per_device_train_batch_size: int = Field(default=8, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    # KL coefficient against the reference policy (0: no reference model is kept, as in DAPO/Dr. GRPO).
    beta: float = Field(default=0.0, ge=0.0)
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dapo"
    logging_steps: int = Field(default=1, ge=1)
    save_steps: int = Field(default=50, ge=1)
    bf16: bool = True
    gradient_checkpointing: bool = True
    seed: int = 0
    use_cpu: bool = False
    report_to: list[str] = []


class RewardSection(_Section):
    # Where candidates run: the GPU Verifier on GPU machines, the CPU backend for smoke runs.
    device: Literal["cpu", "cuda"] = "cuda"
    # in_process: a VerifierService in the trainer process (one machine). queue: the cluster's Verifier
    # workers through the platform's queues (verifier.cpu; verifier.build then verifier.gpu for CUDA), each
    # verification a job of tenant reward_queue_tenant (stitchcuda.training.verifier.QueueVerifier).
    verifier: Literal["in_process", "queue"] = "in_process"
    # RewardSettings fields (stitchcuda.training.settings) over the STITCH_* environment, e.g.
    # reward_max_concurrent, judge_base_url, reward_cache_url; with verifier: queue also the platform's
    # (redis_url, artifact_store, s3_*, broker_url) and reward_queue_tenant, reward_queue_timeout_s.
    settings: dict[str, Any] = {}


class GRPOConfig(_Section):
    model: ModelSection
    lora: LoraSection = LoraSection()
    data: DataSection
    generation: GenerationSection = GenerationSection()
    trainer: TrainerSection = TrainerSection()
    reward: RewardSection = RewardSection()

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        batch = self.trainer.per_device_train_batch_size * self.trainer.gradient_accumulation_steps
        if batch % self.generation.num_generations:
            raise ValueError(
                f"trainer.per_device_train_batch_size x gradient_accumulation_steps ({batch}) must be a "
                f"multiple of generation.num_generations ({self.generation.num_generations}): GRPO compares "
                "the completions of one prompt within a batch"
            )
        if self.trainer.use_cpu and self.generation.backend == "vllm_server":
            raise ValueError(
                "trainer.use_cpu needs generation.backend = 'transformers' (vLLM serves on GPUs)"
            )
        return self


def _read(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".toml":
        return tomllib.loads(text)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    if path.suffix == ".json":
        return json.loads(text)
    raise ConfigError(f"{path}: unknown config format {path.suffix!r} (use .yaml, .yml, .toml or .json)")


def load_config(path: Path) -> GRPOConfig:
    """Reads and validates a config; relative paths in it are relative to the file's folder."""
    path = Path(path)
    try:
        raw = _read(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except ConfigError:
        raise
    except Exception as exc:  # the YAML and TOML parsers raise their own types
        raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.').upper()}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping of sections (model, data, ...)")
    try:
        config = GRPOConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{path}: invalid config:"]
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None
    return _relative_to(config, path.parent)


def _relative_to(config: GRPOConfig, base: Path) -> GRPOConfig:
    def fix(paths: list[Path]) -> list[Path]:
        return [p if p.is_absolute() else (base / p) for p in paths]

    data = config.data.model_copy(
        update={
            "jsonl": fix(config.data.jsonl),
            "suites": fix(config.data.suites),
            "trajectories": fix(config.data.trajectories),
            "eval_suites": fix(config.data.eval_suites),
        }
    )
    return config.model_copy(update={"data": data})
