"""GRPO on TRL's GRPOTrainer with LoRA: the Coder's atomic-skill prompts, rollouts scored by the reward
service, generation through a vLLM server (GPU machines) or transformers (CPU).

TRL, peft, transformers and datasets come with the `training` extra and are imported only here, when a
run is built, so the rest of the kit works without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stitchcuda.training import datasets as ds
from stitchcuda.training.config import GRPOConfig
from stitchcuda.training.rollouts import RolloutScorer, TRLRewardFunction

if TYPE_CHECKING:
    from stitchcuda.training.reward import RewardService

log = logging.getLogger("stitchcuda.training.grpo")


def build_examples(config: GRPOConfig) -> tuple[list[ds.Example | dict[str, Any]], int]:
    """The training rows the config names, with the evaluation suites' problems removed.

    Returns the rows and how many were held out.
    """
    data = config.data
    builder = ds.ExampleBuilder(kernel_policy=data.kernel_policy)
    examples: list[ds.Example] = []
    plans = _planner(data.target) if data.plan else None
    for root in data.suites:
        examples += builder.from_suite(ds.load_suite(root), target=data.target, plans=plans)
    examples += builder.from_trajectories(ds.read_trajectories(data.trajectories))
    evaluation = [p for root in data.eval_suites for p in ds.load_suite(root)]
    split = ds.split_out(examples, evaluation)
    rows: list[ds.Example | dict[str, Any]] = [
        e for e in split.train if e.skill in data.skills and _prompt_chars(e.prompt) <= data.max_prompt_chars
    ]
    held = len(split.held_out)
    hashes = {p.hash for p in evaluation}
    names = {p.name for p in evaluation}
    for path in data.jsonl:
        for row in ds.read_jsonl(path):
            if row.get("problem_hash") in hashes or row.get("problem") in names:
                held += 1
            elif row.get("skill") in data.skills and _prompt_chars(row["prompt"]) <= data.max_prompt_chars:
                rows.append(row)
    return rows, held


def _prompt_chars(prompt: list[dict[str, str]]) -> int:
    return sum(len(m.get("content", "")) for m in prompt)


def _planner(target: str) -> ds.PlanSource:
    from stitchcuda.planner.service import PlannerService
    from stitchcuda.planner.settings import PlannerSettings

    planner = PlannerService(PlannerSettings(profile_compile=False))

    def plan(name: str, source: str) -> Any:
        try:
            return planner.plan(source, problem_name=name, device=target)
        except Exception as exc:  # a problem the Planner cannot analyse still trains generate, unplanned
            log.warning("no plan for %s: %s", name, exc)
            return None

    return plan


def reward_service(config: GRPOConfig) -> RewardService:
    """The reward service the config asks for: settings from the environment overlaid by reward.settings."""
    from stitchcuda.training.reward import RewardService
    from stitchcuda.training.settings import RewardSettings

    settings = RewardSettings(**config.reward.settings)
    from stitchcuda.training.judge import RubricJudge
    from stitchcuda.training.verifier import build_verifier

    verifier = build_verifier(config.reward.verifier, settings, config.reward.settings)
    # No judge endpoint configured: the judge-free rubric from the Verifier's signals.
    return RewardService(settings, verifier=verifier, judge=RubricJudge.from_settings(settings))


@dataclass
class Run:
    trainer: Any
    scorer: RolloutScorer
    examples: int
    held_out: int


def _to_train_rows(rows: list[ds.Example | dict[str, Any]]) -> list[dict[str, Any]]:
    """GRPO needs only the prompt and the columns the reward reads; a supervised target is dropped."""
    keep = ("prompt", "reference", "skill", "target", "feedback", "problem", "problem_hash")
    out = []
    for row in rows:
        data = row.row() if isinstance(row, ds.Example) else row
        out.append({k: data.get(k, "") for k in keep})
    return out


def build(
    config: GRPOConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    service: RewardService | None = None,
    rows: list[ds.Example | dict[str, Any]] | None = None,
    reward_function: Any = None,
) -> Run:
    """A ready GRPOTrainer for the config. `model`/`tokenizer` override config.model (tests build tiny
    ones in code), `rows` the dataset, `service` the reward service, `reward_function` wraps the
    default TRL reward function (for logging or rollout injection)."""
    import datasets
    import peft
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    held = 0
    if rows is None:
        rows, held = build_examples(config)
    if not rows:
        raise ValueError("the config's data gives no training examples (after the evaluation split)")
    train = datasets.Dataset.from_list(_to_train_rows(rows))
    scorer = RolloutScorer(service or reward_service(config), device=config.reward.device)
    reward_fn: Callable[..., list[float]] = TRLRewardFunction(scorer)
    if reward_function is not None:
        reward_fn = reward_function(reward_fn)
    gen, tr = config.generation, config.trainer
    args = TRLConfig(
        output_dir=str(tr.output_dir),
        max_steps=tr.max_steps,
        learning_rate=tr.learning_rate,
        per_device_train_batch_size=tr.per_device_train_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        beta=tr.beta,
        loss_type=tr.loss_type,
        logging_steps=tr.logging_steps,
        save_steps=tr.save_steps,
        bf16=tr.bf16 and not tr.use_cpu,
        gradient_checkpointing=tr.gradient_checkpointing and not tr.use_cpu,
        seed=tr.seed,
        use_cpu=tr.use_cpu,
        report_to=tr.report_to or "none",
        num_generations=gen.num_generations,
        max_completion_length=gen.max_completion_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        use_vllm=gen.backend == "vllm_server",
        vllm_mode="server",
        vllm_server_host=gen.vllm_host,
        vllm_server_port=gen.vllm_port,
        vllm_server_timeout=gen.vllm_timeout_s,
        remove_unused_columns=False,
    )
    if gen.max_prompt_tokens is not None and hasattr(args, "max_prompt_length"):
        args.max_prompt_length = gen.max_prompt_tokens
    lora = config.lora
    peft_config = (
        peft.LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        if lora.enabled
        else None
    )
    if model is None:
        model = _load_model(config)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    return Run(trainer=trainer, scorer=scorer, examples=len(train), held_out=held)


def _load_model(config: GRPOConfig) -> Any:
    import torch
    import transformers

    m = config.model
    dtype: Any = "auto" if m.dtype == "auto" else getattr(torch, m.dtype)
    return transformers.AutoModelForCausalLM.from_pretrained(
        m.name_or_path,
        dtype=dtype,
        trust_remote_code=m.trust_remote_code,
        attn_implementation=m.attn_implementation,
    )


def train(config: GRPOConfig) -> Run:
    """Builds the run, trains it to max_steps and saves the LoRA adapter in trainer.output_dir."""
    run = build(config)
    log.info("GRPO: %d training prompts (%d held out for evaluation)", run.examples, run.held_out)
    run.trainer.train()
    run.trainer.save_model(str(config.trainer.output_dir))
    return run
