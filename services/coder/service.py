"""CoderService: the generate and optimize skills over the built-in synthesizer or the LLM backend.

Transport-free: the Celery task, the embedded loop and the tests all call these two methods. A program
that cannot be produced (an unsupported op, an unparseable answer) comes back as a candidate with
`failure` set; only an unreachable LLM endpoint raises (Unavailable, so the task is retried).
"""

from __future__ import annotations

import logging

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.candidates import candidate_id, failed
from stitchcuda.coder.llm.client import LLMClient, OpenAIClient
from stitchcuda.coder.llm.coder import LLMCoder
from stitchcuda.coder.rag.retriever import Retriever, make_retriever
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate, within_policy
from stitchcuda.coder.synth.trace import TraceError
from stitchcuda.coder.synth.variants import Variant, next_variants, tried_signatures
from stitchcuda.shared import devices
from stitchcuda.shared.errors import InvalidRequest
from stitchcuda.shared.isolation import Isolation
from stitchcuda.shared.policy import KernelPolicy

log = logging.getLogger("stitchcuda.coder")
BACKENDS = ("builtin", "llm")
# Extra variants for samples beyond the first in a builtin generate round (most promising first).
GENERATE_ALTERNATIVES: dict[str, list[dict[str, str]]] = {
    "cuda": [
        {"block": "512"},
        {"vec": "1"},
        {"row_block": "1024"},
        {"gemm_bias": "epilogue"},
        {"fusion": "none"},
    ],
    "cpu": [{"grain": "131072"}, {"grain": "8192"}, {"gemm_bias": "epilogue"}, {"fusion": "none"}],
}


def target_device(plan: plan_pb2.Plan | None) -> str:
    """cpu | cuda from plan.device (auto resolves to the GPU when one is visible)."""
    device = plan.device if plan is not None else jobs_pb2.DEVICE_UNSPECIFIED
    if device == jobs_pb2.DEVICE_CUDA:
        return "cuda"
    if device == jobs_pb2.DEVICE_CPU:
        return "cpu"
    return devices.resolve("auto")


