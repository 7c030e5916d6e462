"""D2/D4 schedule: secret seeds, refills on the same buffers, new addresses, late recheck, probes."""

from __future__ import annotations

from stitchcuda.verifier.probes import build_plan
from stitchcuda.verifier.runner import usable_steps


def test_seeds_are_fresh_secret_and_never_42():
    a, b = build_plan(3, 3, 5, 20), build_plan(3, 3, 5, 20)
    assert len(set(a.seeds)) == len(a.seeds)
    assert not set(a.seeds) & set(b.seeds)
    assert 42 not in a.seeds


def test_schedule_has_new_addresses_refills_and_perturbations():
    plan = build_plan(3, 3, 5, 20)
    ops = [tuple(s[:3]) for s in plan.steps]
    assert ("new", "s0", "trial0") in ops and ("new", "s1", "trial1") in ops
    # refill and perturb write into trial 0's buffers after warm calls on them
    assert ops.index(("refill", "s0", "refill")) > ops.index(("call", "s0", ""))
    assert ("refill", "s0", "perturb") in ops
    kinds = {s["name"]: s["kind"] for s in plan.sets}
    assert kinds["shift"] == "shift" and kinds["uniform"] == "uniform" and kinds["late"] == "perturb"
    calls_before_late = sum(1 for s in plan.steps if s[0] == "call") + plan.warmup + plan.iterations
    assert calls_before_late >= 30
    assert {"refill", "perturb", "shift", "uniform", "late", "profile"} <= set(plan.checked)


def test_steps_skip_probes_the_reference_could_not_make():
    plan = build_plan(2, 3, 5, 20)
    available = {s["name"] for s in plan.sets} - {"shift"}
    steps = usable_steps(plan.steps, available)
    assert not any(s[0] == "call" and s[1] == "shift" for s in steps)
    assert any(s[0] == "call" and s[2] == "uniform" for s in steps)
    # a refill that cannot happen must not leave a stale call recorded under its name
    steps = usable_steps(plan.steps, available - {"perturb"})
    assert not any(s[0] == "call" and s[2] == "perturb" for s in steps)
