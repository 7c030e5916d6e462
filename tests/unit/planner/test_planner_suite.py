"""Plans for every problem in the suite, checked against an independent fx trace (the Coder's and Verifier's)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.fx
from planner_support import SUITE

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.shared import ops

K = plan_pb2.SubtaskKind


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"suite_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fx_compute_nodes(path: Path) -> dict[str, str]:
    """fx node name -> canonical target, for every compute node, traced here without the planner."""
    module = load(path)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
    gm = torch.fx.symbolic_trace(model)
    found = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        cls = type(gm.get_submodule(n.target)).__name__ if n.op == "call_module" else ""
        name = ops.canonical_name(n.op, n.target, cls)
        if ops.is_compute(name):
            found[n.name] = name
    return found


def test_every_problem_gets_a_captured_plan(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    assert set(suite_plans) == {p.stem for p in SUITE}
    assert len(SUITE) >= 16
    for name, plan in suite_plans.items():
        assert not plan.last_resort, (name, list(plan.warnings))
        assert plan.capture == "fx", name
        assert plan.subtasks, name
        assert plan.dtype == "float32", name


@pytest.mark.parametrize("path", SUITE, ids=[p.stem for p in SUITE])
def test_every_compute_node_is_in_exactly_one_subtask(
    path: Path, suite_plans: dict[str, plan_pb2.Plan]
) -> None:
    plan = suite_plans[path.stem]
    expected = fx_compute_nodes(path)
    seen: dict[str, list[str]] = {}
    targets = {}
    for st in plan.subtasks:
        for op in st.ops:
            seen.setdefault(op.name, []).append(st.id)
            targets[op.name] = op.target
    for name, target in expected.items():
        assert len(seen.get(name, [])) == 1, f"{name} is in subtasks {seen.get(name)}"
        assert targets[name] == target
    assert all(len(ids) == 1 for ids in seen.values()), "no op (compute or layout) may be listed twice"


@pytest.mark.parametrize("path", SUITE, ids=[p.stem for p in SUITE])
def test_subtask_accounting_is_consistent(path: Path, suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans[path.stem]
    assert math.isclose(sum(st.flops for st in plan.subtasks), plan.total_flops, rel_tol=1e-9)
    assert plan.total_flops > 0 and plan.total_bytes > 0
    assert math.isclose(sum(st.time_share for st in plan.subtasks), 1.0, rel_tol=1e-6)
    assert sorted(st.priority for st in plan.subtasks) == list(range(1, len(plan.subtasks) + 1))
    by_share = sorted(plan.subtasks, key=lambda st: st.priority)
    assert [st.time_share for st in by_share] == sorted((st.time_share for st in plan.subtasks), reverse=True)
    ids = [st.id for st in plan.subtasks]
    for i, st in enumerate(plan.subtasks):
        assert set(st.depends_on) <= set(ids[:i]), (
            f"{st.id} depends on a later subtask: {list(st.depends_on)}"
        )
        assert st.floor_ms > 0 and st.bytes > 0 and st.outputs, st.id
        assert st.bound in ("memory", "compute")
    # The whole program's floor (perfect fusion) can never exceed the sum of its kernels' floors.
    assert 0 < plan.floor_ms <= sum(st.floor_ms for st in plan.subtasks) * (1 + 1e-9)
    assert plan.eager_ms > 0, "profiled on the CPU: eager time measured"
    assert any(p.time_ms > 0 for p in plan.profile)
    assert not any("estimated from their roofline" in w for w in plan.warnings)


@pytest.mark.parametrize("path", SUITE, ids=[p.stem for p in SUITE])
def test_inputs_match_the_reference(path: Path, suite_plans: dict[str, plan_pb2.Plan]) -> None:
    module = load(path)
    with torch.device("meta"):
        inputs = module.get_inputs()
        model = module.Model(*module.get_init_inputs())
    plan = suite_plans[path.stem]
    assert [list(t.shape) for t in plan.inputs] == [list(x.shape) for x in inputs]
    params = {name: list(t.shape) for name, t in [*model.named_parameters(), *model.named_buffers()]}
    assert {t.name: list(t.shape) for t in plan.parameters} == params


def _kinds(plan: plan_pb2.Plan) -> list[int]:
    return [st.kind for st in plan.subtasks]


def test_gemm_keeps_cublas_with_relu_epilogue(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans["06_gemm_bias_relu"]
    (st,) = plan.subtasks
    assert st.kind == K.SUBTASK_KIND_GEMM and st.library_call and st.anchor == "linear"
    assert [o.name for o in st.ops] == ["linear", "relu"]
    assert st.ops[0].kwargs["in_features"] == "512" and "aten.addmm" in st.ops[0].aten_ops
    assert {t.name for t in st.inputs} == {"x", "linear.weight", "linear.bias"}


def test_cnn_block_folds_batch_norm_into_the_conv(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans["09_cnn_block"]
    assert _kinds(plan) == [K.SUBTASK_KIND_CONV, K.SUBTASK_KIND_POOL]
    assert [o.name for o in plan.subtasks[0].ops] == ["conv", "bn", "relu"]
    assert any("fold bn" in t for t in plan.orchestration.init_time_transforms)
    assert plan.orchestration.preallocate_intermediates
    assert plan.subtasks[1].depends_on == ["st1"]


def test_written_out_attention_becomes_one_flash_subtask(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans["12_attention"]
    (st,) = plan.subtasks
    assert st.kind == K.SUBTASK_KIND_ATTENTION and not st.library_call
    assert {"matmul", "truediv", "softmax", "matmul_1"} <= {o.name for o in st.ops}
    assert [t.name for t in st.outputs] == ["matmul_1"]


def test_reductions_and_norms_take_their_elementwise_neighbours(
    suite_plans: dict[str, plan_pb2.Plan],
) -> None:
    rms = suite_plans["10_rmsnorm"]
    assert _kinds(rms) == [K.SUBTASK_KIND_REDUCTION] and rms.subtasks[0].anchor == "mean"
    mse = suite_plans["11_mse_loss"]
    assert _kinds(mse) == [K.SUBTASK_KIND_REDUCTION]
    assert [o.name for o in mse.subtasks[0].ops] == ["sub", "pow_1", "mean"]
    assert _kinds(suite_plans["01_elementwise_chain"]) == [K.SUBTASK_KIND_ELEMENTWISE]
    assert _kinds(suite_plans["05_layernorm"]) == [K.SUBTASK_KIND_NORM]


def test_residual_block_fuses_the_shortcut_into_the_second_conv(
    suite_plans: dict[str, plan_pb2.Plan],
) -> None:
    plan = suite_plans["13_residual_block"]
    assert _kinds(plan) == [K.SUBTASK_KIND_CONV, K.SUBTASK_KIND_CONV]
    assert [o.name for o in plan.subtasks[1].ops] == ["conv2", "bn2", "add", "relu_1"]
    assert {"x", "relu"} <= {t.name for t in plan.subtasks[1].inputs}


def test_lstm_and_transformer_plans(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    lstm = suite_plans["14_lstm"]
    assert _kinds(lstm) == [K.SUBTASK_KIND_RNN, K.SUBTASK_KIND_GEMM]
    assert lstm.subtasks[0].library_call
    assert [t.name for t in lstm.subtasks[0].outputs] == ["lstm[0]"], "only the sequence output is read on"
    assert any("weight_ih and weight_hh" in t for t in lstm.orchestration.init_time_transforms)
    block = suite_plans["15_transformer_block"]
    kinds = _kinds(block)
    assert kinds.count(K.SUBTASK_KIND_GEMM) == 4 and kinds.count(K.SUBTASK_KIND_NORM) == 2
    attention = next(st for st in block.subtasks if st.kind == K.SUBTASK_KIND_ATTENTION)
    assert attention.anchor == "scaled_dot_product_attention"
    assert attention.ops[-1].kwargs["is_causal"] == "True"
