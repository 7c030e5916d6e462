"""The built-in synthesizer against eager PyTorch and torch.compile on the problem suite.

Two phases, so the measuring machine needs nothing but torch:
  python benchmarks/synth_suite.py emit DIR [--device cuda] [--size large] [--variant k=v,...]  (stitchcuda)
  python benchmarks/synth_suite.py run DIR [--size large] [--no-compile] [--out results.json]
`all DIR` does both. `emit` writes one folder per problem (the candidate's files, manifest.json, the
reference); `run` builds every extension (in parallel), checks each program against a float64
evaluation of the reference on fresh inputs, times candidate, eager and torch.compile with device
events (rotating input sets, L2 flushed between iterations, median of the runs), and reports per-problem
speedups, their geometric means, and for programs with no library call the achieved bandwidth
(inputs + parameters + outputs, each counted once) against a measured device-to-device copy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PROBLEMS = ROOT / "problems"
# Operator + epilogue problems: the geomean target over torch.compile applies to these.
EPILOGUE_PROBLEMS = {"06_gemm_bias_relu", "07_conv_relu", "08_mlp", "09_cnn_block", "13_residual_block"}


# ---- emit (runs where stitchcuda is installed) -----------------------------------------------------------
def emit(out_dir: Path, device: str, variant: str, names: list[str]) -> None:
    from stitchcuda.coder.synth.ir import Unsupported
    from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
    from stitchcuda.coder.synth.variants import Variant
    from stitchcuda.shared.candidate import write_dir

    knobs = dict(kv.split("=", 1) for kv in variant.split(",") if kv)
    synth = Synthesizer(in_process=True)  # the suite's references are trusted
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = (PROBLEMS / f"{name}.py").read_text()
        target = out_dir / name
        try:
            synthesis = synth.synthesize(source, None, variant=Variant(**knobs), device=device)
        except Unsupported as exc:
            print(f"{name}: not synthesized: {exc}")
            continue
        cand = to_candidate(synthesis)
        write_dir(cand, target)
        (target / "reference.py").write_text(source)
        (target / "info.json").write_text(
            json.dumps(
                {
                    "rationale": cand.rationale,
                    "features": synthesis.features,
                    "variant": dict(cand.variant),
                    "size": os.environ.get("STITCHCUDA_SIZE", "small"),
                }
            )
        )
        print(f"{name}: {cand.build.extension_name} ({cand.rationale})")


# ---- run (torch only) ----------------------------------------------------------------------------
def _build(folder: str) -> tuple[str, str, float]:
    from torch.utils.cpp_extension import load

    path = Path(folder)
    manifest = json.loads((path / "manifest.json").read_text())
    started = time.time()
    try:
        load(
            name=manifest["extension_name"],
            sources=[str(path / s) for s in manifest["sources"]],
            extra_cflags=manifest["cflags"],
            extra_cuda_cflags=manifest["cuda_cflags"],
            extra_ldflags=manifest["ldflags"],
            build_directory=str(path),
            verbose=False,
        )
        return folder, "", time.time() - started
    except Exception as exc:
        return folder, f"{type(exc).__name__}: {str(exc)[-2000:]}", time.time() - started


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


def _timer(device: str) -> Any:
    import torch

    flush = torch.empty(64 * 1024 * 1024, dtype=torch.float32, device=device) if device == "cuda" else None

    def measure(fn: Any, input_sets: list[list[Any]], iters: int) -> float:
        with torch.no_grad():
            for xs in input_sets[:2]:
                fn(*xs)
            times = []
            for i in range(iters):
                xs = input_sets[i % len(input_sets)]
                if device == "cuda":
                    assert flush is not None
                    flush.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn(*xs)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    fn(*xs)
                    times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    return measure


def _copy_bandwidth(device: str) -> float:
    """GB/s of a large device-to-device copy, counting bytes read plus bytes written."""
    import torch

    if device != "cuda":
        return 0.0
    src = torch.randn(256 * 1024 * 1024, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 4 * 10 / (start.elapsed_time(end) * 1e-3) / 1e9


def _rel(got: Any, want: Any) -> float:
    import torch

    if isinstance(want, tuple | list):
        return max(_rel(g, w) for g, w in zip(got, want, strict=True))
    if not want.dtype.is_floating_point:
        return 0.0 if torch.equal(got.cpu(), want.cpu()) else math.inf
    diff = (got.double() - want.double()).norm().item()
    return diff / max(want.double().norm().item(), 1e-30)


def run_problem(folder: Path, device: str, compile_baseline: bool, iters: int) -> dict[str, Any]:
    import torch

    manifest = json.loads((folder / "manifest.json").read_text())
    info = json.loads((folder / "info.json").read_text())
    name = folder.name
    ext_name = manifest["extension_name"]
    spec = importlib.util.spec_from_file_location(ext_name, next(folder.glob(f"{ext_name}*.so")))
    assert spec is not None and spec.loader is not None
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    sys.modules[ext_name] = ext
    ref_mod = _module(f"ref_{name}", (folder / "reference.py").read_text())
    new_mod = _module(f"new_{name}", (folder / "model_new.py").read_text())
    init = ref_mod.get_init_inputs()
    torch.manual_seed(0)
    ref = ref_mod.Model(*init).to(device)
    torch.manual_seed(0)
    new = new_mod.ModelNew(*init).to(device)
    ref.eval()
    new.eval()
    sets = []
    for seed in range(3):
        torch.manual_seed(100 + seed)
        sets.append([x.to(device) if isinstance(x, torch.Tensor) else x for x in ref_mod.get_inputs()])
    # Correctness against float64 on two fresh input sets (one shifted: x * 3 + 0.5).
    ref64 = ref_mod.Model(*init)
    ref64.load_state_dict(ref.state_dict())
    ref64 = ref64.to(device).double().eval()
    worst = 0.0
    with torch.no_grad():
        for xs in (sets[0], [x * 3 + 0.5 if isinstance(x, torch.Tensor) else x for x in sets[1]]):
            want = ref64(*[x.double() if isinstance(x, torch.Tensor) else x for x in xs])
            got = new(*xs)
            worst = max(worst, _rel(got, want))
    del ref64
    measure = _timer(device)
    result: dict[str, Any] = {"problem": name, "rel_l2": worst, "correct": worst <= 1e-4, **info}
    result["ours_ms"] = measure(new, sets, iters)
    result["eager_ms"] = measure(ref, sets, iters)
    if compile_baseline:
        try:
            compiled = torch.compile(ref)
            result["compile_ms"] = measure(compiled, sets, iters)
        except Exception as exc:
            result["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    result["speedup_eager"] = result["eager_ms"] / result["ours_ms"]
    if "compile_ms" in result:
        result["speedup_compile"] = result["compile_ms"] / result["ours_ms"]
    if "library" not in info.get("features", []):
        with torch.no_grad():
            outs = new(*sets[0])
        outs = outs if isinstance(outs, tuple | list) else [outs]
        moved = sum(x.numel() * x.element_size() for x in sets[0] if isinstance(x, torch.Tensor))
        moved += sum(p.numel() * p.element_size() for p in list(new.parameters()) + list(new.buffers()))
        moved += sum(o.numel() * o.element_size() for o in outs)
        result["bytes"] = moved
        result["achieved_gbs"] = moved / (result["ours_ms"] * 1e-3) / 1e9
    return result


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def run(
    out_dir: Path,
    device: str,
    compile_baseline: bool,
    iters: int,
    results_path: Path | None,
    jobs: int,
    names: list[str] | None = None,
) -> None:
    import torch

    # Float32 means float32: no TF32 in cuBLAS or cuDNN, for the reference and the candidate alike.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    folders = sorted(
        p for p in out_dir.iterdir() if (p / "manifest.json").is_file() and (not names or p.name in names)
    )
    print(f"building {len(folders)} extensions with {jobs} processes", flush=True)
    errors: dict[str, str] = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        for folder, error, seconds in pool.map(_build, [str(f) for f in folders]):
            print(f"  {Path(folder).name}: {'ok' if not error else 'FAILED'} ({seconds:.0f} s)", flush=True)
            if error:
                errors[Path(folder).name] = error
    copy_gbs = _copy_bandwidth(device)
    rows: list[dict[str, Any]] = []
    for folder in folders:
        if folder.name in errors:
            rows.append({"problem": folder.name, "build_error": errors[folder.name]})
            continue
        try:
            rows.append(run_problem(folder, device, compile_baseline, iters))
        except Exception as exc:
            rows.append(
                {
                    "problem": folder.name,
                    "run_error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc()[-1500:],
                }
            )
        row = rows[-1]
        print(json.dumps({k: v for k, v in row.items() if k not in ("trace", "variant")})[:400], flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    good = [r for r in rows if r.get("correct")]
    summary = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "copy_gbs": copy_gbs,
        "geomean_vs_eager": geomean([r["speedup_eager"] for r in good]),
        "geomean_vs_compile": geomean([r["speedup_compile"] for r in good if "speedup_compile" in r]),
        "geomean_vs_compile_epilogue": geomean(
            [
                r["speedup_compile"]
                for r in good
                if "speedup_compile" in r and r["problem"] in EPILOGUE_PROBLEMS
            ]
        ),
        "rows": rows,
    }
    print()
    print(
        f"{'problem':24} {'ok':>3} {'rel_l2':>9} {'ours ms':>9} {'eager':>9} {'compile':>9} "
        f"{'x eager':>8} {'x comp':>7} {'GB/s':>7} {'% copy':>6}"
    )
    for r in rows:
        if "ours_ms" not in r:
            print(f"{r['problem']:24} ERR {(r.get('build_error') or r.get('run_error', ''))[:90]}")
            continue
        gbs = r.get("achieved_gbs")
        pct = f"{100 * gbs / copy_gbs:5.0f}%" if gbs and copy_gbs else ""
        print(
            f"{r['problem']:24} {'yes' if r['correct'] else 'NO':>3} {r['rel_l2']:9.1e} {r['ours_ms']:9.3f} "
            f"{r['eager_ms']:9.3f} {r.get('compile_ms', float('nan')):9.3f} {r['speedup_eager']:8.2f} "
            f"{r.get('speedup_compile', float('nan')):7.2f} {gbs or float('nan'):7.0f} {pct:>6}"
        )
    print(
        f"geomean: {summary['geomean_vs_eager']:.2f}x vs eager, "
        f"{summary['geomean_vs_compile']:.2f}x vs torch.compile, "
        f"{summary['geomean_vs_compile_epilogue']:.2f}x vs torch.compile on operator+epilogue problems; "
        f"copy {copy_gbs:.0f} GB/s"
    )
    if results_path is not None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(summary, indent=2, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=["emit", "run", "all"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--variant", default="", help="synthesizer knobs, e.g. vec=4,block=256")
    parser.add_argument("--problems", nargs="*", default=[], help="problem stems (default: the whole suite)")
    parser.add_argument(
        "--size",
        default="large",
        choices=["small", "large"],
        help="STITCHCUDA_SIZE: the problems' constructor arguments and inputs; emit and run must agree",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=max(1, min(16, (os.cpu_count() or 2))))
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args()
    names = args.problems or sorted(p.stem for p in PROBLEMS.glob("[0-9]*.py"))
    # A program is generated for its constructor arguments (head counts, group counts...), which
    # depend on the size: both phases read the problems at the same one.
    os.environ["STITCHCUDA_SIZE"] = args.size
    if args.phase in ("emit", "all"):
        emit(args.dir, args.device, args.variant, names)
    if args.phase in ("run", "all"):
        run(args.dir, args.device, not args.no_compile, args.iters, args.out, args.jobs, args.problems)


if __name__ == "__main__":
    main()