class CoderService:
    def __init__(
        self,
        settings: CoderSettings | None = None,
        *,
        llm: LLMClient | None = None,
        retriever: Retriever | None = None,
        synthesizer: Synthesizer | None = None,
    ) -> None:
        self.settings = settings or CoderSettings()
        self._llm = llm
        self._retriever = retriever
        self.synthesizer = synthesizer or Synthesizer(
            trace_timeout_s=self.settings.trace_timeout_s,
            isolation=Isolation(mode=self.settings.trace_sandbox, memory_mb=self.settings.trace_memory_mb),
        )
        self.default_variant = Variant.from_map(_parse_variant(self.settings.synth_variant))

    # ---- ports ---------------------------------------------------------------------------------------
    def llm(self) -> LLMClient:
        if self._llm is None:
            s = self.settings
            self._llm = OpenAIClient(
                base_url=s.base_url,
                model=s.served_model(),
                api_key=s.api_key.get_secret_value(),
                temperature=s.temperature,
                top_p=s.top_p,
                max_tokens=s.max_tokens,
                connect_timeout_s=s.connect_timeout_s,
                request_timeout_s=s.request_timeout_s,
                retries=s.retries,
                backoff_s=s.backoff_s,
                backoff_max_s=s.backoff_max_s,
                use_n=s.use_n,
                max_parallel=s.max_parallel,
                structured_output=s.structured_output,
            )
        return self._llm

    def retriever(self) -> Retriever | None:
        if not self.settings.rag_enabled:
            return None
        if self._retriever is None:
            self._retriever = make_retriever(self.settings.rag_backend)
        return self._retriever

    def llm_coder(self, policy: KernelPolicy | None = None) -> LLMCoder:
        return LLMCoder(
            self.llm(),
            retriever=self.retriever(),
            top_k=self.settings.rag_top_k,
            structured=self.settings.structured_output != "text",
            char_budget=self.settings.prompt_char_budget,
            policy=policy,
        )

    # ---- skills ----------------------------------------------------------------------------------------
    def generate(
        self,
        reference_source: str,
        plan: plan_pb2.Plan,
        *,
        samples: int = 1,
        backend: str = "builtin",
        job_id: str = "",
        round_: int = 0,
        policy: KernelPolicy | None = None,
        start: dict[str, str] | None = None,
        start_reason: str = "",
    ) -> list[code_pb2.Candidate]:
        """The first round's candidates; the built-in Coder's first is `start` where given (the best variant
        an earlier job of this problem verified, shared/tuned.py), its default variant otherwise."""
        backend = _check_backend(backend)
        samples = max(1, samples)
        target = target_device(plan)
        policy = policy or KernelPolicy()
        if backend == "llm":
            return self.llm_coder(policy).generate(
                reference_source, plan, target=target, samples=samples, job_id=job_id, round_=round_
            )
        first = within_policy(Variant.from_map(start) if start else self.default_variant, policy)
        variants = [(first, (start_reason or "tuned variant") if start else "default variant")]
        for change in GENERATE_ALTERNATIVES[target]:
            if len(variants) >= samples:
                break
            v = within_policy(first.with_(**change), policy)
            if all(v != w for w, _ in variants):
                variants.append((v, "alternative: " + ", ".join(f"{k}={x}" for k, x in change.items())))
        return [
            self._synthesize(
                reference_source, plan, v, why, target, job_id, round_, i, tried=[], policy=policy
            )
            for i, (v, why) in enumerate(variants)
        ]

    def optimize(
        self,
        reference_source: str,
        plan: plan_pb2.Plan,
        previous: code_pb2.Candidate,
        verdict: verify_pb2.Verdict,
        *,
        samples: int = 1,
        backend: str = "builtin",
        job_id: str = "",
        round_: int = 0,
        policy: KernelPolicy | None = None,
    ) -> list[code_pb2.Candidate]:
        backend = _check_backend(backend)
        samples = max(1, samples)
        target = target_device(plan)
        policy = policy or KernelPolicy()
        if backend == "llm":
            return self.llm_coder(policy).optimize(
                reference_source,
                plan,
                previous,
                verdict,
                target=target,
                samples=samples,
                job_id=job_id,
                round_=round_,
            )
        if previous.coder != "builtin" or previous.failure:
            # Nothing of ours to tune: start from the synthesizer's default program.
            return self.generate(
                reference_source,
                plan,
                samples=samples,
                backend="builtin",
                job_id=job_id,
                round_=round_,
                policy=policy,
            )
        tried = [*tried_signatures(previous.variant), Variant.from_map(previous.variant).signature()]
        picks = [
            (v, why)
            for v, why in next_variants(previous.variant, verdict, cuda=target == "cuda", count=samples + 2)
            if within_policy(v, policy) == v
        ][:samples]
        if not picks:
            cand = failed(
                "the built-in synthesizer has no untried variant left for this feedback",
                coder="builtin",
                job_id=job_id,
                round_=round_,
                index=0,
            )
            cand.parent_id = previous.candidate_id
            return [cand]
        out = []
        for i, (variant, why) in enumerate(picks):
            cand = self._synthesize(
                reference_source, plan, variant, why, target, job_id, round_, i, tried=tried, policy=policy
            )
            cand.parent_id = previous.candidate_id
            out.append(cand)
        return out

    def _synthesize(
        self,
        reference_source: str,
        plan: plan_pb2.Plan | None,
        variant: Variant,
        why: str,
        target: str,
        job_id: str,
        round_: int,
        index: int,
        *,
        tried: list[str],
        policy: KernelPolicy,
    ) -> code_pb2.Candidate:
        try:
            synthesis = self.synthesizer.synthesize(
                reference_source, plan, variant=variant, device=target, policy=policy
            )
        except (Unsupported, TraceError, InvalidRequest) as exc:
            log.info("builtin synthesizer: %s", exc)
            cand = failed(
                f"builtin synthesizer: {exc}", coder="builtin", job_id=job_id, round_=round_, index=index
            )
            cand.variant.update(variant.as_map())
            return cand
        except Exception as exc:  # a defect in the synthesizer must not take the loop down with it
            log.exception("builtin synthesizer failed")
            cand = failed(
                f"builtin synthesizer internal error: {type(exc).__name__}: {exc}",
                coder="builtin",
                job_id=job_id,
                round_=round_,
                index=index,
            )
            cand.variant.update(variant.as_map())
            return cand
        cand = to_candidate(synthesis)
        cand.job_id = job_id
        cand.round = round_
        cand.rationale = f"{why}. {cand.rationale}"
        if tried:
            cand.variant["tried"] = ";".join(dict.fromkeys(tried))
        cand.candidate_id = candidate_id(cand, job_id, round_, index)
        return cand


def _check_backend(backend: str) -> str:
    backend = backend or "builtin"
    if backend not in BACKENDS:
        raise InvalidRequest(f"unknown coder backend {backend!r}: choose builtin or llm")
    return backend


def _parse_variant(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
    return out
