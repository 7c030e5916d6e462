"""The LLM backend against a scripted OpenAI-compatible HTTP server started by the test: what is sent,
what is parsed, and how timeouts, 5xx answers and servers without structured output are handled."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.service import CoderService
from stitchcuda.coder.settings import CoderSettings
from stitchcuda.shared.errors import Unavailable
from tests.integration.llm_server import Server, Step, serving

pytestmark = pytest.mark.integration

REFERENCE = (Path(__file__).resolve().parents[2] / "benchmarks" / "problems" / "03_row_sum.py").read_text()

MODEL_NEW = (
    "import torch\nimport rowsum_ext as ext\n\n\nclass ModelNew(torch.nn.Module):\n"
    "    def __init__(self, dim):\n        super().__init__()\n        self.dim = dim\n\n"
    "    def forward(self, x):\n        return ext.forward(x)\n"
)
CPP = (
    "#include <torch/extension.h>\n#include <ATen/Parallel.h>\n"
    "torch::Tensor forward(torch::Tensor x) { return x; }\n"
    'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }\n'
)
FENCED = f"Row sums in one parallel kernel.\n\n```python model_new.py\n{MODEL_NEW}```\n\n```cpp forward.cpp\n{CPP}```\n"
STRUCTURED = json.dumps(
    {
        "rationale": "structured answer",
        "files": [{"path": "model_new.py", "content": MODEL_NEW}, {"path": "forward.cpp", "content": CPP}],
        "cflags": ["-O2", "-fopenmp"],
    }
)


@pytest.fixture
def server() -> Iterator[Server]:
    with serving(FENCED) as s:
        yield s
    s.httpd.server_close()


def coder(server: Server, **overrides: Any) -> CoderService:
    settings = CoderSettings(
        base_url=server.url,
        model="base-model",
        lora_adapter="stitch-lora",
        api_key="sk-local-test",
        temperature=0.3,
        max_tokens=4096,
        retries=2,
        backoff_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=2.0,
        connect_timeout_s=1.0,
        rag_backend="bm25",
        **overrides,
    )
    return CoderService(settings)


def plan() -> plan_pb2.Plan:
    p = plan_pb2.Plan(problem_name="03_row_sum", device=jobs_pb2.DEVICE_CPU, dtype="float32")
    st = p.subtasks.add(id="sum", kind=plan_pb2.SUBTASK_KIND_REDUCTION, bound="memory")
    st.ops.add(name="sum_1", target="sum")
    return p


def test_generate_sends_the_configured_request_and_parses_each_choice(server: Server) -> None:
    server.steps.append(Step(texts=[FENCED, "I am not sure what to write here."]))
    cands = coder(server).generate(REFERENCE, plan(), samples=2, backend="llm", job_id="job-9")
    good, bad = cands
    assert not good.failure and good.build.extension_name == "rowsum_ext" and good.coder == "llm:stitch-lora"
    assert list(good.build.sources) == ["forward.cpp"] and good.build.backend == "cpu"
    assert "no fenced code blocks" in bad.failure
    assert good.usage.prompt_tokens == 1200 and good.usage.completion_tokens == 300
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["auth"] == "Bearer sk-local-test"
    assert req["model"] == "stitch-lora" and req["n"] == 2
    assert req["temperature"] == 0.3 and req["max_tokens"] == 4096
    assert req["response_format"]["type"] == "json_schema"
    system, user = req["messages"]
    assert "import <extension_name> as ext" in system["content"]
    assert "torch.sum(x, dim=self.dim)" in user["content"]
    assert "- sum [reduction] sum_1=sum (memory-bound)" in user["content"]
    assert "## Notes that may help" in user["content"]


def test_structured_answers_are_parsed(server: Server) -> None:
    server.steps.append(Step(texts=[STRUCTURED]))
    (cand,) = coder(server).generate(REFERENCE, plan(), backend="llm")
    assert cand.rationale == "structured answer" and list(cand.build.cflags) == ["-O2", "-fopenmp"]
    assert cand.variant["form"] == "json"


def test_5xx_answers_are_retried_with_backoff(server: Server) -> None:
    server.steps += [Step(status=500), Step(status=503), Step(texts=[FENCED])]
    (cand,) = coder(server).generate(REFERENCE, plan(), backend="llm")
    assert not cand.failure
    assert len(server.requests) == 3


def test_a_timed_out_request_is_retried(server: Server) -> None:
    server.steps += [Step(texts=[FENCED], delay_s=3.0), Step(texts=[FENCED])]
    started = time.monotonic()
    (cand,) = coder(server).generate(REFERENCE, plan(), backend="llm")
    assert not cand.failure
    assert len(server.requests) == 2
    assert time.monotonic() - started < 10


def test_persistent_failure_raises_unavailable(server: Server) -> None:
    server.steps += [Step(status=502)] * 3
    with pytest.raises(Unavailable, match="after 3 attempts"):
        coder(server).generate(REFERENCE, plan(), backend="llm")
    assert len(server.requests) == 3


def test_a_bad_answer_is_not_retried(server: Server) -> None:
    server.steps.append(Step(texts=["```python model_new.py\nimport torch\n```"]))
    (cand,) = coder(server).generate(REFERENCE, plan(), backend="llm")
    assert "ModelNew" in cand.failure or "import" in cand.failure
    assert len(server.requests) == 1


def test_server_without_structured_output_falls_back_to_text_and_remembers(server: Server) -> None:
    server.steps += [Step(texts=[FENCED], reject_format=True), Step(texts=[FENCED], reject_format=True)]
    svc = coder(server)
    (first,) = svc.generate(REFERENCE, plan(), backend="llm")
    (second,) = svc.generate(REFERENCE, plan(), backend="llm")
    assert not first.failure and not second.failure
    formats = ["response_format" in r for r in server.requests]
    assert formats == [True, False, False]


def test_fewer_choices_than_asked_are_topped_up_in_parallel(server: Server) -> None:
    # The server ignores n and answers one choice per request.
    server.steps += [Step(texts=[FENCED])] + [Step(texts=[STRUCTURED]) for _ in range(2)]
    cands = coder(server).generate(REFERENCE, plan(), samples=3, backend="llm")
    assert len(cands) == 3 and not any(c.failure for c in cands)
    assert [r["n"] for r in server.requests] == [3, 1, 1]


def test_optimize_prompt_carries_the_verdict(server: Server) -> None:
    previous = code_pb2.Candidate(candidate_id="job-r0-0-abc", coder="llm:stitch-lora")
    previous.files.add(path="model_new.py", content=MODEL_NEW)
    previous.files.add(path="forward.cpp", content=CPP + "// previous version marker\n")
    verdict = verify_pb2.Verdict(
        accepted=False, compiled=True, correct=False, reason="mismatch on trial refill"
    )
    verdict.feedback = "Rows 3 and 7 differ: the kernel reads only the first 512 columns."
    server.steps.append(Step(texts=[FENCED]))
    (cand,) = coder(server, structured_output="text").optimize(
        REFERENCE, plan(), previous, verdict, backend="llm", round_=1
    )
    assert cand.parent_id == "job-r0-0-abc" and cand.round == 1
    (req,) = server.requests
    assert "response_format" not in req
    user = req["messages"][1]["content"]
    assert "// previous version marker" in user
    assert "reads only the first 512 columns" in user
    assert "rejected (mismatch on trial refill)" in user
