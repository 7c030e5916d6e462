"""Atomic-skill training examples for the Coder: *generate* (problem + plan -> program) and *optimize*
(problem + candidate + Verifier feedback -> better program), from problem suites and from the loop
trajectories jobs record; chat-format JSONL or a `datasets.Dataset`, and a split that keeps an
evaluation suite's problems out of training.

The prompts are the Coder's own (`LLMCoder.generate_messages` / `optimize_messages`), so a model trained
on these examples sees exactly what the serving Coder sends it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from stitchcuda.api.v1 import code_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.llm.client import ScriptedClient
from stitchcuda.coder.llm.coder import LLMCoder
from stitchcuda.coder.llm.prompts import feedback_text
from stitchcuda.coder.rag.retriever import make_retriever
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.shared import problem as problem_format
from stitchcuda.shared.artifacts import ArtifactStore, sha256_hex
from stitchcuda.shared.errors import ProblemError
from stitchcuda.shared.policy import KernelPolicy
from stitchcuda.shared.policy import resolve as resolve_policy

GENERATE, OPTIMIZE = "generate", "optimize"
SKILLS = (GENERATE, OPTIMIZE)
_LEVEL = re.compile(r"^level(\d+)$")

PlanSource = Callable[[str, str], plan_pb2.Plan | None]
"""(problem name, reference source) -> the plan the Coder would be given, or None for no plan."""


def problem_hash(source: str) -> str:
    """The identity of a problem for splits: its code with comments, docstrings and layout removed.

    A renamed file or a reformatted copy of an evaluation problem is still the same problem; only a
    change to what the program does makes a new one. Unparseable sources fall back to the raw text.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return sha256_hex(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    return sha256_hex(ast.unparse(tree))


@dataclass(frozen=True)
class SuiteProblem:
    name: str
    level: str
    path: str
    source: str
    hash: str


def load_suite(root: Path, pattern: str = "**/*.py") -> list[SuiteProblem]:
    """The KernelBench-format problems under `root` (read in place, never copied), in path order.

    A problem's level is its `levelN` folder (KernelBench's layout), else "suite". Files that are not
    problems (a README's helper, a broken file) are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        raise ProblemError(f"{root}: no such problem folder")
    out = []
    for path in sorted(root.glob(pattern)):
        if not path.is_file() or path.name.startswith("_"):
            continue
        try:
            prob = problem_format.load(path)
        except ProblemError:
            continue
        level = next((p for p in path.relative_to(root).parts[:-1] if _LEVEL.match(p)), "suite")
        out.append(SuiteProblem(prob.name, level, str(path), prob.source, problem_hash(prob.source)))
    return out


@dataclass
class Example:
    """One single-turn training example; `completion` is a known-better answer when one exists (for
    supervised warm-up), None for RL prompts whose answers the reward scores."""

    skill: str
    problem: str
    problem_hash: str
    reference: str
    target: str
    kernel_policy: str
    prompt: list[dict[str, str]]
    source: str
    completion: str | None = None
    # optimize: the speedup the previous program reached (0 when it was rejected), and the Verifier
    # feedback the prompt shows (the reward's skill-compliance rubric checks the answer against it).
    previous_speedup: float = 0.0
    feedback: str = ""

    def row(self) -> dict[str, Any]:
        """The chat-format row: `prompt` (and `completion`) as message lists, the rest as columns that
        TRL passes to reward functions."""
        row = asdict(self)
        row["completion"] = (
            [{"role": "assistant", "content": self.completion}] if self.completion is not None else None
        )
        return row


def answer_text(candidate: code_pb2.Candidate, rationale: str = "") -> str:
    """A candidate written as the structured answer the system prompt asks for (the inverse of the
    Coder's parser), for supervised targets and known-good rollouts."""
    payload: dict[str, Any] = {
        "rationale": rationale or candidate.rationale,
        "files": [{"path": f.path, "content": f.content} for f in candidate.files],
        "cflags": list(candidate.build.cflags),
        "cuda_cflags": list(candidate.build.cuda_cflags),
        "ldflags": list(candidate.build.ldflags),
    }
    if candidate.build.libraries:
        payload["libraries"] = list(candidate.build.libraries)
    return json.dumps(payload)


def serving_coder(policy: KernelPolicy, settings: CoderSettings | None = None) -> LLMCoder:
    """An LLMCoder with the serving Coder's prompt settings (STITCH_CODER_* / CoderSettings: structured
    answers, prompt budget, retrieved notes). Its client is never called: only its prompts are used."""
    s = settings or CoderSettings()
    return LLMCoder(
        ScriptedClient([]),
        retriever=make_retriever(s.rag_backend) if s.rag_enabled else None,
        top_k=s.rag_top_k,
        structured=s.structured_output != "text",
        char_budget=s.prompt_char_budget,
        policy=policy,
    )


class ExampleBuilder:
    """Renders examples with the Coder's prompts; `coder` carries the prompt settings (structured
    answers, character budget, retriever) of the deployment being trained for."""

    def __init__(self, coder: LLMCoder | None = None, *, kernel_policy: str = "strict") -> None:
        self.policy: KernelPolicy = resolve_policy(kernel_policy)
        self.coder = coder or serving_coder(self.policy)

    # ---- suites -------------------------------------------------------------------------------------
    def from_suite(
        self, problems: Iterable[SuiteProblem], *, target: str = "cpu", plans: PlanSource | None = None
    ) -> Iterator[Example]:
        """One generate example per problem (the plan from `plans`, e.g. the Planner; none without)."""
        for prob in problems:
            plan = plans(prob.name, prob.source) if plans is not None else None
            yield Example(
                skill=GENERATE,
                problem=prob.name,
                problem_hash=prob.hash,
                reference=prob.source,
                target=target,
                kernel_policy=self.policy.name,
                prompt=self.coder.generate_messages(prob.source, plan, target=target),
                source=f"suite:{prob.path}",
            )

    # ---- trajectories -------------------------------------------------------------------------------
    def from_trajectory(self, trajectory: dict[str, Any]) -> Iterator[Example]:
        """The examples one job's rounds hold.

        generate: the job's problem with its first plan; the completion is the best round-0 program the
        Verifier accepted, if any. optimize: every verified candidate that a later round started from,
        with its verdict's feedback; the completion is the child program when it was accepted and
        faster than its parent (or fixed a rejected one).
        """
        reference = str(trajectory["reference"])
        name = str(trajectory.get("problem") or "reference")
        target = "cuda" if trajectory.get("device") == "cuda" else "cpu"
        phash = problem_hash(reference)
        policy = str(trajectory.get("kernel_policy") or self.policy.name)
        plans = trajectory.get("plans") or []
        plan = _plan(plans[0]["plan"]) if plans else None
        rounds = [r for r in trajectory.get("rounds", []) if r.get("verdict") is not None]
        by_id = {r["candidate_id"]: r for r in rounds}
        job = trajectory.get("job_id", "")

        first = [r for r in rounds if r["skill"] == GENERATE]
        best_first = max(
            (r for r in first if r["accepted"]), key=lambda r: r["speedup_vs_eager"], default=None
        )
        yield Example(
            skill=GENERATE,
            problem=name,
            problem_hash=phash,
            reference=reference,
            target=target,
            kernel_policy=policy,
            prompt=self.coder.generate_messages(reference, plan, target=target),
            source=f"trajectory:{job}",
            completion=_answer(best_first) if best_first is not None else None,
        )
        for child in rounds:
            parent = by_id.get(child.get("parent_id", ""))
            if child["skill"] != OPTIMIZE or parent is None:
                continue
            previous = _candidate(parent["candidate"])
            verdict = _verdict(parent["verdict"])
            better = child["accepted"] and (
                not parent["accepted"] or child["speedup_vs_eager"] > parent["speedup_vs_eager"]
            )
            yield Example(
                skill=OPTIMIZE,
                problem=name,
                problem_hash=phash,
                reference=reference,
                target=target,
                kernel_policy=policy,
                prompt=self.coder.optimize_messages(reference, plan, previous, verdict, target=target),
                source=f"trajectory:{job}/{parent['candidate_id']}",
                completion=_answer(child) if better else None,
                previous_speedup=float(parent["speedup_vs_eager"]) if parent["accepted"] else 0.0,
                feedback=feedback_text(verdict),
            )

    def from_trajectories(self, trajectories: Iterable[dict[str, Any]]) -> Iterator[Example]:
        """Examples of many jobs; an optimize prompt seen in several jobs is kept once."""
        seen: set[str] = set()
        for trajectory in trajectories:
            for example in self.from_trajectory(trajectory):
                key = sha256_hex(example.skill, json.dumps(example.prompt), example.completion or "")
                if key not in seen:
                    seen.add(key)
                    yield example


def _plan(data: dict[str, Any]) -> plan_pb2.Plan:
    return json_format.ParseDict(data, plan_pb2.Plan(), ignore_unknown_fields=True)


def _candidate(data: dict[str, Any]) -> code_pb2.Candidate:
    return json_format.ParseDict(data, code_pb2.Candidate(), ignore_unknown_fields=True)


def _verdict(data: dict[str, Any]) -> verify_pb2.Verdict:
    return json_format.ParseDict(data, verify_pb2.Verdict(), ignore_unknown_fields=True)


def _answer(round_: dict[str, Any]) -> str:
    return answer_text(_candidate(round_["candidate"]))


# ---- reading trajectories --------------------------------------------------------------------------


def read_trajectories(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """trajectory.json files, or folders searched for them (an `optimize --out` folder, a bench folder)."""
    for path in paths:
        files = sorted(Path(path).rglob("trajectory.json")) if Path(path).is_dir() else [Path(path)]
        for file in files:
            yield json.loads(file.read_text())


def store_trajectories(store: ArtifactStore, prefix: str = "tenants/") -> Iterator[dict[str, Any]]:
    """Every trajectory the artifact store holds under `prefix` (all tenants by default)."""
    for key in store.list(prefix):
        if key.endswith("/trajectory.json"):
            yield json.loads(store.get(key))


# ---- split and output ------------------------------------------------------------------------------


@dataclass
class Split:
    train: list[Example]
    held_out: list[Example]


def split_out(examples: Iterable[Example], evaluation: Sequence[SuiteProblem | str]) -> Split:
    """Keeps every problem of the evaluation suite out of training, matched by problem hash (a renamed
    or reformatted copy is still caught) and by name. `evaluation`: suite problems or reference sources."""
    hashes = {p.hash if isinstance(p, SuiteProblem) else problem_hash(p) for p in evaluation}
    names = {p.name for p in evaluation if isinstance(p, SuiteProblem)}
    train: list[Example] = []
    held: list[Example] = []
    for example in examples:
        (held if example.problem_hash in hashes or example.problem in names else train).append(example)
    return Split(train, held)


def write_jsonl(examples: Iterable[Example], path: Path) -> int:
    """One chat-format row per line; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w") as handle:
        for example in examples:
            handle.write(json.dumps(example.row()) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def to_dataset(examples: Iterable[Example | dict[str, Any]]) -> Any:
    """A `datasets.Dataset` of the rows (needs the `training` extra)."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "to_dataset needs the 'datasets' package: pip install 'stitchcuda[training]'"
        ) from exc
    rows = [e.row() if isinstance(e, Example) else e for e in examples]
    return datasets.Dataset.from_list(rows)
