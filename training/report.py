"""How one rollout's reward is shown to a person: every component in a table (`stitchcuda reward`)."""

from __future__ import annotations

from rich.table import Table

from stitchcuda.training.reward import RewardResult


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def reward_table(result: RewardResult) -> Table:
    v = result.verdict
    table = Table(title=f"reward {result.reward:.4f}  ({result.skill}, {result.device})", show_header=True)
    table.add_column("component")
    table.add_column("value")
    table.add_column("how it counts", style="dim")
    rows: list[tuple[str, str, str]] = [
        ("verdict", "accepted" if v.accepted else "rejected", v.reason),
        ("compiled / correct", f"{_yes(v.compiled)} / {_yes(v.correct)}", ""),
        ("speedup", f"{result.speedup:.3f}x", f"vs eager {v.speedup_vs_eager:.3f}x, vs compile "
         f"{v.speedup_vs_compile:.3f}x"),
        ("speedup term", f"{result.speedup_term:.3f}", "min(speedup, cap) + bonus"),
        ("major hack", _yes(result.major_hack), result.hack_reason),
        ("rule reward", f"{result.rule_reward:.3f}", "speedup term if accepted and no major hack, else 0"),
    ]  # fmt: skip
    for dimension, score in result.rubric.items():
        rows.append((f"  {dimension}", f"{score}/5", ""))
    source = result.rubric_source + (
        f" (judge failed: {result.judge_failure})" if result.judge_failure else ""
    )
    rows += [
        ("rubric score", f"{result.rubric_score:.3f}", f"normalised, from the {source}"),
        ("rubric weight", f"{result.rubric_weight:.2f}", "reward = rule * ((1 - weight) + weight * rubric)"),
        ("custom share", f"{v.custom_share:.2f}", "share of kernel time in the candidate's own kernels"),
        ("findings", ", ".join(v.findings) or "none", ""),
        ("rationale", result.rationale, ""),
        ("reward", f"{result.reward:.4f}", "cached" if result.cached else f"key {result.key[:16]}"),
    ]
    if result.error:
        rows.append(("error", result.error, "no reward could be computed"))
    for row in rows:
        table.add_row(*row)
    return table
