"""Achieved memory bandwidth of the built-in Coder's CUDA reductions at KernelBench level-1 sizes.

    python3 benchmarks/reduce_bandwidth.py [--out FILE.json] [--scale 1.0] [--only NAME ...] [--no-compile]

For each reduction problem below (KernelBench format, written here) it synthesizes the CUDA program, builds
them all in parallel worker processes, and times the program, eager PyTorch and torch.compile with CUDA events
(median of --runs). Bandwidth counts the bytes a problem must move (its inputs read once, its outputs written
once) over the program's time, and is set against the device-to-device copy bandwidth measured in the same run
(a large tensor's clone). Prints a table; --out writes the same rows as JSON. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Spec:
    name: str
    forward: str
    shape: tuple[int, ...]
    # What the layout is: inner, middle, outer, several, total (for the table).
    layout: str
    init: str = "[]"
    module: str = ""
    # The constructor's parameters (get_init_inputs passes them).
    params: str = ""
    # The dim --scale shrinks (None: the largest); a LayerNorm keeps its normalized dims.
    scale_dim: int | None = None


# Level-1 sizes (47/48/49/51/52/53: (128, 4096, 4095) over dim 1; 23: (4096, 393216); 36: (112, 64, 512, 512);
# 39: (32768, 65535)); a small one (16, 256, 256) where launch latency counts.
SPECS = [
    Spec("sum_middle", "torch.sum(x, dim=1)", (128, 4096, 4095), "middle"),
    Spec("mean_middle", "torch.mean(x, dim=1)", (128, 4096, 4095), "middle"),
    Spec("max_middle", "torch.max(x, dim=1)[0]", (128, 4096, 4095), "middle"),
    Spec("argmax_middle", "torch.argmax(x, dim=1)", (128, 4096, 4095), "middle"),
    Spec("argmin_middle", "torch.argmin(x, dim=1)", (128, 4096, 4095), "middle"),
    Spec("prod_middle", "torch.prod(x, dim=1)", (128, 4096, 4095), "middle"),
    Spec("sum_inner", "torch.sum(x, dim=2)", (128, 4096, 4095), "inner"),
    Spec("max_inner", "torch.amax(x, dim=-1)", (128, 4096, 4096), "inner"),
    Spec("sum_outer", "torch.sum(x, dim=0)", (128, 4096, 4095), "outer"),
    Spec("sum_small", "torch.sum(x, dim=1)", (16, 256, 256), "middle"),
    Spec("frobenius", "x / torch.norm(x, p='fro')", (112, 64, 256, 256), "total"),
    Spec("sum_all", "torch.sum(x)", (128, 4096, 4095), "total"),
    Spec("l2norm_rows", "x / torch.norm(x, p=2, dim=1, keepdim=True)", (32768, 65535), "inner"),
    Spec(
        "rmsnorm_middle",
        "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)",
        (112, 64, 512, 512),
        "middle",
    ),
    Spec("softmax_rows", "torch.softmax(x, dim=1)", (4096, 393216), "inner"),
    Spec(
        "layernorm",
        "self.ln(x)",
        (16, 64, 256, 256),
        "inner",
        init="[(64, 256, 256)]",
        module="        self.ln = nn.LayerNorm(shape)\n",
        params="shape",
        scale_dim=0,
    ),
    Spec(
        "maxpool2d",
        "self.pool(x)",
        (32, 64, 512, 512),
        "pool",
        module="        self.pool = nn.MaxPool2d(3, stride=2, padding=1)\n",
        scale_dim=2,
    ),
    Spec(
        "maxpool3d",
        "self.pool(x)",
        (16, 32, 128, 128, 128),
        "pool",
        module="        self.pool = nn.MaxPool3d(3, stride=2, padding=1)\n",
        scale_dim=2,
    ),
]


def scaled(shape: tuple[int, ...], scale: float, dim: int | None = None) -> tuple[int, ...]:
    """The shape with one dim (the largest by default) scaled, at least 1: --scale makes a quick run."""
    if scale == 1.0:
        return shape
    big = max(range(len(shape)), key=lambda i: shape[i]) if dim is None else dim
    return tuple(max(1, round(s * scale)) if i == big else s for i, s in enumerate(shape))


def source(spec: Spec, scale: float = 1.0) -> str:
    """The problem in KernelBench format."""
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self{', ' + spec.params if spec.params else ''}):\n"
        f"        super().__init__()\n{spec.module}\n"
        f"    def forward(self, x):\n        return {spec.forward}\n\n"
        f"def get_inputs():\n    return [torch.rand{scaled(spec.shape, scale, spec.scale_dim)}]\n\n"
        f"def get_init_inputs():\n    return {spec.init}\n"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--only", nargs="+", default=[], help="problem names (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="scale of each problem's largest dim")
    p.add_argument("--runs", type=int, default=10, help="timed runs per program (median)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--jobs", type=int, default=8, help="parallel builds")
    args = p.parse_args(argv)
    unknown = set(args.only) - {s.name for s in SPECS}
    if unknown:
        p.error(f"unknown problems: {', '.join(sorted(unknown))}")
    if not 0 < args.scale <= 1:
        p.error("--scale must be in (0, 1]")
    return args


def build(name: str, src: str, root: str) -> dict[str, Any]:
    """Worker process: synthesize and build; returns what loading it again needs, model_new.py, seconds."""
    from torch.utils.cpp_extension import load

    from stitchcuda.coder.synth.synthesizer import Synthesizer
    from stitchcuda.coder.synth.variants import Variant

    started = time.monotonic()
    synthesis = Synthesizer(in_process=True).synthesize(src, None, variant=Variant(), device="cuda")
    folder = Path(root) / synthesis.build.extension_name
    folder.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (folder / path).write_text(content)
    spec = {
        "name": synthesis.build.extension_name,
        "sources": [str(folder / s) for s in synthesis.build.sources],
        "extra_cflags": list(synthesis.build.cflags),
        "extra_cuda_cflags": list(synthesis.build.cuda_cflags),
        "extra_ldflags": list(synthesis.build.ldflags),
        "build_directory": str(folder),
    }
    load(**spec)
    return {"load": spec, "model_new": synthesis.files["model_new.py"], "seconds": time.monotonic() - started}


def median_ms(fn: Any, runs: int) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def copy_bandwidth(runs: int) -> float:
    """GB/s of a 4 GiB device-to-device clone (read plus write)."""
    import torch

    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    ms = median_ms(x.clone, runs)
    return 2 * x.nbytes / ms / 1e6


def output_error(got: Any, want: Any) -> float:
    """Largest |got - want| over the largest |want| (float outputs), or the share of differing indices."""
    import torch

    if want.dtype == torch.int64:
        return float((got != want).float().mean()) if want.numel() else 0.0
    scale = float(want.abs().max()) if want.numel() else 0.0
    return float((got - want).abs().max()) / scale if scale else 0.0


def measure(
    spec: Spec, src: str, wait_build: Callable[[], dict[str, Any] | None], args: argparse.Namespace
) -> dict[str, Any]:
    """Eager and torch.compile first (while the workers build), then the built program."""
    import torch
    from torch.utils.cpp_extension import load

    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(src, f"{spec.name}.py", "exec"), ns)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
    row: dict[str, Any] = {"name": spec.name, "layout": spec.layout, "shape": list(inputs[0].shape)}
    with torch.no_grad():
        want = model(*inputs)
        outputs = want if isinstance(want, tuple) else (want,)
        moved = sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs)
        row["bytes"] = moved
        row["eager_ms"] = median_ms(lambda: model(*inputs), args.runs)
        if not args.no_compile:
            compiled = torch.compile(model)
            row["compile_ms"] = median_ms(lambda: compiled(*inputs), args.runs)  # type: ignore[no-untyped-call]
            del compiled
        built = wait_build()
        if built is None:
            row["error"] = "synthesis or build failed (see stderr)"
            return row
        row["build_s"] = round(built["seconds"], 1)
        # Built by a worker with the same arguments: ninja finds it up to date, this only imports it.
        sys.modules[built["load"]["name"]] = load(**built["load"])
        mn: dict[str, Any] = {"__name__": "model_new"}
        exec(compile(built["model_new"], "model_new.py", "exec"), mn)
        torch.manual_seed(0)
        with torch.device("cuda"):
            new = mn["ModelNew"](*ns["get_init_inputs"]())
        got = new(*inputs)
        got_t = got if isinstance(got, tuple) else (got,)
        row["rel_error"] = max(output_error(g, w) for g, w in zip(got_t, outputs, strict=True))
        del got, got_t
        row["synth_ms"] = median_ms(lambda: new(*inputs), args.runs)
    row["gbps"] = moved / row["synth_ms"] / 1e6
    row["vs_eager"] = row["eager_ms"] / row["synth_ms"]
    if "compile_ms" in row:
        row["vs_compile"] = row["compile_ms"] / row["synth_ms"]
    return row


def table(rows: list[dict[str, Any]], copy_gbps: float) -> str:
    head = f"{'problem':16} {'layout':7} {'GB/s':>8} {'%copy':>6} {'synth ms':>9} {'x eager':>8}"
    head += f" {'x compile':>9}"
    lines = [f"device-to-device copy: {copy_gbps:.0f} GB/s", head, "-" * len(head)]
    for r in rows:
        if "synth_ms" not in r:
            lines.append(f"{r['name']:16} {r['layout']:7} {r.get('error', 'no result')}")
            continue
        comp = f"{r['vs_compile']:9.2f}" if "vs_compile" in r else f"{'-':>9}"
        wrong = f"  WRONG (relative error {r['rel_error']:.1e})" if r["rel_error"] > 1e-4 else ""
        lines.append(
            f"{r['name']:16} {r['layout']:7} {r['gbps']:8.0f} {100 * r['pct_copy']:5.0f}% "
            f"{r['synth_ms']:9.3f} {r['vs_eager']:8.2f} {comp}{wrong}"
        )
    timed = [r for r in rows if "synth_ms" in r]
    for key in ("vs_eager", "vs_compile"):
        ratios = [r[key] for r in timed if key in r]
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            lines.append(f"geomean {key.replace('_', ' ')}: {geo:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("reduce_bandwidth: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    specs = [s for s in SPECS if not args.only or s.name in args.only]
    sources = {s.name: source(s, args.scale) for s in specs}
    root = tempfile.mkdtemp(prefix="reduce-bw-")
    started = time.monotonic()
    rows = []
    # Workers synthesize and build every program while this process measures the copy and the baselines.
    # Spawned, not forked: this process holds a CUDA context the workers must not inherit.
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(build, name, src, root) for name, src in sources.items()}
        copy_gbps = copy_bandwidth(args.runs)
        for spec in specs:
            fut = futures[spec.name]

            def wait_build(fut: Future[dict[str, Any]] = fut, name: str = spec.name) -> dict[str, Any] | None:
                try:
                    return fut.result()
                except Exception as exc:  # a failed build is a row of the table, not the end of the run
                    print(f"{name}: {type(exc).__name__}: {str(exc)[-2000:]}", file=sys.stderr)
                    return None

            try:
                row = measure(spec, sources[spec.name], wait_build, args)
            except Exception as exc:
                row = {
                    "name": spec.name,
                    "layout": spec.layout,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
            if "gbps" in row:
                row["pct_copy"] = row["gbps"] / copy_gbps
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    print(f"{len(rows)} problems in {time.monotonic() - started:.0f} s")
    print(table(rows, copy_gbps))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"copy_gbps": copy_gbps, "device": torch.cuda.get_device_name(), "rows": rows}
        args.out.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["SPECS", "Spec", "main", "parse_args", "scaled", "source"]
