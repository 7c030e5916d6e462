"""Broken references are ProblemErrors naming the line; untraceable but runnable ones still get a plan."""

from __future__ import annotations

import textwrap

import pytest
from planner_support import fast_settings

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.service import PlannerService
from stitchcuda.shared.errors import ProblemError

K = plan_pb2.SubtaskKind

HEADER = "import torch\nimport torch.nn as nn\n\n"


def ref(body: str) -> str:
    return HEADER + textwrap.dedent(body).lstrip()


GEMM_MISMATCH = ref(
    """
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(256, 64)

        def forward(self, x):
            y = torch.relu(x)
            return self.fc(y)


    def get_inputs():
        return [torch.randn(8, 512)]


    def get_init_inputs():
        return []
    """
)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def plan(planner: PlannerService, text: str, name: str = "bad") -> plan_pb2.Plan:
    return planner.plan(text, problem_name=name, device="cpu", profile=False)


def test_syntax_error_names_the_line(planner: PlannerService) -> None:
    with pytest.raises(ProblemError, match=r"^p1: syntax error at line 4"):
        plan(planner, HEADER + "def broken(:\n    pass\n", "p1")


def test_missing_get_inputs(planner: PlannerService) -> None:
    text = ref(
        """
        class Model(nn.Module):
            def forward(self, x):
                return x

        def get_init_inputs():
            return []
        """
    )
    with pytest.raises(ProblemError, match="does not define get_inputs"):
        plan(planner, text)


def test_forward_failing_on_its_own_inputs_names_the_line(planner: PlannerService) -> None:
    with pytest.raises(ProblemError) as err:
        plan(planner, GEMM_MISMATCH, "gemm")
    message = str(err.value)
    line = line_of(GEMM_MISMATCH, "return self.fc(y)")
    assert message.startswith(f"gemm: reference fails on its own inputs: line {line}: RuntimeError:"), message
    assert "cannot be multiplied" in message and "\n" not in message


def test_import_and_construction_failures(planner: PlannerService) -> None:
    module_error = HEADER + "import not_a_real_package\n" + GEMM_MISMATCH[len(HEADER) :]
    with pytest.raises(ProblemError, match=r"does not import: line 4: ModuleNotFoundError"):
        plan(planner, module_error)
    init_error = GEMM_MISMATCH.replace(
        "self.fc = nn.Linear(256, 64)", "self.fc = nn.Linear(256, 64, nonsense=True)"
    )
    line = line_of(init_error, "self.fc = ")
    with pytest.raises(ProblemError, match=rf"Model\(\*get_init_inputs\(\)\) fails: line {line}: TypeError"):
        plan(planner, init_error)
    inputs_error = GEMM_MISMATCH.replace("return [torch.randn(8, 512)]", "return [torch.randn(8, 512) @ 3]")
    line = line_of(inputs_error, "@ 3")
    with pytest.raises(ProblemError, match=rf"get_inputs\(\) fails: line {line}: TypeError"):
        plan(planner, inputs_error)


def test_a_failure_that_needs_real_data_is_found_on_real_tensors(planner: PlannerService) -> None:
    text = ref(
        """
        class Model(nn.Module):
            def forward(self, x):
                if x.abs().max() > 100:
                    return x
                raise ValueError("values are too small")


        def get_inputs():
            return [torch.randn(4, 4)]


        def get_init_inputs():
            return []
        """
    )
    line = line_of(text, "raise ValueError")
    with pytest.raises(
        ProblemError, match=rf"fails on its own inputs: line {line}: ValueError: values are too small"
    ):
        plan(planner, text)


