"""The seed of a random reference's forward calls (stdlib only: the runners and the Verifier both use it)."""

from __future__ import annotations


def forward_seed(set_seed: int) -> int:
    """What torch's generator is seeded with before every forward call on one input set of a random
    reference (dropout in training mode, draws inside forward): derived from the set's secret seed, so the
    reference's and the candidate's calls on one set draw the same numbers, and calls on another set
    other numbers (a draw cached from one call fails on the next set)."""
    return (int(set_seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0x7FFF_FFFF_FFFF_FFFF
