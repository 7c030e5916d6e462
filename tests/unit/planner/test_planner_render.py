"""The human views of a plan: the CLI's JSON (plan_to_json) and the text table (render_plan)."""

from __future__ import annotations

import json

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.render import plan_to_json, render_plan


def test_json_has_the_documented_keys_and_round_trips(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans["08_mlp"]
    doc = json.loads(json.dumps(plan_to_json(plan)))
    assert {"subtasks", "total_flops", "total_bytes", "floor_ms", "profile"} <= set(doc)
    assert doc["total_flops"] == plan.total_flops and doc["floor_ms"] == plan.floor_ms
    first = doc["subtasks"][0]
    assert {"ops", "inputs", "outputs", "flops", "bytes", "time_share"} <= set(first)
    assert [op["name"] for op in first["ops"]] == ["fc1", "gelu"]
    assert first["kind"] == "gemm" and first["library_call"] is True
    assert first["inputs"][0] == {
        "name": "x",
        "shape": [128, 256],
        "dtype": "float32",
        "layout": "contiguous",
    }
    assert doc["profile"]["eager_ms"] > 0
    assert {op["node"] for op in doc["profile"]["ops"]} == {"fc1", "gelu", "fc2"}
    assert doc["orchestration"]["preallocate_intermediates"] is True


def test_table_lists_every_subtask(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    plan = suite_plans["15_transformer_block"]
    text = render_plan(plan)
    assert text.startswith("Plan for 15_transformer_block on cpu")
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("id "))
    rows = lines[header + 1 : header + 1 + len(plan.subtasks)]
    assert [r.split()[0] for r in rows] == [st.id for st in plan.subtasks]
    assert [r.split()[1] for r in rows] == ["norm", "gemm", "attention", "gemm", "norm", "gemm", "gemm"]
    assert "orchestration: preallocate=True" in text
