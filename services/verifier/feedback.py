"""Renders a Verdict as text for the Coder's optimize prompt: what failed and where, and where time goes."""

from __future__ import annotations

from stitchcuda.api.v1 import verify_pb2

_LEVEL = {
    verify_pb2.SEVERITY_INFO: "INFO",
    verify_pb2.SEVERITY_WARNING: "WARNING",
    verify_pb2.SEVERITY_REJECT: "REJECT",
}


# Short guidance per rule, attached to the verdict's `docs` for the next optimize round.
HINTS = {
    "build.failed": "Fix the first compiler error; the Verifier builds the extension from manifest.json.",
    "D1.crash": "forward raised or the process died: check bounds, launch configuration and TORCH_CHECKs.",
    "D1.timeout": "The run exceeded its time limit: look for infinite loops or a grid that never finishes.",
    "D3.mismatch": "Outputs differ from float64 ground truth: check the math, reductions and edge tiles.",
    "D3.nonfinite": "NaN/Inf where the reference is finite: guard divisions, exp overflow, unwritten memory.",
    "D3.dtype": "Return exactly the reference's dtype; compute in the problem's precision.",
    "D3.shape": "Return exactly the reference's shape; do not rely on fixed benchmark dimensions.",
    "D5.input-mutated": "Never write into the inputs; allocate the output (torch::empty) and fill it fully.",
    "D5.aliases-output": "Return a new output tensor on each call; outputs cached across calls are rejected.",
    "D5.stride0": "Materialise the full output; broadcast views of one row are rejected.",
    "D6.low-custom-share": "Move the dominant operation (the largest non-custom kernel) into your kernel.",
    "D6.library-kernel": "Write the GEMM/convolution as your own kernel (or use the library policy).",
    "D6.no-custom-kernel": "forward must run the extension's kernels on every call.",
    "D6.skipped-work": "Every call must compute from its inputs; results cached by pointer or count fail.",
    "D6.unjoined-stream": "Work on a side stream must be joined to the caller's stream before returning.",
    "D7.below-floor": "The time is below what the bytes and FLOPs allow: the kernel skipped work.",
    "D8.state-changed": "Do not change global numeric flags (TF32, matmul precision, cudnn settings).",
    "D8.function-replaced": "Do not replace torch or time functions.",
    "D4.off-shape": "Handle any shape: bounds checks on every tile, grids computed from the inputs.",
}


def hints(v: verify_pb2.Verdict, limit: int = 4) -> list[str]:
    found: list[str] = []
    for f in v.findings:
        text = HINTS.get(f.rule)
        if f.severity >= verify_pb2.SEVERITY_WARNING and text and text not in found:
            found.append(f"{f.rule}: {text}")
    return found[:limit]


def _ms(x: float) -> str:
    return f"{x:.4f} ms" if x < 1 else f"{x:.3f} ms"


def render(v: verify_pb2.Verdict, *, max_kernels: int = 8) -> str:
    lines: list[str] = []
    head = "ACCEPTED" if v.accepted else "REJECTED"
    lines.append(f"VERDICT: {head} - {v.reason}")
    b = v.build
    if b.cache_key:
        state = (
            "ok" + (" (cached)" if b.cached else f" ({b.seconds:.1f} s)") if b.ok else f"FAILED: {b.error}"
        )
        lines.append(f"Build: {state}")
    c = v.correctness
    if c.trials:
        failing = [t for t in c.trials if not t.ok]
        if failing:
            lines.append(f"Correctness: FAILED on {len(failing)} of {len(c.trials)} probes")
            for t in failing[:6]:
                lines.append(f"  {t.name}: {t.detail}")
        else:
            lines.append(
                f"Correctness: ok on {len(c.trials)} probes (fresh secret inputs, refills, perturbations, "
                f"shifted distributions, timed-loop samples); worst rel L2 {c.max_rel_l2:.2e} "
                f"(tol {c.tolerance:.1e})"
            )
        if c.shape_probe.name:
            verdict = "ok" if c.shape_probe.ok else f"fails: {c.shape_probe.detail}"
            lines.append(f"  Off-shape probe {c.shape_probe.name}: {verdict}")
    tm = v.timing
    if tm.iterations:
        parts = [
            f"candidate {_ms(tm.median_ms)} median (p10 {_ms(tm.p10_ms)}, p90 {_ms(tm.p90_ms)}, "
            f"n={tm.iterations}; "
            f"wall {_ms(tm.wall_median_ms)})",
            f"eager {_ms(tm.eager_ms)} ({tm.speedup_vs_eager:.2f}x)",
        ]
        parts.append(
            f"torch.compile {_ms(tm.compile_ms)} ({tm.speedup_vs_compile:.2f}x)"
            if tm.compile_available
            else "torch.compile n/a"
        )
        lines.append("Timing: " + " | ".join(parts))
    p = v.profile
    if p.kernels:
        lines.append(
            f"Kernels (one profiled call): custom {p.custom_share:.0%} | library {p.library_share:.0%} | "
            f"torch {p.torch_share:.0%}"
        )
        for k in list(p.kernels)[:max_kernels]:
            counters = ", ".join(f"{name}={value:.1f}" for name, value in sorted(k.counters.items()))
            extra = f" [{counters}]" if counters else ""
            lines.append(
                f"  {k.origin:<8} {_ms(k.time_ms):>12} {k.share:5.0%}  x{k.calls} {k.name[:90]}{extra}"
            )
    if p.floor_ms > 0:
        lines.append(
            f"Bound: {p.bound}-bound; physics floor {_ms(p.floor_ms)}; "
            f"achieved {p.achieved_bandwidth_gbs:.1f} GB/s, "
            f"{p.achieved_tflops:.3f} TFLOP/s"
        )
    interesting = [f for f in v.findings if f.severity >= verify_pb2.SEVERITY_WARNING]
    if interesting:
        lines.append("Findings:")
        for f in interesting[:20]:
            where = f" ({f.where})" if f.where else ""
            lines.append(f"  [{_LEVEL.get(f.severity, '?')}] {f.rule}: {f.detail}{where}")
    if b.log_tail and not b.ok:
        tail = "\n".join(b.log_tail.strip().splitlines()[-12:])
        lines.append("Build log (tail):\n" + tail)
    e = v.environment
    lines.append(
        f"Reproduce: device {e.device_name or '?'}; torch {e.torch_version}; CUDA {e.cuda_version or '-'}; "
        f"driver {e.driver or '-'}; python {e.python_version}; sandbox {e.sandbox}; "
        f"seeds {list(e.seeds)[:4]}..."
    )
    for doc in v.docs[:3]:
        lines.append(f"Doc: {doc}")
    return "\n".join(lines)
