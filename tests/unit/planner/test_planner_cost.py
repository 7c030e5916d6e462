"""FLOPs, bytes and floors against hand-computed values (GEMM, conv, attention) and the device ceilings."""

from __future__ import annotations

import importlib.util
import math
from types import ModuleType

import pytest
from planner_support import PROBLEMS, fast_settings

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.cost import Ceilings, ceilings_for


def constants(stem: str) -> ModuleType:
    path = next(PROBLEMS.glob(f"{stem}*.py"))
    spec = importlib.util.spec_from_file_location(f"consts_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def op_flops(plan: plan_pb2.Plan) -> dict[str, float]:
    return {p.node: p.flops for p in plan.profile}


def test_gemm_flops_are_2mkn_plus_bias_plus_epilogue(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    c = constants("06")
    m, k, n = c.M, c.K, c.N
    plan = suite_plans["06_gemm_bias_relu"]
    flops = op_flops(plan)
    assert flops["linear"] == 2 * m * k * n + m * n
    assert flops["relu"] == m * n
    assert plan.subtasks[0].flops == plan.total_flops == 2 * m * k * n + 2 * m * n
    # Minimum bytes: x, weight and bias read once, the output written once (fp32).
    assert plan.subtasks[0].bytes == 4 * (m * k + k * n + n + m * n)


def test_conv_flops(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    c = constants("07")
    out = c.N * c.C_OUT * c.HW * c.HW  # padding 1, stride 1: same spatial size
    flops = op_flops(suite_plans["07_conv_relu"])
    assert flops["conv"] == 2 * out * c.C_IN * 3 * 3 + out
    assert flops["relu"] == out and flops["mul"] == out
    assert suite_plans["07_conv_relu"].total_flops == 2 * out * c.C_IN * 9 + 3 * out


def test_attention_flops(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    c = constants("12")
    b, h, s, d = c.B, c.H, c.S, c.D
    scores = b * h * s * s
    flops = op_flops(suite_plans["12_attention"])
    assert flops["matmul"] == 2 * b * h * s * s * d  # Q K^T
    assert flops["matmul_1"] == 2 * b * h * s * s * d  # P V
    assert flops["truediv"] == scores
    assert flops["softmax"] == 5 * scores
    assert suite_plans["12_attention"].total_flops == 4 * b * h * s * s * d + 6 * scores


def test_sdpa_flops_in_the_transformer_block(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    c = constants("15")
    head = c.D // c.HEADS
    flops = op_flops(suite_plans["15_transformer_block"])
    scores = c.B * c.HEADS * c.T * c.T
    assert flops["scaled_dot_product_attention"] == 4 * scores * head + 6 * scores
    assert flops["qkv"] == 2 * c.B * c.T * c.D * 3 * c.D + c.B * c.T * 3 * c.D


def test_elementwise_chain_reads_and_writes_once(suite_plans: dict[str, plan_pb2.Plan]) -> None:
    c = constants("01")
    plan = suite_plans["01_elementwise_chain"]
    assert plan.subtasks[0].bytes == plan.total_bytes == 2 * 4 * c.BATCH * c.DIM
    assert plan.total_flops == 4 * c.BATCH * c.DIM


def test_program_floor_is_the_roofline_on_the_reported_ceilings(
    suite_plans: dict[str, plan_pb2.Plan],
) -> None:
    for name in ("01_elementwise_chain", "06_gemm_bias_relu"):
        plan = suite_plans[name]
        c = plan.ceilings
        assert c.bandwidth_gbps == 100.0 and c.vector_tflops == 2.0 and c.source == "settings"
        expected = max(
            plan.total_bytes / (c.bandwidth_gbps * 1e9), plan.total_flops / (c.vector_tflops * 1e12)
        )
        assert math.isclose(plan.floor_ms, expected * 1e3, rel_tol=1e-9)
    assert suite_plans["01_elementwise_chain"].subtasks[0].bound == "memory"
    assert suite_plans["06_gemm_bias_relu"].subtasks[0].bound == "compute"


def test_cuda_ceilings_defaults_are_explicit() -> None:
    settings = fast_settings()
    fp32 = ceilings_for(settings, "cuda", "float32", "NVIDIA H200")
    assert (fp32.bandwidth_gbps, fp32.vector_tflops, fp32.matrix_tflops) == (4300.0, 60.0, 400.0)
    assert ceilings_for(settings, "cuda", "bfloat16").matrix_tflops == 800.0
    strict = ceilings_for(fast_settings(floor_allow_tf32=False), "cuda", "float32")
    assert strict.matrix_tflops == 60.0


@pytest.mark.parametrize(
    ("bytes_", "vector", "matrix", "floor", "bound"),
    [
        (4.3e9, 0.0, 0.0, 1.0, "memory"),  # 4.3 GB at 4.3 TB/s
        (0.0, 60e9, 0.0, 1.0, "compute"),  # 60 GFLOP at 60 TFLOP/s
        (1e6, 0.0, 400e9, 1.0, "compute"),  # tensor-core FLOPs use the matrix peak
    ],
)
def test_ceilings_floor_and_bound(
    bytes_: float, vector: float, matrix: float, floor: float, bound: str
) -> None:
    c = Ceilings("h200", 4300.0, 60.0, 400.0)
    assert math.isclose(c.floor_ms(bytes_, vector, matrix), floor, rel_tol=1e-9)
    assert c.bound(bytes_, vector, matrix) == bound
