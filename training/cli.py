"""`stitchcuda train …`: the RL trainer entry points (mounted on the main command by stitchcuda.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="train",
    help="Train the Coder with RL (GRPO on TRL with LoRA; reward from the Verifier and the rubric).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
EXIT_USAGE = 2


@app.command()
def grpo(
    config: Annotated[Path, typer.Option("--config", help="The run's config (.yaml, .toml or .json).")],
    check: Annotated[
        bool, typer.Option("--check", help="Validate the config and count the examples; do not train.")
    ] = False,
) -> None:
    """GRPO with LoRA on TRL's GRPOTrainer; see docs/training.md and training/configs/."""
    from stitchcuda.training.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        console.print(f"[bold red]error:[/] {exc}", markup=False, highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    if check:
        from stitchcuda.training.grpo import build_examples

        rows, held = build_examples(cfg)
        console.print(f"config ok: {len(rows)} training prompts, {held} held out for evaluation")
        return
    try:
        from stitchcuda.training.grpo import train
    except ImportError as exc:
        console.print(f"error: training needs the training extra: pip install 'stitchcuda[training]' ({exc})")
        raise typer.Exit(EXIT_USAGE) from None
    run = train(cfg)
    console.print(
        f"trained {cfg.trainer.max_steps} steps on {run.examples} prompts; "
        f"adapter in {cfg.trainer.output_dir}"
    )
