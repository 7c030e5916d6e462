"""The loop policy: given a job's loop state and an event, the next actions. Pure; nothing else routes."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field


class Phase(enum.StrEnum):
    PLANNING = "planning"
    CODING = "coding"
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


class EventType(enum.StrEnum):
    PLAN_READY = "plan_ready"
    PLAN_FAILED = "plan_failed"
    CANDIDATES_READY = "candidates_ready"
    CODER_FAILED = "coder_failed"
    VERDICT_READY = "verdict_ready"
    # The verification harness could not do its own part (the reference failed or ran out of memory or
    # time, the machine is too small): no candidate is to blame and no further round can help.
    HARNESS_FAILED = "harness_failed"
    TIMEOUT = "timeout"
    CANCEL = "cancel"


class ActionType(enum.StrEnum):
    PLAN = "plan"  # (re)plan the reference
    GENERATE = "generate"  # coder skill GENERATE from the current plan
    OPTIMIZE = "optimize"  # coder skill OPTIMIZE from `base_index` of the last round, with its verdict
    VERIFY = "verify"  # verify candidate `index` of the current round
    FINISH = "finish"  # succeeded: the best verified candidate is the result
    FAIL = "fail"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Limits:
    max_rounds: int = 3
    target_speedup: float = 0.0
    stagnation_rounds: int = 2
    min_improvement: float = 0.02
    max_replans: int = 1


@dataclass(frozen=True)
class Best:
    round: int
    index: int
    speedup: float


@dataclass(frozen=True)
class LoopState:
    limits: Limits = field(default_factory=Limits)
    phase: Phase = Phase.PLANNING
    round: int = 0
    replans: int = 0
    pending: tuple[int, ...] = ()
    # Verdicts of the current round: index -> (accepted, speedup).
    results: tuple[tuple[int, bool, float], ...] = ()
    best: Best | None = None
    # The candidate the next optimize round starts from (round, index); None = generate afresh.
    base: tuple[int, int] | None = None
    stale_rounds: int = 0
    failed_rounds: int = 0
    reason: str = ""

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> LoopState:
        raw = json.loads(data)
        best = raw.pop("best")
        base = raw.pop("base")
        return LoopState(
            limits=Limits(**raw.pop("limits")),
            phase=Phase(raw.pop("phase")),
            pending=tuple(raw.pop("pending")),
            results=tuple(tuple(r) for r in raw.pop("results")),
            best=Best(**best) if best else None,
            base=tuple(base) if base else None,
            **raw,
        )


@dataclass(frozen=True)
class Event:
    type: EventType
    round: int = 0
    count: int = 0  # candidates in CANDIDATES_READY
    index: int = 0  # candidate index in VERDICT_READY
    accepted: bool = False
    speedup: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class Action:
    type: ActionType
    round: int = 0
    index: int = 0
    base: tuple[int, int] | None = None
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    state: LoopState
    actions: tuple[Action, ...]


def rounds_total(max_rounds: int) -> int:
    """The rounds a job may run: round 0 generates, rounds 1..max_rounds optimize (a re-plan happens
    within them). The one count the banner, the progress and the report all show."""
    return max(0, max_rounds) + 1


def rounds_text(max_rounds: int) -> str:
    """'up to 3 rounds (round 0 generates, rounds 1-2 optimize)': how a person reads the rounds asked for."""
    total = rounds_total(max_rounds)
    if total == 1:
        return "up to 1 round (round 0 generates)"
    rest = "round 1 optimizes" if total == 2 else f"rounds 1-{total - 1} optimize"
    return f"up to {total} rounds (round 0 generates, {rest})"


def rounds_run(state: LoopState) -> int:
    """Rounds started so far, the current one included (numbered from 0, like candidates r<round>c<i>)."""
    return state.round + 1


def start(limits: Limits) -> Decision:
    """A new job: plan first."""
    return Decision(LoopState(limits=limits), (Action(ActionType.PLAN),))


def decide(state: LoopState, event: Event) -> Decision:
    """The next actions for `event`; events that do not fit the phase (duplicates, late ones) do nothing."""
    if state.phase in TERMINAL:
        return Decision(state, ())
    if event.type is EventType.CANCEL:
        return _end(state, Phase.CANCELLED, ActionType.CANCELLED, event.reason or "cancelled")
    if event.type is EventType.TIMEOUT:
        return _finish_or_fail(state, event.reason or "job deadline reached")
    handler = _HANDLERS.get((state.phase, event.type))
    if handler is None or event.round != state.round:
        return Decision(state, ())
    return handler(state, event)


def _end(state: LoopState, phase: Phase, action: ActionType, reason: str) -> Decision:
    new = dataclasses.replace(state, phase=phase, pending=(), reason=reason)
    return Decision(new, (Action(action, round=state.round, reason=reason),))


def _finish_or_fail(state: LoopState, reason: str) -> Decision:
    if state.best is not None:
        return _end(state, Phase.SUCCEEDED, ActionType.FINISH, reason)
    return _end(state, Phase.FAILED, ActionType.FAIL, f"no verified candidate: {reason}")


def _on_plan_ready(state: LoopState, event: Event) -> Decision:
    new = dataclasses.replace(state, phase=Phase.CODING, pending=(), results=(), base=None)
    return Decision(new, (Action(ActionType.GENERATE, round=state.round),))


def _on_plan_failed(state: LoopState, event: Event) -> Decision:
    return _end(state, Phase.FAILED, ActionType.FAIL, f"planning failed: {event.reason}")


def _on_candidates(state: LoopState, event: Event) -> Decision:
    if event.count <= 0:
        return _on_coder_failed(state, dataclasses.replace(event, reason=event.reason or "no candidates"))
    new = dataclasses.replace(state, phase=Phase.VERIFYING, pending=tuple(range(event.count)), results=())
    return Decision(
        new, tuple(Action(ActionType.VERIFY, round=state.round, index=i) for i in range(event.count))
    )


def _on_coder_failed(state: LoopState, event: Event) -> Decision:
    return _close_round(dataclasses.replace(state, results=()), f"coder failed: {event.reason}")


def _on_verdict(state: LoopState, event: Event) -> Decision:
    if event.index not in state.pending:
        return Decision(state, ())
    new = dataclasses.replace(
        state,
        pending=tuple(i for i in state.pending if i != event.index),
        results=(*state.results, (event.index, event.accepted, event.speedup)),
    )
    if new.pending:
        return Decision(new, ())
    return _close_round(new, event.reason)


def _on_harness_failed(state: LoopState, event: Event) -> Decision:
    """Ends the job at once: a round already verified keeps its result, nothing more is attempted."""
    reason = f"the verifier could not check candidates: {event.reason}"
    if state.best is not None:
        return _end(state, Phase.SUCCEEDED, ActionType.FINISH, reason)
    return _end(state, Phase.FAILED, ActionType.FAIL, reason)


def _close_round(state: LoopState, reason: str) -> Decision:
    """All verdicts of the round are in: pick the best, then finish, optimize again or replan."""
    limits = state.limits
    accepted = [(speedup, index) for index, ok, speedup in state.results if ok]
    best, stale = state.best, state.stale_rounds + 1
    if accepted:
        speedup, index = max(accepted)
        if best is None or speedup > best.speedup * (1 + limits.min_improvement):
            best, stale = Best(state.round, index, speedup), 0
    failed = 0 if accepted else state.failed_rounds + 1
    state = dataclasses.replace(state, best=best, stale_rounds=stale, failed_rounds=failed, pending=())

    if best is not None and limits.target_speedup > 0 and best.speedup >= limits.target_speedup:
        return _end(
            state, Phase.SUCCEEDED, ActionType.FINISH, f"target speedup {limits.target_speedup}x reached"
        )
    if state.round >= limits.max_rounds:
        # The rounds asked for are the rounds run: a re-plan happens within them, never after the last.
        return _finish_or_fail(state, f"{limits.max_rounds} optimize rounds done")
    if best is not None and stale >= limits.stagnation_rounds:
        return _end(state, Phase.SUCCEEDED, ActionType.FINISH, f"no improvement in {stale} rounds")
    if best is None and failed >= 2 and state.replans < limits.max_replans:
        return _replan(state, reason or "two rounds without a verified candidate")

    # Optimize from the best verified candidate; with none, from the last round's first candidate
    # (its verdict says what to fix), or generate afresh when the coder produced nothing.
    if best is not None:
        base: tuple[int, int] | None = (best.round, best.index)
    elif state.results:
        base = (state.round, min(i for i, _, _ in state.results))
    else:
        base = None
    next_round = state.round + 1
    state = dataclasses.replace(state, phase=Phase.CODING, round=next_round, results=(), base=base)
    kind = ActionType.OPTIMIZE if base is not None else ActionType.GENERATE
    return Decision(state, (Action(kind, round=next_round, base=base, reason=reason),))


def _replan(state: LoopState, reason: str) -> Decision:
    new = dataclasses.replace(
        state,
        phase=Phase.PLANNING,
        round=state.round + 1,
        replans=state.replans + 1,
        results=(),
        base=None,
        # Shown as the job's status while it plans again, so a re-plan is never a silent extra round.
        reason=(
            f"re-planning for round {state.round + 1} "
            f"({state.replans + 1} of {state.limits.max_replans}): {reason}"
        ),
    )
    return Decision(new, (Action(ActionType.PLAN, round=new.round, reason=reason),))


_HANDLERS = {
    (Phase.PLANNING, EventType.PLAN_READY): _on_plan_ready,
    (Phase.PLANNING, EventType.PLAN_FAILED): _on_plan_failed,
    (Phase.CODING, EventType.CANDIDATES_READY): _on_candidates,
    (Phase.CODING, EventType.CODER_FAILED): _on_coder_failed,
    (Phase.VERIFYING, EventType.VERDICT_READY): _on_verdict,
    (Phase.VERIFYING, EventType.HARNESS_FAILED): _on_harness_failed,
}
