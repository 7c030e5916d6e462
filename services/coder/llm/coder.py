"""The LLM backend of the two skills: prompts with retrieved notes, n samples, answers parsed into
candidates (a bad answer becomes a candidate with `failure` set, never an exception)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from stitchcuda.api.v1 import code_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.candidates import candidate_id, failed
from stitchcuda.coder.llm.client import Completion, LLMClient
from stitchcuda.coder.llm.parse import CANDIDATE_SCHEMA, ParseError, parse_answer
from stitchcuda.coder.llm.prompts import Doc, render_generate, render_optimize, render_system
from stitchcuda.coder.rag.retriever import Retriever, query_for
from stitchcuda.shared.candidate import ENTRY
from stitchcuda.shared.policy import KernelPolicy

log = logging.getLogger("stitchcuda.coder.llm")


class LLMCoder:
    def __init__(
        self,
        client: LLMClient,
        *,
        retriever: Retriever | None = None,
        top_k: int = 4,
        structured: bool = True,
        char_budget: int = 60_000,
        policy: KernelPolicy | None = None,
    ) -> None:
        self.client = client
        self.policy = policy or KernelPolicy()
        self.retriever = retriever
        self.top_k = top_k
        self.structured = structured
        self.char_budget = char_budget

    def docs(self, plan: plan_pb2.Plan | None, verdict: verify_pb2.Verdict | None, target: str) -> list[Doc]:
        out: list[Doc] = []
        if verdict is not None:
            out += [Doc(f"Verifier note {i + 1}", text) for i, text in enumerate(verdict.docs[: self.top_k])]
        if self.retriever is not None and self.top_k > 0:
            for hit in self.retriever.search(query_for(plan, verdict, target=target), self.top_k):
                out.append(Doc(hit.doc.title, hit.doc.text))
        return out

    def generate(
        self,
        reference: str,
        plan: plan_pb2.Plan | None,
        *,
        target: str,
        samples: int,
        job_id: str = "",
        round_: int = 0,
    ) -> list[code_pb2.Candidate]:
        messages = self.generate_messages(reference, plan, target=target)
        return self._sample(messages, target, samples, job_id, round_, parent=None, skill="generate")

    def generate_messages(
        self, reference: str, plan: plan_pb2.Plan | None, *, target: str
    ) -> list[dict[str, str]]:
        """The chat messages of a generate request: what the model sees, here and in RL training."""
        docs = self.docs(plan, None, target)
        user = render_generate(
            reference=reference,
            plan=plan,
            target=target,
            docs=docs,
            problem=plan.problem_name if plan else "",
        )
        return self._messages(user, plan, target)

    def optimize(
        self,
        reference: str,
        plan: plan_pb2.Plan | None,
        previous: code_pb2.Candidate,
        verdict: verify_pb2.Verdict,
        *,
        target: str,
        samples: int,
        job_id: str = "",
        round_: int = 0,
    ) -> list[code_pb2.Candidate]:
        messages = self.optimize_messages(reference, plan, previous, verdict, target=target)
        return self._sample(messages, target, samples, job_id, round_, parent=previous, skill="optimize")

    def optimize_messages(
        self,
        reference: str,
        plan: plan_pb2.Plan | None,
        previous: code_pb2.Candidate,
        verdict: verify_pb2.Verdict,
        *,
        target: str,
    ) -> list[dict[str, str]]:
        """The chat messages of an optimize request: what the model sees, here and in RL training."""
        docs = self.docs(plan, verdict, target)
        user = render_optimize(
            reference=reference,
            plan=plan,
            target=target,
            previous=previous,
            verdict=verdict,
            docs=docs,
            problem=plan.problem_name if plan else "",
            file_budget=max(self.char_budget // 2, 4000),
        )
        return self._messages(user, plan, target)

    def _messages(self, user: str, plan: plan_pb2.Plan | None, target: str) -> list[dict[str, str]]:
        if len(user) > self.char_budget:
            user = user[: self.char_budget] + "\n\n(prompt truncated to the configured budget)"
        dtype = plan.dtype if plan is not None and plan.dtype else "float32"
        system = render_system(
            target=target, dtype=dtype, structured=self.structured, library_policy=self.policy.accepts_library
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _sample(
        self,
        messages: list[dict[str, str]],
        target: str,
        samples: int,
        job_id: str,
        round_: int,
        *,
        parent: code_pb2.Candidate | None,
        skill: str,
    ) -> list[code_pb2.Candidate]:
        completions = self.client.complete(
            messages, n=samples, json_schema=CANDIDATE_SCHEMA if self.structured else None
        )
        return [
            self._candidate(c, i, target, job_id, round_, parent, skill) for i, c in enumerate(completions)
        ]

    def _candidate(
        self,
        completion: Completion,
        index: int,
        target: str,
        job_id: str,
        round_: int,
        parent: code_pb2.Candidate | None,
        skill: str,
    ) -> code_pb2.Candidate:
        coder = f"llm:{self.client.name}"
        usage = code_pb2.TokenUsage(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            requests=1 if completion.prompt_tokens else 0,
        )
        try:
            parsed = parse_answer(completion.text, backend=target)
        except ParseError as exc:
            reason = str(exc)
            if completion.finish_reason == "length":
                reason += " (the answer was cut off at max_tokens)"
            log.info("unparseable %s answer %d: %s", skill, index, reason)
            cand = failed(reason, coder=coder, job_id=job_id, round_=round_, index=index)
            cand.usage.CopyFrom(usage)
            if parent is not None:
                cand.parent_id = parent.candidate_id
            return cand
        cand = code_pb2.Candidate(
            schema_version=1,
            job_id=job_id,
            round=round_,
            files=[code_pb2.SourceFile(path=p, content=c) for p, c in parsed.files.items()],
            build=parsed.build,
            entry=ENTRY,
            coder=coder,
            rationale=parsed.rationale,
            usage=usage,
            parent_id=parent.candidate_id if parent is not None else "",
        )
        cand.variant["skill"] = skill
        cand.variant["form"] = parsed.form
        cand.candidate_id = candidate_id(cand, job_id, round_, index)
        return cand


def total_usage(candidates: Sequence[code_pb2.Candidate]) -> code_pb2.TokenUsage:
    out = code_pb2.TokenUsage()
    for c in candidates:
        out.prompt_tokens += c.usage.prompt_tokens
        out.completion_tokens += c.usage.completion_tokens
        out.requests += c.usage.requests
    return out
