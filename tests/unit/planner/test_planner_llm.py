"""LLM refinement through a real OpenAI-compatible HTTP exchange (a scripted server), valid and invalid."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from planner_support import fast_settings, source

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner import refine
from stitchcuda.planner.cost import annotate
from stitchcuda.planner.graph import Graph
from stitchcuda.planner.llm import OpenAICompatibleLLM, ScriptedLLM
from stitchcuda.planner.runner import ReferenceRunner
from stitchcuda.planner.service import PlannerService

K = plan_pb2.SubtaskKind

SPLIT_ATTENTION = {
    "subtasks": [
        {"ops": ["matmul", "truediv"], "kind": "gemm", "anchor": "matmul", "library_call": True},
        {"ops": ["softmax"], "kind": "softmax", "notes": "row softmax, one warp per row"},
        {"ops": ["matmul_1"], "kind": "gemm", "library_call": True},
    ],
    "orchestration": {"cuda_graphs": False, "init_time_transforms": [], "notes": ["scores fit in L2"]},
    "rationale": "cuBLAS batched GEMMs beat a hand-written flash kernel at S=64",
}


class ChatServer:
    """Answers /v1/chat/completions with canned (status, content) pairs, in order; records each request."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "planner-7b", "object": "model", "created": 0,
                                                              "owned_by": "test"}]})  # fmt: skip

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                server.requests.append(json.loads(self.rfile.read(length)))
                status, content = server.answers.pop(0)
                if status != 200:
                    self._send(status, {"error": {"message": content, "type": "server_error"}})
                    return
                self._send(200, {
                    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "planner-7b",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                })  # fmt: skip

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def service_for(server: ChatServer) -> PlannerService:
    settings = fast_settings(llm_enabled=True, llm_base_url=server.url, llm_model="", llm_max_retries=0)
    return PlannerService(settings)


@pytest.fixture(scope="module")
def attention_graph() -> Graph:
    outcome = ReferenceRunner(fast_settings()).plan(source("12"), device="cpu", run=False, profile=False)
    assert outcome.analysis is not None and outcome.analysis.ok
    graph = Graph.from_analysis(outcome.analysis)
    annotate(graph)
    return graph


def test_a_valid_answer_refines_the_fusion_boundaries() -> None:
    with ChatServer([(200, json.dumps(SPLIT_ATTENTION))]) as server:
        plan = service_for(server).plan(source("12"), problem_name="12_attention", profile=False)
    assert plan.planner == "deterministic+llm (planner-7b)"
    assert [st.kind for st in plan.subtasks] == [
        K.SUBTASK_KIND_GEMM,
        K.SUBTASK_KIND_SOFTMAX,
        K.SUBTASK_KIND_GEMM,
    ]
    assert [st.library_call for st in plan.subtasks] == [True, False, True]
    assert plan.subtasks[1].depends_on == ["st1"] and plan.subtasks[2].depends_on == ["st2"]
    assert "llm: row softmax, one warp per row" in plan.subtasks[1].notes
    assert (
        "llm: rationale: cuBLAS batched GEMMs beat a hand-written flash kernel at S=64"
        in plan.orchestration.notes
    )
    assert sum(st.flops for st in plan.subtasks) == plan.total_flops
    (request,) = server.requests
    assert request["model"] == "planner-7b"
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"] == refine.SCHEMA
    context = json.loads(request["messages"][1]["content"])
    assert {op["name"] for op in context["compute_ops"]} == {"matmul", "truediv", "softmax", "matmul_1"}
    assert context["deterministic_plan"][0]["kind"] == "attention"


def test_an_invalid_answer_keeps_the_deterministic_plan_with_a_warning() -> None:
    answers = [(200, "Sure! Here is the plan: {subtasks: ...}"), (500, "model crashed")]
    with ChatServer(answers) as server:
        service = service_for(server)
        not_json = service.plan(source("12"), problem_name="12_attention", profile=False)
        failed = service.plan(source("12"), problem_name="12_attention", profile=False)
    for plan in (not_json, failed):
        assert plan.planner == "deterministic"
        assert [st.kind for st in plan.subtasks] == [K.SUBTASK_KIND_ATTENTION]
    assert any(w.startswith("LLM refinement rejected: not JSON") for w in not_json.warnings), list(
        not_json.warnings
    )
    assert any(w.startswith("LLM refinement failed (Unavailable") for w in failed.warnings), list(
        failed.warnings
    )


