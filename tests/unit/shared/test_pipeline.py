"""The loop policy: every transition of shared.pipeline.decide."""

from stitchcuda.shared.pipeline import (
    Action,
    ActionType,
    Best,
    Event,
    EventType,
    Limits,
    LoopState,
    Phase,
    decide,
    start,
)

PLAN_READY = Event(EventType.PLAN_READY)


def run(state, *events):
    actions = []
    for event in events:
        decision = decide(state, event)
        state = decision.state
        actions.append(decision.actions)
    return state, actions


def verdict(round_, index=0, accepted=True, speedup=1.0):
    return Event(EventType.VERDICT_READY, round=round_, index=index, accepted=accepted, speedup=speedup)


def test_start_plans_first():
    decision = start(Limits())
    assert decision.state.phase is Phase.PLANNING
    assert decision.actions == (Action(ActionType.PLAN),)


def test_plan_ready_generates_and_candidates_are_verified():
    state, actions = run(start(Limits()).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=2))
    assert actions[0] == (Action(ActionType.GENERATE, round=0),)
    assert [a.type for a in actions[1]] == [ActionType.VERIFY, ActionType.VERIFY]
    assert [a.index for a in actions[1]] == [0, 1]
    assert state.phase is Phase.VERIFYING and state.pending == (0, 1)


def test_plan_failed_fails_the_job():
    state, actions = run(start(Limits()).state, Event(EventType.PLAN_FAILED, reason="bad reference"))
    assert state.phase is Phase.FAILED
    assert actions[0][0].type is ActionType.FAIL and "bad reference" in actions[0][0].reason


def test_round_waits_for_all_verdicts_then_optimizes_from_the_best():
    state, actions = run(
        start(Limits(max_rounds=3)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=2),
        verdict(0, 0, speedup=1.5),
        verdict(0, 1, speedup=2.5),
    )
    assert actions[2] == ()  # one verdict still pending
    (optimize,) = actions[3]
    assert optimize.type is ActionType.OPTIMIZE and optimize.round == 1 and optimize.base == (0, 1)
    assert state.best == Best(0, 1, 2.5) and state.phase is Phase.CODING


def test_duplicate_and_stale_events_do_nothing():
    state, _ = run(start(Limits()).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=1))
    same = decide(state, verdict(0, 0))
    assert decide(same.state, verdict(0, 0)).actions == ()  # duplicate verdict
    assert decide(same.state, verdict(7, 0)).actions == ()  # wrong round
    assert decide(state, PLAN_READY).actions == ()  # plan event while verifying


def test_target_speedup_finishes_early():
    state, actions = run(
        start(Limits(max_rounds=5, target_speedup=2.0)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, speedup=2.1),
    )
    assert state.phase is Phase.SUCCEEDED and actions[-1][0].type is ActionType.FINISH


def test_max_rounds_finishes_with_the_best():
    s, _ = run(start(Limits(max_rounds=1, stagnation_rounds=5)).state, PLAN_READY)
    s, acts = run(s, Event(EventType.CANDIDATES_READY, count=1), verdict(0, speedup=1.2))
    assert acts[-1][0].type is ActionType.OPTIMIZE
    s, acts = run(s, Event(EventType.CANDIDATES_READY, round=1, count=1), verdict(1, speedup=1.1))
    assert s.phase is Phase.SUCCEEDED and acts[-1][0].type is ActionType.FINISH
    assert s.best == Best(0, 0, 1.2)


def test_generate_only_with_zero_rounds():
    s, acts = run(
        start(Limits(max_rounds=0)).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=1), verdict(0)
    )
    assert s.phase is Phase.SUCCEEDED and acts[-1][0].type is ActionType.FINISH


def test_stagnation_stops_the_loop():
    limits = Limits(max_rounds=10, stagnation_rounds=2, min_improvement=0.05)
    s, _ = run(
        start(limits).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=1), verdict(0, speedup=2.0)
    )
    s, _ = run(s, Event(EventType.CANDIDATES_READY, round=1, count=1), verdict(1, speedup=2.01))
    assert s.phase is Phase.CODING and s.stale_rounds == 1
    s, acts = run(s, Event(EventType.CANDIDATES_READY, round=2, count=1), verdict(2, speedup=1.0))
    assert s.phase is Phase.SUCCEEDED and "no improvement" in acts[-1][0].reason


def test_rejected_round_optimizes_from_the_rejected_candidate():
    s, acts = run(
        start(Limits(max_rounds=3)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, accepted=False),
    )
    (action,) = acts[-1]
    assert action.type is ActionType.OPTIMIZE and action.base == (0, 0) and s.best is None


