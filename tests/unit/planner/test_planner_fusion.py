"""Fusion on graphs with shared producers, views read by several kernels and unused outputs: one subtask per
compute node, and an acyclic kernel order."""

from __future__ import annotations

import textwrap

import pytest
from planner_support import fast_settings

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.service import PlannerService

ZOO = textwrap.dedent(
    """
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(32, 32))
            self.norm = nn.LayerNorm(32)

        def forward(self, x, y):
            t = x.t()                      # a view read by two kernels
            a = t @ self.w                 # GEMM
            b = torch.relu(t)              # reads the same view
            c = a + b                      # joins the GEMM's epilogue, reads b from another group
            s = torch.sigmoid(c)
            shared = s * 2.0               # read by three consumers below
            r = shared.sum(dim=-1, keepdim=True)
            n = self.norm(shared)
            m = torch.softmax(shared, dim=-1)
            unused = torch.tanh(y)         # dead code: computed, never returned
            return n * r + m, y.view(-1)   # a view of an input returned as is


    def get_inputs():
        return [torch.randn(32, 16), torch.randn(4, 8)]


    def get_init_inputs():
        return []
    """
)


@pytest.fixture(scope="module")
def zoo() -> plan_pb2.Plan:
    return PlannerService(fast_settings()).plan(ZOO, problem_name="zoo", profile=False)


def test_every_node_once_and_kernels_in_dependency_order(zoo: plan_pb2.Plan) -> None:
    names = [op.name for st in zoo.subtasks for op in st.ops]
    assert len(names) == len(set(names))
    for node in ("t", "matmul", "relu", "add", "sigmoid", "mul", "sum_1", "norm", "softmax", "tanh", "view"):
        assert node in names, node
    order = {st.id: i for i, st in enumerate(zoo.subtasks)}
    for st in zoo.subtasks:
        assert all(order[d] < order[st.id] for d in st.depends_on), (st.id, list(st.depends_on))


def test_fusion_decisions(zoo: plan_pb2.Plan) -> None:
    group = {op.name: st for st in zoo.subtasks for op in st.ops}
    assert group["add"].id == group["matmul"].id, "the residual add is the GEMM's epilogue"
    assert group["relu"].id != group["matmul"].id
    assert group["sigmoid"].id == group["matmul"].id and group["mul"].id == group["matmul"].id
    # `shared` has three readers: the reduction, the norm and the softmax are separate kernels.
    assert len({group[n].id for n in ("sum_1", "norm", "softmax")}) == 3
    assert group["sum_1"].id != group["mul"].id
    # n * r + m: the norm's epilogue, reading the reduction's and the softmax's outputs.
    final = group["norm"]
    assert [op.name for op in final.ops] == ["norm", "mul_1", "add_1"]
    assert set(final.depends_on) == {group["matmul"].id, group["sum_1"].id, group["softmax"].id}
    concurrent = [set(g.split(",")) for g in zoo.orchestration.concurrent_groups]
    assert {group["sum_1"].id, group["softmax"].id} in concurrent, concurrent
    assert {group["relu"].id, group["tanh"].id} <= next(g for g in concurrent if group["relu"].id in g)
    # The transposed input is a view of x, not an intermediate another kernel must wait for.
    assert "t" not in {t.name for t in group["matmul"].outputs}
    assert group["relu"].depends_on == []
    assert [list(t.shape) for t in zoo.outputs] == [[16, 32], [32]]
