"""The input sets and the call schedule of one verification (D2/D4/D7), with fresh secret seeds.

Seeds come from os.urandom for every verification and never reach the candidate's process: it sees
only the resulting tensors, one call at a time. The schedule mixes plain trials on new addresses
(earlier buffers stay alive), in-place refills after warm calls, single-element/segment perturbations,
distribution shifts, a rotating timing pool, a late in-place recheck after the timed loop, a
profiled call and an off-shape probe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def secret_seed() -> int:
    return int.from_bytes(os.urandom(8), "big") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class Plan:
    sets: list[dict[str, Any]]
    steps: list[list[Any]]
    pool: list[str]
    late: str
    profile: str
    offshape: str
    init_seed: int
    warmup: int
    iterations: int
    # Recorded name -> input set name, for every output that must match the reference.
    checked: dict[str, str] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return [self.init_seed] + [s["seed"] for s in self.sets]


# Problems whose input sets would not fit the run's memory get the compact schedule: two trials, a
# timing pool of two (the late in-place recheck of its first set still catches pointer-keyed caches),
# no second distribution family, no off-shape probe. Every rule that needs data still gets it.
COMPACT_TRIALS = 2
COMPACT_POOL = 2


def build_plan(
    trials: int,
    pool_size: int,
    warmup: int,
    iterations: int,
    *,
    offshape: bool = True,
    compact: bool = False,
) -> Plan:
    def spec(name: str, kind: str, base: str = "") -> dict[str, Any]:
        return {"name": name, "kind": kind, "seed": secret_seed(), "base": base}

    if compact:
        trials, offshape = min(trials, COMPACT_TRIALS), False
    trial_names = [f"trial{i}" for i in range(trials)]
    pool = [f"pool{i}" for i in range(COMPACT_POOL if compact else pool_size)]
    sets = [spec(n, "plain") for n in trial_names]
    sets += [spec("refill", "plain"), spec("perturb", "perturb", base="refill")]
    sets += [spec("shift", "shift")] + ([] if compact else [spec("uniform", "uniform")])
    sets += [spec(n, "plain") for n in pool]
    sets += [spec("late", "perturb", base=pool[0]), spec("profile", "plain")]
    if offshape:
        sets.append(spec("offshape", "plain"))

    steps: list[list[Any]] = []
    checked: dict[str, str] = {}
    for i, name in enumerate(trial_names):
        # Each trial gets new buffers while the earlier ones stay alive (new addresses, D2c).
        steps += [["new", f"s{i}", name], ["call", f"s{i}", name, name]]
        checked[name] = name
    # Warm calls on trial 0's buffers, then new data written into the same buffers (D2a), then a
    # single-element and segment perturbation of what that address last held (D2d).
    steps += [["call", "s0", "", trial_names[0]], ["call", "s0", "", trial_names[0]]]
    steps += [["refill", "s0", "refill"], ["call", "s0", "refill", "refill"]]
    steps += [["refill", "s0", "perturb"], ["call", "s0", "perturb", "perturb"]]
    checked.update({"refill": "refill", "perturb": "perturb"})
    # Distribution shifts (D2e): affine and another family.
    steps += [["new", "shift", "shift"], ["call", "shift", "shift", "shift"]]
    if not compact:
        steps += [["new", "uniform", "uniform"], ["call", "uniform", "uniform", "uniform"]]
        checked["uniform"] = "uniform"
    checked.update({"shift": "shift", "late": "late", "profile": "profile"})
    return Plan(
        sets=sets,
        steps=steps,
        pool=pool,
        late="late",
        profile="profile",
        offshape="offshape" if offshape else "",
        init_seed=secret_seed(),
        warmup=warmup,
        iterations=iterations,
        checked=checked,
    )