def test_two_failed_rounds_replan_then_fail():
    limits = Limits(max_rounds=6, max_replans=1)
    s, _ = run(
        start(limits).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, accepted=False),
    )
    s, acts = run(s, Event(EventType.CANDIDATES_READY, round=1, count=1), verdict(1, accepted=False))
    assert acts[-1][0].type is ActionType.PLAN and s.phase is Phase.PLANNING and s.replans == 1
    s, acts = run(s, Event(EventType.PLAN_READY, round=2))
    assert acts[-1][0].type is ActionType.GENERATE and acts[-1][0].round == 2
    s, _ = run(s, Event(EventType.CANDIDATES_READY, round=2, count=1), verdict(2, accepted=False))
    s, acts = run(s, Event(EventType.CANDIDATES_READY, round=3, count=1), verdict(3, accepted=False))
    # Replans are spent: keep optimizing until the round budget ends, then fail.
    assert acts[-1][0].type is ActionType.OPTIMIZE
    for r in (4, 5, 6):
        s, acts = run(s, Event(EventType.CANDIDATES_READY, round=r, count=1), verdict(r, accepted=False))
    assert s.phase is Phase.FAILED and acts[-1][0].type is ActionType.FAIL


def test_the_rounds_asked_for_are_the_rounds_run():
    # --rounds 0: one round; its rejection ends the job, no re-plan after the last round
    s, acts = run(
        start(Limits(max_rounds=0, max_replans=1)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, accepted=False),
    )
    assert acts[-1][0].type is ActionType.FAIL and s.round == 0 and s.replans == 0
    assert "0 optimize rounds done" in acts[-1][0].reason


def test_two_failed_rounds_replan_within_the_budget():
    s, acts = run(
        start(Limits(max_rounds=2, max_replans=1)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, accepted=False),
        Event(EventType.CANDIDATES_READY, round=1, count=1),
        verdict(1, accepted=False),
    )
    (action,) = acts[-1]
    assert action.type is ActionType.PLAN and action.round == 2 and s.replans == 1
    assert s.reason.startswith("re-planning for round 2 (1 of 1)")


def test_coder_failure_closes_the_round_and_generates_again():
    s, acts = run(
        start(Limits(max_rounds=2)).state, PLAN_READY, Event(EventType.CODER_FAILED, reason="garbled")
    )
    (action,) = acts[-1]
    assert action.type is ActionType.GENERATE and action.round == 1 and "garbled" in action.reason


def test_zero_candidates_counts_as_coder_failure():
    s, acts = run(start(Limits(max_rounds=2)).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=0))
    assert acts[-1][0].type is ActionType.GENERATE and s.round == 1


def test_cancel_from_any_phase_and_terminal_is_final():
    s, acts = run(start(Limits()).state, PLAN_READY, Event(EventType.CANCEL, reason="user"))
    assert s.phase is Phase.CANCELLED and acts[-1][0].type is ActionType.CANCELLED
    assert decide(s, verdict(0)).actions == ()
    assert decide(s, Event(EventType.CANCEL)).actions == ()


def test_timeout_finishes_with_best_or_fails():
    s, _ = run(start(Limits(max_rounds=5)).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=1))
    assert decide(s, Event(EventType.TIMEOUT)).state.phase is Phase.FAILED
    s, _ = run(s, verdict(0, speedup=1.3))
    d = decide(s, Event(EventType.TIMEOUT))
    assert d.state.phase is Phase.SUCCEEDED and d.actions[0].type is ActionType.FINISH


def test_state_round_trips_through_json():
    s, _ = run(
        start(Limits(max_rounds=4, target_speedup=3.0)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=2),
        verdict(0, 0, speedup=1.4),
    )
    assert LoopState.from_json(s.to_json()) == s


def test_a_harness_failure_ends_the_job_at_once_keeping_a_verified_result():
    harness = Event(EventType.HARNESS_FAILED, round=0, index=0, reason="the reference ran out of memory")
    state, actions = run(
        start(Limits(max_rounds=3)).state, PLAN_READY, Event(EventType.CANDIDATES_READY, count=2), harness
    )
    assert state.phase is Phase.FAILED and actions[-1][0].type is ActionType.FAIL
    assert "ran out of memory" in actions[-1][0].reason and state.round == 0
    state, actions = run(
        start(Limits(max_rounds=3)).state,
        PLAN_READY,
        Event(EventType.CANDIDATES_READY, count=1),
        verdict(0, 0, speedup=1.5),
        Event(EventType.CANDIDATES_READY, round=1, count=1),
        Event(EventType.HARNESS_FAILED, round=1, index=0, reason="worker lost"),
    )
    assert state.phase is Phase.SUCCEEDED and actions[-1][0].type is ActionType.FINISH
    assert state.best == Best(0, 0, 1.5)