def test_data_dependent_control_flow_gets_a_plan_of_last_resort(planner: PlannerService) -> None:
    text = ref(
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(32, 32)

            def forward(self, x):
                y = self.fc(x)
                if y.sum() > 0:
                    return torch.relu(y)
                return -y


        def get_inputs():
            return [torch.randn(16, 32)]


        def get_init_inputs():
            return []
        """
    )
    result = plan(planner, text, "dd")
    assert result.last_resort and result.capture == "none"
    (st,) = result.subtasks
    assert st.kind == K.SUBTASK_KIND_OPAQUE and st.time_share == 1.0
    assert "aten.addmm" in st.ops[0].aten_ops
    assert result.total_flops == 2 * 16 * 32 * 32  # counted on the eager run
    line = line_of(text, "if y.sum() > 0")
    assert any("last resort" in w and f"line {line}" in w for w in result.warnings), list(result.warnings)
    assert [list(t.shape) for t in result.outputs] == [[16, 32]]


def test_shape_dependent_control_flow_is_captured_with_export(planner: PlannerService) -> None:
    text = ref(
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(64, 64)

            def forward(self, x):
                y = self.fc(x)
                for _ in range(x.shape[1] // 32):
                    y = y * 0.5
                return torch.relu(y)


        def get_inputs():
            return [torch.randn(16, 64)]


        def get_init_inputs():
            return []
        """
    )
    result = plan(planner, text, "loop")
    assert not result.last_resort and result.capture == "export"
    names = [op.name for st in result.subtasks for op in st.ops]
    assert {"linear", "mul", "mul_1", "relu"} <= set(names) and len(names) == len(set(names))
    assert result.subtasks[0].kind == K.SUBTASK_KIND_GEMM
    assert any("torch.export" in w for w in result.warnings)


def test_a_hanging_import_is_a_timeout_error() -> None:
    slow = PlannerService(fast_settings(analysis_timeout_s=30.0))
    text = HEADER + "while True:\n    pass\n" + GEMM_MISMATCH[len(HEADER) :]
    with pytest.raises(
        ProblemError, match=r"did not finish in import \(reference does not import\) within 30 s"
    ) as err:
        plan(slow, text)
    assert err.value.code == "reference_timeout"


LOOPING_FORWARD = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        while True:
            x = x + 1
        return x


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""


def test_a_forward_that_loops_forever_ends_planning_with_reference_timeout() -> None:
    planner = PlannerService(fast_settings(analysis_timeout_s=15.0))
    with pytest.raises(ProblemError, match=r"capture\.fx.*within 15 s: it loops or hangs") as err:
        plan(planner, LOOPING_FORWARD)
    assert err.value.code == "reference_timeout"


def test_a_data_dependent_endless_loop_is_stopped_on_real_inputs() -> None:
    # fx and export cannot trace `while x.sum() > -1e30` (the condition needs data); the analysis's own
    # forward on real tensors then never returns.
    text = LOOPING_FORWARD.replace("while True:", "while bool(x.sum() > -1e30):")
    planner = PlannerService(fast_settings(analysis_timeout_s=10.0))
    with pytest.raises(ProblemError, match=r"did not finish in forward .* within 10 s") as err:
        plan(planner, text)
    assert err.value.code == "reference_timeout"


def test_an_allocation_storm_is_reference_out_of_memory() -> None:
    text = (
        HEADER
        + "hoard = []\nwhile True:\n    hoard.append(bytearray(1 << 27))\n"
        + GEMM_MISMATCH[len(HEADER) :]
    )
    planner = PlannerService(fast_settings(subprocess_memory_mb=1024))
    with pytest.raises(ProblemError, match="MemoryError") as err:
        plan(planner, text)
    assert err.value.code == "reference_out_of_memory"


def test_the_real_runs_deadline_follows_the_problems_flops(tmp_path) -> None:
    from stitchcuda.planner.analysis import Analysis
    from stitchcuda.planner.runner import ReferenceRunner

    runner = ReferenceRunner(fast_settings(min_run_timeout_s=5.0, profile_timeout_s=300.0))
    report = tmp_path / "analysis.json"
    budgets = []
    for flops in (0.0, 1e9, 1e12):
        report.write_text(Analysis(ok=True, eager_flops=flops).model_dump_json())
        budgets.append(runner.run_budget(tmp_path))
    # 8 calls (2 checks, 1 warm-up, 3 timed, 2 per-op) at 2 GFLOP/s, three times over, within [5, 300] s
    assert budgets == [5.0, 12.0, 300.0]
