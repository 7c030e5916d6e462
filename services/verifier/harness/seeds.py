"""The seed of a random reference's forward calls (stdlib only: the runners and the Verifier both use it)."""

from __future__ import annotations

import hashlib


def forward_seed(set_seed: int) -> int:
    """What torch's generator is seeded with before every forward call on one input set of a random
    reference (dropout in training mode, draws inside forward): derived from the set's secret seed, so the
    reference's and the candidate's calls on one set draw the same numbers, and calls on another set
    other numbers (a draw cached from one call fails on the next set). One-way: a candidate that reads the
    generator's seed learns nothing about the seed its inputs were made from (no seed replay)."""
    digest = hashlib.blake2b(
        int(set_seed).to_bytes(16, "little", signed=True), person=b"stitch-fwd-seed"
    ).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF
