"""Cost model: FLOPs and minimum bytes per op, and roofline floors on the device's ceilings.

FLOP conventions (documented so tests and readers can recompute them by hand):
- GEMM, conv, attention and RNN matrix products: torch.utils.flop_counter on the meta device
  (2 FLOPs per multiply-accumulate), plus one FLOP per output element for a bias.
- Elementwise ops: one FLOP per output element (transcendentals count one: they are memory-bound).
- Reductions: one FLOP per input element.  Softmax: 5 per element (max, subtract, exp, sum, divide).
- Norms: 5 per element for the statistics and normalisation, +2 with an affine weight and bias;
  inference batch norm: 2 per element (a folded scale and shift).
- Pools: one FLOP per window element per output (adaptive pools: one per input element).
- scaled_dot_product_attention: the two matrix products, plus 6 per score (scale, softmax).
Minimum bytes: every tensor an op reads (inputs, parameters) and writes, once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from stitchcuda.planner.graph import MATERIALIZING, Graph, Node
from stitchcuda.planner.settings import PlannerSettings

MATRIX_KINDS = frozenset({"gemm", "conv", "attention", "rnn"})
SOFTMAX_FLOPS = 5
NORM_FLOPS = 5
AFFINE_FLOPS = 2
SDPA_SCORE_FLOPS = 6
HALF_DTYPES = frozenset({"float16", "bfloat16"})


@dataclass(frozen=True)
class Ceilings:
    device_name: str
    bandwidth_gbps: float
    vector_tflops: float
    matrix_tflops: float
    source: str = "settings"

    def floor_ms(self, bytes_: float, vector_flops: float, matrix_flops: float = 0.0) -> float:
        """The roofline lower bound: memory time or arithmetic time, whichever is longer."""
        memory_s = bytes_ / (self.bandwidth_gbps * 1e9)
        compute_s = vector_flops / (self.vector_tflops * 1e12) + matrix_flops / (self.matrix_tflops * 1e12)
        return max(memory_s, compute_s) * 1e3

    def bound(self, bytes_: float, vector_flops: float, matrix_flops: float = 0.0) -> str:
        memory_s = bytes_ / (self.bandwidth_gbps * 1e9)
        compute_s = vector_flops / (self.vector_tflops * 1e12) + matrix_flops / (self.matrix_tflops * 1e12)
        return "compute" if compute_s > memory_s else "memory"


def ceilings_for(settings: PlannerSettings, device: str, dtype: str, device_name: str = "") -> Ceilings:
    if device == "cuda":
        if dtype in HALF_DTYPES:
            matrix = settings.cuda_half_tflops
        elif dtype == "float32" and settings.floor_allow_tf32:
            matrix = settings.cuda_tf32_tflops
        else:
            matrix = settings.cuda_vector_tflops
        vector = settings.cuda_vector_tflops * (2.0 if dtype in HALF_DTYPES else 1.0)
        return Ceilings(device_name or "cuda", settings.cuda_bandwidth_gbps, vector, matrix)
    return Ceilings(
        device_name or "cpu", settings.cpu_bandwidth_gbps, settings.cpu_tflops, settings.cpu_tflops
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _given(text: str | None) -> bool:
    return text is not None and text not in ("None", "False", "")


def _has_bias(node: Node) -> bool:
    info = node.info
    if node.target in ("addmm", "baddbmm", "addmv", "addbmm"):
        return True
    if info.module is not None:
        return info.module.constants.get("bias") == "True"
    if len(info.args) >= 3:
        return _given(info.args[2])
    return _given(info.kwargs.get("bias"))


def _affine(node: Node) -> bool:
    info = node.info
    if info.module is not None:
        consts = info.module.constants
        flag = consts.get("elementwise_affine", consts.get("affine"))
        return flag == "True" if flag is not None else bool(info.module.params)
    weight_pos = {"layer_norm": 2, "group_norm": 2, "rms_norm": 2, "batch_norm": 3, "instance_norm": 3}
    pos = weight_pos.get(node.target, 2)
    return (len(info.args) > pos and _given(info.args[pos])) or _given(info.kwargs.get("weight"))


def _training(node: Node) -> bool:
    info = node.info
    if info.module is not None:
        return info.module.constants.get("training") == "True"
    if len(info.args) > 5:
        return info.args[5] == "True"
    return info.kwargs.get("training") == "True"


def _pool_window(node: Node) -> int:
    info = node.info
    dims = int(node.target[-2]) if node.target[-2:-1].isdigit() else 2
    text = info.module.constants.get("kernel_size", "") if info.module else ""
    if not text:
        text = info.args[1] if len(info.args) > 1 else info.kwargs.get("kernel_size", "1")
    sizes = _ints(text) or [1]
    if len(sizes) == 1:
        sizes = sizes * dims
    return math.prod(sizes)


def node_flops(graph: Graph, node: Node) -> float:
    kind = node.kind
    out = sum(t.numel for t in node.outputs)
    reads = graph.tensor_inputs(node)
    first_in = reads[0].numel if reads else out
    counted = node.info.counted_flops
    if kind in ("gemm", "conv"):
        return counted + (out if _has_bias(node) else 0)
    if kind == "attention":
        if node.target == "scaled_dot_product_attention" and len(reads) >= 2 and reads[0].shape:
            q, k = reads[0], reads[1]
            scores = q.numel // max(q.shape[-1], 1) * (k.shape[-2] if len(k.shape) >= 2 else 1)
            return counted + SDPA_SCORE_FLOPS * scores
        return counted
    if kind in ("rnn", "opaque"):
        return counted
    if kind == "elementwise":
        return float(out)
    if kind == "reduction":
        return float(first_in)
    if kind == "softmax":
        return float(SOFTMAX_FLOPS * out)
    if kind == "norm":
        if node.target == "batch_norm" and not _training(node):
            return float(2 * out)
        return float((NORM_FLOPS + (AFFINE_FLOPS if _affine(node) else 0)) * out)
    if kind == "pool":
        if node.target.startswith("adaptive"):
            return float(first_in)
        return float(out * _pool_window(node))
    return 0.0


def node_bytes(graph: Graph, node: Node) -> float:
    """Minimum bytes of the op run alone: what it reads (inputs, its module's parameters) and writes."""
    if not node.compute and not (node.kind == "layout" and node.target in MATERIALIZING):
        return 0.0
    reads = sum(t.bytes for t in graph.tensor_inputs(node))
    params = sum(p.bytes for p in node.info.module.params) if node.info.module else 0
    writes = sum(t.bytes for t in node.outputs)
    return float(reads + params + writes)


def annotate(graph: Graph) -> None:
    """Fills each node's flops and bytes."""
    for node in graph.nodes:
        node.flops = node_flops(graph, node)
        node.bytes = node_bytes(graph, node)


def split_flops(node_kinds_flops: list[tuple[str, float]]) -> tuple[float, float]:
    """(vector FLOPs, matrix FLOPs) of a set of ops, for the floor."""
    matrix = sum(f for k, f in node_kinds_flops if k in MATRIX_KINDS)
    vector = sum(f for k, f in node_kinds_flops if k not in MATRIX_KINDS)
    return vector, matrix
