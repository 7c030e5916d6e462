"""CoderService: both skills over the built-in synthesizer and over a scripted LLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.llm.client import Completion, ScriptedClient
from stitchcuda.coder.rag.retriever import make_retriever
from stitchcuda.coder.service import CoderService
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.shared.candidate import validate
from stitchcuda.shared.errors import InvalidRequest, Unavailable
from stitchcuda.shared.policy import KernelPolicy

PROBLEMS = Path(__file__).resolve().parents[3] / "benchmarks" / "problems"
REFERENCE = (PROBLEMS / "01_elementwise_chain.py").read_text()

GOOD_ANSWER = """Fused the chain into one kernel.

```python model_new.py
import torch
import llm_ext as ext


class ModelNew(torch.nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return ext.forward(x, self.scale, self.shift)
```

```cpp forward.cpp
#include <torch/extension.h>
torch::Tensor forward(torch::Tensor x, double scale, double shift) { return x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
```
"""


def cpu_plan() -> plan_pb2.Plan:
    plan = plan_pb2.Plan(problem_name="01_elementwise_chain", device=jobs_pb2.DEVICE_CPU, dtype="float32")
    st = plan.subtasks.add(id="s0", kind=plan_pb2.SUBTASK_KIND_ELEMENTWISE, bound="memory")
    st.ops.add(name="gelu", target="gelu")
    return plan


@pytest.fixture(scope="module")
def synthesizer() -> Synthesizer:
    return Synthesizer(in_process=True)


def service(synthesizer: Synthesizer, llm: ScriptedClient | None = None) -> CoderService:
    settings = CoderSettings(rag_backend="bm25", rag_top_k=2)
    return CoderService(settings, llm=llm, retriever=make_retriever("bm25"), synthesizer=synthesizer)


def test_builtin_generate_gives_distinct_valid_variants(synthesizer: Synthesizer) -> None:
    cands = service(synthesizer).generate(REFERENCE, cpu_plan(), samples=3, job_id="job1", round_=0)
    assert len(cands) == 3
    for c in cands:
        assert not c.failure
        validate(c)
        assert c.coder == "builtin" and c.job_id == "job1" and c.build.backend == "cpu"
    assert len({c.candidate_id for c in cands}) == 3
    assert len({c.variant["grain"] for c in cands}) == 3
    assert cands[0].rationale.startswith("default variant")
    # Deterministic: the same request gives the same ids (redelivered tasks write the same artifacts).
    again = service(synthesizer).generate(REFERENCE, cpu_plan(), samples=1, job_id="job1", round_=0)
    assert again[0].candidate_id == cands[0].candidate_id


def test_cuda_plan_gives_a_cuda_program(synthesizer: Synthesizer) -> None:
    plan = cpu_plan()
    plan.device = jobs_pb2.DEVICE_CUDA
    (cand,) = service(synthesizer).generate(REFERENCE, plan)
    assert cand.build.backend == "cuda" and "kernels.cu" in [f.path for f in cand.files]


def test_builtin_optimize_reacts_to_the_verdict(synthesizer: Synthesizer) -> None:
    ref = (PROBLEMS / "10_rmsnorm.py").read_text()
    svc = service(synthesizer)
    (first,) = svc.generate(ref, cpu_plan(), job_id="j", round_=0)
    assert set(first.variant["features"].split(",")) == {"row"}
    verdict = verify_pb2.Verdict(accepted=False, compiled=True, correct=False, reason="mismatch")
    verdict.correctness.max_rel_l2 = 2e-5
    verdict.correctness.tolerance = 1e-5
    cands = svc.optimize(ref, cpu_plan(), first, verdict, samples=2, job_id="j", round_=1)
    assert [c.variant["acc"] for c in cands][:1] == ["double"]
    assert all(c.parent_id == first.candidate_id and c.round == 1 for c in cands)
    # The strict kernel policy (the default) makes every GEMM/convolution our own kernel.
    assert cands[0].variant["tried"] == "gemm=custom"
    assert "close miss" in cands[0].rationale
    # The next round proposes only untried variants, and remembers everything tried so far.
    accepted = verify_pb2.Verdict(accepted=True, compiled=True, correct=True)
    nxt = svc.optimize(ref, cpu_plan(), cands[0], accepted, samples=3, job_id="j", round_=2)
    assert len(nxt) == 3
    assert {c.variant["tried"] for c in nxt} == {"gemm=custom;gemm=custom,acc=double"}
    assert all(c.variant["acc"] == "double" or c.variant["grain"] == "32768" for c in nxt)
    assert len({c.candidate_id for c in nxt}) == 3


def test_pointwise_program_is_not_offered_reduction_knobs(synthesizer: Synthesizer) -> None:
    svc = service(synthesizer)
    (first,) = svc.generate(REFERENCE, cpu_plan())
    verdict = verify_pb2.Verdict(accepted=True, compiled=True, correct=True)
    cands = svc.optimize(REFERENCE, cpu_plan(), first, verdict, samples=5)
    changed = {k for c in cands for k, v in c.variant.items() if k in first.variant and first.variant[k] != v}
    assert changed <= {"grain", "tried"}, changed


def test_strict_policy_writes_own_gemm_kernels_from_the_start(synthesizer: Synthesizer) -> None:
    ref = (PROBLEMS / "06_gemm_bias_relu.py").read_text()
    (first,) = service(synthesizer).generate(ref, cpu_plan())
    src = next(f.content for f in first.files if f.path == "forward.cpp")
    assert first.variant["gemm"] == "custom" and not first.build.libraries
    assert "at::addmm(" not in src and "stitch_gemm_launch" in src


def test_library_policy_declares_the_library_and_rejection_switches_to_custom(
    synthesizer: Synthesizer,
) -> None:
    ref = (PROBLEMS / "06_gemm_bias_relu.py").read_text()
    svc = service(synthesizer)
    library = KernelPolicy("library")
    (first,) = svc.generate(ref, cpu_plan(), policy=library)
    assert first.variant["gemm"] == "library" and list(first.build.libraries) == ["cublas"]
    verdict = verify_pb2.Verdict(
        accepted=False, compiled=True, correct=True, reason="D11.torch-op: ATen compute"
    )
    verdict.findings.add(rule="D11.torch-op", severity=verify_pb2.SEVERITY_REJECT, detail="at::addmm(")
    (cand, *_) = svc.optimize(ref, cpu_plan(), first, verdict, policy=library)
    assert cand.variant["gemm"] == "custom" and not cand.failure
    src = next(f.content for f in cand.files if f.path == "forward.cpp")
    assert "at::addmm(" not in src and "stitch_gemm_launch" in src


def test_unsupported_reference_is_a_failed_candidate(synthesizer: Synthesizer) -> None:
    ref = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.sort(x, dim=1).values\n"
        "def get_inputs():\n    return [torch.randn(4, 8)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    (cand,) = service(synthesizer).generate(ref, cpu_plan())
    assert "sort" in cand.failure and not cand.files and cand.coder == "builtin"


def test_llm_generate_parses_answers_and_records_failures(synthesizer: Synthesizer) -> None:
    llm = ScriptedClient(
        [
            GOOD_ANSWER,
            "Sorry, I cannot do that.",
            Completion(text="```python\nimport x\n", finish_reason="length"),
        ]
    )
    cands = service(synthesizer, llm).generate(REFERENCE, cpu_plan(), samples=3, backend="llm", job_id="j")
    good, refused, cut = cands
    assert not good.failure and good.build.extension_name == "llm_ext" and good.coder == "llm:scripted"
    assert good.rationale.startswith("Fused the chain")
    validate(good)
    assert "no fenced code blocks" in refused.failure and not refused.files
    assert "cut off at max_tokens" in cut.failure
    assert good.usage.prompt_tokens > 0 and good.usage.completion_tokens > 0
    # The prompt carried the reference, the plan and retrieved notes.
    (request,) = llm.requests
    system, user = request.messages
    assert system["role"] == "system" and "import <extension_name> as ext" in system["content"]
    assert "return y * x" in user["content"] and "- s0 [elementwise] gelu=gelu" in user["content"]
    assert "## Notes that may help" in user["content"]
    assert request.n == 3


def test_llm_optimize_sends_feedback_and_the_previous_program(synthesizer: Synthesizer) -> None:
    llm = ScriptedClient([GOOD_ANSWER])
    previous = code_pb2.Candidate(candidate_id="prev-1", coder="llm:scripted")
    previous.files.add(path="model_new.py", content="import old_ext as ext\n")
    previous.files.add(path="forward.cpp", content="// old kernel body\n")
    verdict = verify_pb2.Verdict(accepted=False, compiled=False, reason="build failed")
    verdict.build.error = "forward.cpp:3: error: 'foo' was not declared in this scope"
    verdict.docs.append("Read the first error line.")
    (cand,) = service(synthesizer, llm).optimize(
        REFERENCE, cpu_plan(), previous, verdict, backend="llm", round_=2
    )
    assert cand.parent_id == "prev-1" and cand.round == 2 and not cand.failure
    user = llm.requests[0].messages[1]["content"]
    assert "// old kernel body" in user and "'foo' was not declared" in user
    assert "### Verifier note 1\nRead the first error line." in user


def test_unreachable_llm_raises_unavailable(synthesizer: Synthesizer) -> None:
    llm = ScriptedClient([Unavailable("connection refused")])
    with pytest.raises(Unavailable):
        service(synthesizer, llm).generate(REFERENCE, cpu_plan(), backend="llm")


def test_unknown_backend_is_an_invalid_request(synthesizer: Synthesizer) -> None:
    with pytest.raises(InvalidRequest, match="builtin or llm"):
        service(synthesizer).generate(REFERENCE, cpu_plan(), backend="gpt")


def test_settings_read_coder_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STITCH_CODER_LORA_ADAPTER", "coder-rl-step900")
    monkeypatch.setenv("STITCH_CODER_TEMPERATURE", "0.2")
    monkeypatch.setenv("STITCH_CODER_API_KEY", "sk-test")
    s = CoderSettings()
    assert s.served_model() == "coder-rl-step900" and s.temperature == 0.2
    assert s.api_key.get_secret_value() == "sk-test" and "sk-test" not in repr(s)
    with pytest.raises(ValueError):
        CoderSettings(backoff_s=5, backoff_max_s=1)
