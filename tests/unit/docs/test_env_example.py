"""`.env.example` names every variable docker-compose.yml reads, and leaves each required one to fill in."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VARIABLE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(:?[-?])?[^}]*\}")


def test_env_example_lists_every_compose_variable_and_fills_none_of_the_secrets() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    used = {name: kind or "" for name, kind in VARIABLE.findall(compose)}
    required = {name for name, kind in used.items() if kind.endswith("?")}
    example = (ROOT / ".env.example").read_text().splitlines()
    active = dict(line.split("=", 1) for line in example if re.match(r"^[A-Z][A-Z0-9_]*=", line))
    commented = {m.group(1) for line in example if (m := re.match(r"^# ([A-Z][A-Z0-9_]*)=", line))}
    assert required, "compose requires no secret: the check below would prove nothing"
    assert required <= set(active), (
        f"required by compose, missing from .env.example: {required - set(active)}"
    )
    secrets = {n for n in required if re.search(r"SECRET|PASSWORD", n)}
    assert all(active[n] == "" for n in secrets), "a secret in .env.example would be used as is"
    assert set(used) - set(active) - commented == set(), "compose variables .env.example does not mention"
    assert set(active) | commented <= set(used), ".env.example names variables compose does not read"


def test_dot_env_is_ignored_by_git_and_docker() -> None:
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in (ROOT / ".dockerignore").read_text().splitlines()
