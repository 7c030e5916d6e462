"""Prompt rendering: what the generate and optimize prompts show the model."""

from __future__ import annotations

from stitchcuda.api.v1 import code_pb2, plan_pb2, verify_pb2
from stitchcuda.coder.llm.prompts import Doc, plan_text, render_generate, render_optimize, render_system

REFERENCE = "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


def plan() -> plan_pb2.Plan:
    p = plan_pb2.Plan(problem_name="relu", dtype="float32", eager_ms=1.5, compile_ms=1.2, floor_ms=0.4)
    p.inputs.add(name="x", shape=[256, 1024], dtype="float32")
    st = p.subtasks.add(
        id="s0", kind=plan_pb2.SUBTASK_KIND_ELEMENTWISE, priority=0, time_share=1.0, bound="memory"
    )
    st.ops.add(name="relu", target="relu")
    p.orchestration.notes.append("preallocate the output")
    return p


def test_generate_prompt_shows_reference_plan_and_docs() -> None:
    text = render_generate(
        reference=REFERENCE,
        plan=plan(),
        target="cuda",
        docs=[Doc("Vectorized loads", "use float4")],
        problem="relu",
    )
    assert "return torch.relu(x)" in text
    assert "- s0 [elementwise] relu=relu (100% of time; memory-bound)" in text
    assert "Inputs: x[256, 1024] float32" in text
    assert "### Vectorized loads\nuse float4" in text
    assert "Note: preallocate the output" in text
    assert "target cuda" in text


def test_generate_prompt_without_plan_or_docs() -> None:
    text = render_generate(reference=REFERENCE, plan=None, target="cpu", docs=[])
    assert "(no plan: analyse the reference yourself)" in text
    assert "Notes that may help" not in text


def test_optimize_prompt_carries_previous_files_and_feedback() -> None:
    previous = code_pb2.Candidate(candidate_id="c1")
    previous.files.add(path="model_new.py", content="import ext_a as ext\nclass ModelNew: ...")
    previous.files.add(path="forward.cu", content="__global__ void k() {}")
    previous.variant["vec"] = "4"
    previous.variant["tried"] = "default"
    verdict = verify_pb2.Verdict(accepted=False, compiled=True, reason="mismatch in trial 2")
    verdict.correctness.max_rel_l2 = 3e-3
    verdict.correctness.tolerance = 1e-5
    verdict.correctness.trials.add(name="t", ok=False)
    verdict.feedback = "Output differs in rows 0..3: check the broadcast of the bias."
    text = render_optimize(
        reference=REFERENCE, plan=plan(), target="cuda", previous=previous, verdict=verdict, docs=[]
    )
    assert "```cuda forward.cu\n__global__ void k() {}\n```" in text
    assert "```python model_new.py" in text
    assert (
        "(variant: vec=4)" in text
        and "tried" not in text.split("## Verifier")[0].split("variant:")[1].split(")")[0]
    )
    assert "rejected (mismatch in trial 2); max rel_l2 3.00e-03 (tolerance 1.0e-05)" in text
    assert "check the broadcast of the bias" in text
    assert "fix what the feedback names first" in text


def test_optimize_prompt_falls_back_to_structured_verdict_fields() -> None:
    previous = code_pb2.Candidate()
    previous.files.add(path="model_new.py", content="x")
    verdict = verify_pb2.Verdict(accepted=True, speedup_vs_eager=1.4, speedup_vs_compile=0.9)
    verdict.findings.add(
        rule="D6.custom-share", detail="custom kernels cover 20%", severity=verify_pb2.SEVERITY_WARNING
    )
    text = render_optimize(
        reference=REFERENCE, plan=None, target="cpu", previous=previous, verdict=verdict, docs=[]
    )
    assert "1.40x vs eager, 0.90x vs torch.compile" in text
    assert "[D6.custom-share] custom kernels cover 20%" in text
    assert "make it faster" in text


def test_system_prompt_states_the_format_and_the_rules() -> None:
    structured = render_system(target="cuda", structured=True)
    plain = render_system(target="cpu", structured=False)
    assert "import <extension_name> as ext" in structured
    assert "try/except" in structured and "PYBIND11_MODULE" in structured
    assert "one JSON object" in structured and "one JSON object" not in plain
    assert "```cpp forward.cpp" in plain and "at::parallel_for" in plain
    assert "getCurrentCUDAStream" in structured


def test_plan_text_is_bounded() -> None:
    p = plan()
    for i in range(400):
        st = p.subtasks.add(id=f"s{i + 1}", kind=plan_pb2.SUBTASK_KIND_REDUCTION, priority=i + 1)
        st.ops.add(name=f"sum_{i}", target="sum")
    text = plan_text(p, limit=2000)
    assert len(text) < 2100 and text.endswith("(plan truncated)")