def answer(**changes: Any) -> str:
    doc = json.loads(json.dumps(SPLIT_ATTENTION))
    for key, value in changes.items():
        doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (answer(subtasks=[{"ops": ["matmul", "truediv", "softmax"]}]), "missing from every subtask: matmul_1"),
        (answer(subtasks=[{"ops": ["matmul", "truediv", "softmax", "matmul_1"]}, {"ops": ["softmax"]}]),
         "'softmax' is in subtasks[0] and subtasks[1]"),
        (answer(subtasks=[{"ops": ["matmul", "truediv", "softmax", "matmul_1", "flash"]}]), "does not have: 'flash'"),
        (answer(subtasks=[{"ops": ["matmul", "softmax"], "library_call": False},
                          {"ops": ["truediv", "matmul_1"], "library_call": False}]), "cycle"),
        (answer(subtasks=[{"ops": ["truediv", "softmax", "matmul_1"], "anchor": "matmul_1", "library_call": True},
                          {"ops": ["matmul"]}]), "cannot take a prologue"),
        (answer(subtasks=[{"ops": ["matmul", "truediv", "softmax", "matmul_1"], "kind": "flash"}]), "is not one of"),
        (answer(subtasks=[{"ops": ["matmul", "truediv", "softmax", "matmul_1"], "fused": True}]), "unexpected keys"),
        (answer(orchestration={"cuda_graphs": "yes"}), "cuda_graphs must be a boolean"),
        (answer(subtasks=[]), "non-empty list"),
        ("[1, 2]", "not a JSON object"),
    ],
)  # fmt: skip
def test_answers_are_validated_against_the_graph(attention_graph: Graph, text: str, reason: str) -> None:
    with pytest.raises(refine.InvalidAnswer, match=reason.replace("(", r"\(").replace("[", r"\[")):
        refine.parse(text, attention_graph)


def test_layout_names_in_an_answer_are_reattached(attention_graph: Graph) -> None:
    text = answer(
        subtasks=[{"ops": ["transpose", "matmul", "truediv", "softmax", "matmul_1"], "kind": "attention"}]
    )
    result = refine.parse(text, attention_graph)
    (group,) = result.groups
    assert group.kind == "attention"
    assert {"transpose", "getattr_1", "getitem", "sqrt"} <= set(group.nodes)


def test_the_scripted_llm_and_the_openai_adapter_agree_on_the_port() -> None:
    scripted = ScriptedLLM([json.dumps(SPLIT_ATTENTION)])
    assert json.loads(scripted.complete([{"role": "user", "content": "x"}], refine.SCHEMA)) == SPLIT_ATTENTION
    assert scripted.requests == [[{"role": "user", "content": "x"}]]
    adapter = OpenAICompatibleLLM.from_settings(
        fast_settings(llm_base_url="http://example.invalid/v1", llm_model="m")
    )
    assert adapter.name == "m"


@pytest.fixture()
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("STITCH_LLM_ENABLED", "STITCH_PLANNER_LLM_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_llm_settings_read_planner_then_shared_environment(
    monkeypatch: pytest.MonkeyPatch, no_llm_env: None
) -> None:
    monkeypatch.setenv("STITCH_LLM_MODEL", "shared-model")
    monkeypatch.setenv("STITCH_LLM_ENABLED", "true")
    assert fast_settings().llm_model == "shared-model"
    monkeypatch.setenv("STITCH_PLANNER_LLM_MODEL", "planner-model")
    monkeypatch.setenv("STITCH_PLANNER_PROFILE_ITERS", "7")
    from stitchcuda.planner.settings import PlannerSettings

    settings = PlannerSettings()
    assert settings.llm_model == "planner-model" and settings.llm_enabled and settings.profile_iters == 7
    assert PlannerService(fast_settings(llm_enabled=False)).llm is None
