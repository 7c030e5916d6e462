"""A naive KernelBench-style evaluator, kept only as the baseline of benchmarks/verifier_throughput.py.

It does what the common harnesses do, and is fooled the way they are: exec the reference and the
candidate in this process, JIT-build the candidate's load_inline extension in a fresh build folder,
5 correctness trials with fixed seeds and torch.allclose(atol=rtol=1e-2), then 100 timed runs with
CUDA events on the current stream (perf_counter on a CPU). Do not use it to judge anything.
"""

from __future__ import annotations

import os
import tempfile
import time
import types
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class NaiveResult:
    compiled: bool
    correct: bool
    speedup: float
    runtime_ms: float
    baseline_ms: float
    seconds: float
    error: str = ""


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _time(fn: Any, inputs: list[Any], device: str, runs: int) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            times = []
            for _ in range(runs):
                start.record()
                fn(*inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            return float(sum(times) / len(times))
        t0 = time.perf_counter()
        for _ in range(runs):
            fn(*inputs)
        return (time.perf_counter() - t0) / runs * 1e3


def evaluate(
    reference_source: str, candidate_source: str, device: str, *, trials: int = 5, runs: int = 100
) -> NaiveResult:
    started = time.perf_counter()
    ref = _module("reference", reference_source)
    build_dir = tempfile.mkdtemp(prefix="naive-ext-")
    os.environ["TORCH_EXTENSIONS_DIR"] = build_dir  # a fresh folder per candidate, as KernelBench does
    try:
        cand = _module("candidate", candidate_source)
    except Exception as exc:
        return NaiveResult(
            False, False, 0.0, 0.0, 0.0, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
        )
    init = ref.get_init_inputs()
    torch.manual_seed(42)
    model = ref.Model(*init).to(device)
    torch.manual_seed(42)
    model_new = cand.ModelNew(*init).to(device)
    try:
        with torch.no_grad():
            for trial in range(trials):
                torch.manual_seed(42 + trial)
                inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
                expected = model(*inputs)
                got = model_new(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                if got.shape != expected.shape or not torch.allclose(got, expected, atol=1e-2, rtol=1e-2):
                    return NaiveResult(True, False, 0.0, 0.0, 0.0, time.perf_counter() - started, "mismatch")
        torch.manual_seed(42)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
        runtime = _time(model_new, inputs, device, runs)
        baseline = _time(model, inputs, device, runs)
    except Exception as exc:
        return NaiveResult(
            True, False, 0.0, 0.0, 0.0, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
        )
    speedup = baseline / runtime if runtime > 0 else float("inf")
    return NaiveResult(True, True, speedup, runtime, baseline, time.perf_counter() - started)
