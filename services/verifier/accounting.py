"""Kernel accounting (D6): which kernels ran in one profiled call, whose they are, on which stream.

Attribution does not trust kernel names: the runner wraps every function of the candidate's extension, and
every launch of its Triton kernels, in a profiler range with a secret token, so a GPU kernel is *custom*
when its launch happened inside such a range and not inside an ATen op; otherwise it is *library*
(cuBLAS/cuDNN/CUTLASS names, BLAS and convolution ops on a CPU) or *torch*; device memcpy/memset are *copy*,
outside the compute shares. On a CPU the "kernels" are the extension's own time (its ranges minus the ATen
ops inside them) and the ATen ops; the ops that only allocate or only make a view count as copies do.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.shared import cutlass

GPU_LIBRARY = re.compile(
    r"gemm|cublas|cutlass|cudnn|xmma|nvjet|magma|cusparse|curand|cufft|implicit_convolve|winograd|"
    r"^(void )?(sm\d+_|ampere_|volta_|turing_|hopper_|maxwell_)|flash_fwd|flash_bwd|fmha|cub::",
    re.IGNORECASE,
)
CPU_LIBRARY = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|vdot|einsum|tensordot|conv|_conv|"
    r"convolution|_convolution|mkldnn|_mkldnn|cudnn|miopen|_scaled_dot|scaled_dot|lstm|gru|rnn|_fused|fbgemm)"
)
# ATen ops that only allocate (a CPU extension's `torch::empty` for its output shows up inside its span):
# they compute nothing, so, like device copies, they stay outside the compute shares; a CPU call of a tiny
# problem on a busy host spent longer in `aten::empty` than in its own kernel (CI, stop 29).
CPU_ALLOCATION = re.compile(r"^aten::(empty|empty_like|empty_strided|new_empty|new_empty_strided|resize_)$")
# ATen ops that only make a view (new sizes and strides over the same memory): the dispatcher's time for
# them is overhead, not compute, and a whole model's program makes dozens per call (heads split and merged,
# slices of a fused projection). reshape/flatten copy when no view exists: those count as torch compute.
CPU_VIEW = re.compile(
    r"^aten::(view|_unsafe_view|reshape|_reshape_alias|flatten|unflatten|narrow|slice|select|transpose|t|"
    r"permute|expand|expand_as|unsqueeze|squeeze|as_strided|alias|unfold|detach|split|split_with_sizes|"
    r"chunk|unbind|movedim|swapaxes|view_as|reshape_as)$"
)
CPU_COPIES = re.compile(r"^aten::(clone|copy_|contiguous|_to_copy)$")
LAUNCHES = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchCooperativeKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
)
JOINS = (
    "cudaStreamWaitEvent",
    "cudaEventSynchronize",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cuStreamWaitEvent",
)
# The runner's range around a launch of one of the candidate's Triton kernels: `<token>::triton::<name>`
# (harness/triton_launch.py). The kernel Triton compiles carries the jit function's name.
TRITON_SPAN = "triton::"
# The runner's span around each profiled forward call (sent to it in the run's header): not an
# identifier, so no extension function (spans `<token>::<function name>`) can share it.
CALL_SPAN = "<profiled call>"
# A CUTLASS kernel template instantiated in the candidate's sources: its entry point (`cutlass::Kernel`,
# `Kernel2`, `device_kernel`) over one of CUTLASS's kernel templates.
CUTLASS_INSTANCE = re.compile(
    r"^cutlass::(?:Kernel\d*|device_kernel)<\s*cutlass::(?:gemm|conv|reduction)::kernel::\w+<"
)
# The same as the profiler may give it, still mangled (names too long to demangle: a CUTLASS 3 kernel's runs
# to thousands of characters): `_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversal...`, `S_` standing
# for the `cutlass` namespace.
CUTLASS_INSTANCE_MANGLED = re.compile(
    r"^_ZN7cutlass(?:6Kernel|7Kernel\d|13device_kernel)IN(?:S_|7cutlass)(?:4gemm|4conv|9reduction)6kernel\d+\w"
)
# In global_symbols' answer: the sources include CUTLASS headers (not an identifier, so no kernel's name).
CUTLASS_SOURCES = "<cutlass>"
_GLOBAL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]*?\s)?(\w+)\s*\(")
# `__launch_bounds__(...)`, its arguments with one level of parentheses (`(256, sizeof(I) == 4 ? 2 : 1)`).
_BOUNDS = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)")


@dataclass
class Kernel:
    name: str
    origin: str
    time_ms: float = 0.0
    calls: int = 0
    stream: int = 0


@dataclass
class Accounting:
    kernels: list[Kernel] = field(default_factory=list)
    total_ms: float = 0.0
    custom_ms: float = 0.0
    library_ms: float = 0.0
    torch_ms: float = 0.0
    # torch's memcpy/memset on the device and allocations on a CPU: they compute nothing (graph
    # copy-in/out, the output's `torch::empty`).
    copy_ms: float = 0.0
    custom_count: int = 0
    side_stream_custom: list[str] = field(default_factory=list)
    joined: bool = True
    caller_stream: int | None = None
    note: str = ""

    def share(self, origin: str) -> float:
        """Share of the compute time (custom + library + torch kernels); "copy" is a share of all of it.

        Copies stay out of the compute shares: moving bytes computes nothing, so a candidate cannot
        hide torch compute behind them, and an honest one that copies inputs into a CUDA graph's
        static buffers is not outweighed by its copies.
        """
        if origin == "copy":
            return self.copy_ms / self.total_ms if self.total_ms > 0 else 0.0
        value = {"custom": self.custom_ms, "library": self.library_ms, "torch": self.torch_ms}[origin]
        compute = self.custom_ms + self.library_ms + self.torch_ms
        return value / compute if compute > 0 else 0.0

    def custom_share_outside_library(self) -> float:
        """Custom share of the compute time that is not declared library time (the library policy's D6)."""
        rest = self.custom_ms + self.torch_ms
        return self.custom_ms / rest if rest > 0 else 1.0


def global_symbols(sources: dict[str, str]) -> set[str]:
    """`__global__` kernel names defined in the candidate's sources (a fallback for attribution), and
    CUTLASS_SOURCES where the sources instantiate CUTLASS templates (they include its headers)."""
    names: set[str] = set()
    for text in sources.values():
        clean = _BOUNDS.sub(" ", text)
        names.update(m.group(1) for m in _GLOBAL.finditer(clean))
    found = {n for n in names if len(n) >= 3}
    if cutlass.used_by(sources.values()):
        found.add(CUTLASS_SOURCES)
    return found


def _defined_by(kernel: str, symbols: set[str]) -> bool:
    """The profiler's kernel name starts with one of the candidate's `__global__` identifiers, or is a
    CUTLASS kernel template instantiated with CUTLASS's own kernel types where the sources include CUTLASS.

    Names come demangled: `void ns::kern<4>(float*)`, and for kernels in an unnamed namespace
    `(anonymous namespace)::kern(float*)`. cuBLAS's CUTLASS-built kernels carry a precompiled type
    (`cutlass::Kernel2<cutlass_80_simt_sgemm_128x64>`), never `cutlass::gemm::kernel::...`.
    """
    name = kernel.removeprefix("void ").replace("(anonymous namespace)::", "")
    if name.startswith("_ZN7cutlass"):
        return CUTLASS_SOURCES in symbols and bool(CUTLASS_INSTANCE_MANGLED.match(name))
    if name.startswith("cutlass::"):
        return CUTLASS_SOURCES in symbols and bool(CUTLASS_INSTANCE.match(name))
    head = name.split("(", 1)[0].split("<", 1)[0]
    return head.rsplit("::", 1)[-1] in symbols


def _contains(outer: dict[str, Any], inner_ts: float, tid: str) -> bool:
    return bool(outer["tid"] == tid and outer["ts"] <= inner_ts <= outer["ts"] + outer["dur"])


def _top_level(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ATen ops not nested inside another ATen op on the same thread."""
    tops: list[dict[str, Any]] = []
    by_tid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for op in ops:
        by_tid[op["tid"]].append(op)
    for items in by_tid.values():
        items.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = -1.0
        for op in items:
            if op["ts"] >= end:
                tops.append(op)
                end = op["ts"] + op["dur"]
    return tops


def account(events: list[dict[str, Any]], token: str, device: str, symbols: set[str]) -> Accounting:
    """The profiled call's accounting; of several profiled calls (CPU), the lowest custom share.

    CPU accounting is wall time, so a call preempted inside the extension (or slow to wake its thread
    pool) shows extra "own" time; the lowest share is the least disturbed call, and a candidate that
    does its real work in only some calls is judged by the others.
    """
    spans = [e for e in events if e["cat"] == "user_annotation" and e["name"].startswith(f"{token}::")]
    forwards = [e for e in spans if e["name"] == f"{token}::{CALL_SPAN}"]
    if not forwards:
        return Accounting(note="the profiled call left no trace")
    custom_spans = [e for e in spans if e["name"] != f"{token}::{CALL_SPAN}"]
    # A Triton kernel compiles to a kernel of its jit function's name: a known symbol of the candidate's
    # (for kernels whose launch the trace did not record), as the `__global__` names of its sources are.
    symbols = symbols | {n.split(TRITON_SPAN, 1)[1] for s in custom_spans if TRITON_SPAN in (n := s["name"])}
    results = []
    for forward in forwards[: 1 if device == "cuda" else None]:
        lo, hi = forward["ts"], forward["ts"] + forward["dur"]
        ops = [e for e in events if e["cat"] == "cpu_op" and lo <= e["ts"] <= hi]
        if device == "cuda":
            results.append(_account_gpu(events, custom_spans, ops, symbols, lo, hi))
        else:
            inside = [s for s in custom_spans if lo <= s["ts"] <= hi]
            results.append(_account_cpu(inside, ops))
    return min(results, key=lambda a: (a.custom_count > 0, a.share("custom")))


def _account_cpu(custom_spans: list[dict[str, Any]], ops: list[dict[str, Any]]) -> Accounting:
    acc = Accounting()
    tops = _top_level(ops)
    groups: dict[tuple[str, str], Kernel] = {}

    def add(name: str, origin: str, ms: float) -> None:
        k = groups.setdefault((name, origin), Kernel(name=name, origin=origin))
        k.time_ms += ms
        k.calls += 1

    for span in custom_spans:
        inside = [op for op in tops if _contains(span, op["ts"], op["tid"])]
        own_ms = max(0.0, span["dur"] - sum(op["dur"] for op in inside)) / 1e3
        add(span["name"].split("::", 1)[1], "custom", own_ms)
        acc.custom_ms += own_ms
        acc.custom_count += 1
    for op in tops:
        view = CPU_VIEW.match(op["name"]) and not any(
            CPU_COPIES.match(c["name"]) for c in ops if c is not op and _contains(op, c["ts"], c["tid"])
        )
        if CPU_ALLOCATION.match(op["name"]) or view:
            origin = "copy"
        else:
            origin = "library" if CPU_LIBRARY.match(op["name"]) else "torch"
        ms = op["dur"] / 1e3
        add(op["name"], origin, ms)
        if origin == "library":
            acc.library_ms += ms
        elif origin == "copy":
            acc.copy_ms += ms
        else:
            acc.torch_ms += ms
    acc.total_ms = acc.custom_ms + acc.library_ms + acc.torch_ms + acc.copy_ms
    acc.kernels = sorted(groups.values(), key=lambda k: -k.time_ms)
    return acc


def _account_gpu(
    events: list[dict[str, Any]],
    custom_spans: list[dict[str, Any]],
    ops: list[dict[str, Any]],
    symbols: set[str],
    lo: float,
    hi: float,
) -> Accounting:
    acc = Accounting()
    runtime = [e for e in events if e["cat"] in ("cuda_runtime", "cuda_driver")]
    launches = {
        e["correlation"]: e
        for e in runtime
        if e["name"].startswith(LAUNCHES) and e["correlation"] is not None
    }
    device_work = [e for e in events if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    marker = next((e for e in device_work if e["cat"] == "kernel" and "spin" in e["name"].lower()), None)
    if marker is not None:
        acc.caller_stream = marker.get("stream")
    groups: dict[tuple[str, str, int], Kernel] = {}
    first_side_launch: float | None = None
    for e in device_work:
        if e is marker:
            continue
        launch = launches.get(e.get("correlation"))
        if launch is not None and not (lo <= launch["ts"] <= hi):
            continue
        if e["cat"] != "kernel":
            origin = "copy"
        elif launch is not None:
            around = [s for s in custom_spans if _contains(s, launch["ts"], launch["tid"])]
            in_op = any(_contains(op, launch["ts"], launch["tid"]) for op in ops)
            if around and not in_op:
                # The candidate's own kernel may carry a library-like word (`gemm_bias_relu_kernel`);
                # a kernel it defines and launches is custom whatever its name, and so is the kernel a
                # launch of its Triton kernel `gemm_kernel` compiles to.
                jit = {n.split(TRITON_SPAN, 1)[1] for s in around if TRITON_SPAN in (n := s["name"])}
                custom = _defined_by(e["name"], symbols | jit) or not GPU_LIBRARY.search(e["name"])
                origin = "custom" if custom else "library"
            else:
                origin = "library" if GPU_LIBRARY.search(e["name"]) else "torch"
        elif any(re.search(rf"\b{re.escape(s)}\b", e["name"]) for s in symbols - {CUTLASS_SOURCES}):
            origin = "custom"
        else:
            origin = "library" if GPU_LIBRARY.search(e["name"]) else "torch"
        stream = int(e.get("stream") or 0)
        ms = e["dur"] / 1e3
        key = (e["name"], origin, stream)
        k = groups.setdefault(key, Kernel(name=e["name"], origin=origin, stream=stream))
        k.time_ms += ms
        k.calls += 1
        if origin == "custom":
            acc.custom_ms += ms
            acc.custom_count += 1
            if acc.caller_stream is not None and stream != acc.caller_stream:
                acc.side_stream_custom.append(e["name"][:120])
                ts = launch["ts"] if launch is not None else e["ts"]
                first_side_launch = ts if first_side_launch is None else min(first_side_launch, ts)
        elif origin == "library":
            acc.library_ms += ms
        elif origin == "copy":
            acc.copy_ms += ms
        else:
            acc.torch_ms += ms
    if first_side_launch is not None:
        acc.joined = any(e["name"].startswith(JOINS) and first_side_launch <= e["ts"] <= hi for e in runtime)
    acc.total_ms = acc.custom_ms + acc.library_ms + acc.torch_ms + acc.copy_ms
    acc.kernels = sorted(groups.values(), key=lambda k: -k.time_ms)
    return acc
