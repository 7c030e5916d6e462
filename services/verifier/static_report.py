"""The D11 scan's hit list: rule ids with detail and location, turned into Findings with policy severities."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier import policy


@dataclass(frozen=True)
class Hit:
    rule: str
    detail: str
    where: str


class Hits:
    """Collects hits once per (rule, where, detail); the rule id must be one of policy.RULES."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], Hit] = {}

    def add(self, rule: str, detail: str, where: str) -> None:
        if rule not in policy.BY_ID:
            raise KeyError(f"unknown D11 rule {rule!r}")
        key = (rule, where, detail)
        if key not in self._items:
            self._items[key] = Hit(rule, detail, where)

    def extend(self, hits: Iterable[Hit]) -> None:
        for h in hits:
            self.add(h.rule, h.detail, h.where)

    def rules(self) -> set[str]:
        return {h.rule for h in self._items.values()}

    def __iter__(self) -> Iterator[Hit]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def findings(
        self, allowed_rules: Iterable[str] = (), limit_per_rule: int = 12
    ) -> list[verify_pb2.Finding]:
        """Findings by severity (REJECT first), then rule and place; at most limit_per_rule of each rule."""
        permitted = {policy.canonical(r) for r in allowed_rules}
        per_rule: dict[str, int] = {}
        out: list[verify_pb2.Finding] = []
        ordered = sorted(
            self._items.values(),
            key=lambda h: (-policy.BY_ID[h.rule].severity, h.rule, _place(h.where), h.detail),
        )
        for h in ordered:
            rule = policy.BY_ID[h.rule]
            per_rule[h.rule] = per_rule.get(h.rule, 0) + 1
            if per_rule[h.rule] > limit_per_rule:
                continue
            severity = rule.severity
            detail = h.detail
            if h.rule in permitted and rule.downgradable and severity == policy.REJECT:
                severity = policy.WARNING
                detail += " (allowed by policy)"
            level = verify_pb2.Severity.ValueType(severity)
            out.append(verify_pb2.Finding(rule=h.rule, severity=level, detail=detail, where=h.where))
        return out


def _place(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    return (path, int(line)) if line.isdigit() else (where, 0)
