"""The built-in Coder's CUDA programs under several variants, timed side by side with eager PyTorch and
`torch.compile` in one process, at the problem's own size.

    python benchmarks/variant_speed.py PROBLEM.py [PROBLEM.py ...] \
        [--variants default mma=simt epilogue=kernel] [--policy strict] [--rounds 15] [--profile 12] \
        [--out result.json]

Per problem: every variant's program is built (in parallel, one process per build), checked against the
float32 reference (largest error relative to the reference's largest magnitude), then all of them, eager and
`torch.compile` are timed interleaved, round by round, with CUDA events (median of the rounds). Float32
without TF32 for the baselines, as the Verifier times them. A debugging aid beside the Verifier, which gives
the headline figures (`stitchcuda bench`): it tells which of the optimize skill's variants pays on a device.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared import cutlass
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy


def parse_variant(text: str) -> Variant:
    if text == "default":
        return Variant(gemm="custom")
    pairs = dict(item.split("=", 1) for item in text.split(","))
    return Variant.from_map({"gemm": "custom", **pairs})


def build(ref: str, variant_text: str, policy: str, root: str) -> tuple[str, dict[str, str], float]:
    """Writes and builds one variant's program (in a worker process); returns its module name and sources."""
    from torch.utils.cpp_extension import load

    synthesis = Synthesizer(in_process=True).synthesize(
        ref, None, variant=parse_variant(variant_text), device="cuda", policy=KernelPolicy(policy)
    )
    name = f"{synthesis.build.extension_name}_{zlib.crc32(variant_text.encode()):08x}"
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, content in synthesis.files.items():
        (folder / file).write_text(content.replace(synthesis.build.extension_name, name))
    started = time.monotonic()
    load(
        name=name,
        sources=[str(folder / s) for s in synthesis.build.sources],
        extra_cflags=list(synthesis.build.cflags),
        extra_cuda_cflags=[*synthesis.build.cuda_cflags, *cutlass.build_flags(synthesis.files.values())],
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(folder),
    )
    return (
        name,
        {"model_new.py": synthesis.files["model_new.py"].replace(synthesis.build.extension_name, name)},
        (time.monotonic() - started),
    )


def timed(fn: Any, inputs: list[Any]) -> float:
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    fn(*inputs)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def kernel_profile(fn: Any, inputs: list[Any], top: int) -> list[dict[str, Any]]:
    """The `top` kernels by GPU time in one call of `fn`: name (shortened), calls, total microseconds."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        row = rows.setdefault(event.name[:120], [0, 0.0])
        row[0] += 1
        row[1] += float(event.device_time)
    ranked = sorted(rows.items(), key=lambda item: -item[1][1])[:top]
    return [{"kernel": name, "calls": int(calls), "us": round(us, 1)} for name, (calls, us) in ranked]


def run_problem(
    path: Path, variants: list[str], policy: str, rounds: int, root: Path, profile_top: int = 0
) -> dict[str, Any]:
    ref = path.read_text()
    with ProcessPoolExecutor(max_workers=len(variants)) as pool:
        futures = {v: pool.submit(build, ref, v, policy, str(root)) for v in variants}
        built: dict[str, tuple[str, dict[str, str], float]] = {}
        errors: dict[str, str] = {}
        for v, future in futures.items():
            try:
                built[v] = future.result()
            except Exception as exc:  # a variant that does not build is reported, not fatal
                errors[v] = (
                    str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
                )
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(ref, str(path), "exec"), ns)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    model = ns["Model"](*init).cuda()  # as constructed, as the Verifier runs it
    torch.manual_seed(1)
    inputs = [x.cuda() if torch.is_tensor(x) else x for x in ns["get_inputs"]()]
    programs: dict[str, Any] = {"eager": model}
    for v, (name, files, _) in built.items():
        folder = root / name
        spec = importlib.util.spec_from_file_location(name, next(folder.glob(f"{name}*.so")))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
        mn: dict[str, Any] = {"__name__": f"model_new_{name}"}
        exec(compile(files["model_new.py"], "model_new.py", "exec"), mn)
        torch.manual_seed(0)
        programs[v] = mn["ModelNew"](*init).cuda()
    result: dict[str, Any] = {"problem": path.stem, "errors": errors, "build_s": {}, "max_rel_err": {}}
    with torch.no_grad():
        expected = model(*inputs)
        scale = max(float(expected.abs().max()), 1e-30)
        for v in built:
            result["build_s"][v] = round(built[v][2], 1)
            got = programs[v](*inputs)
            result["max_rel_err"][v] = float((got - expected).abs().max()) / scale
        try:
            programs["torch.compile"] = torch.compile(model)
            programs["torch.compile"](*inputs)
        except Exception as exc:  # reported beside the figures
            errors["torch.compile"] = str(exc).splitlines()[0][:300]
        for fn in programs.values():
            for _ in range(3):
                fn(*inputs)
        samples: dict[str, list[float]] = {k: [] for k in programs}
        for _ in range(rounds):
            for key, fn in programs.items():
                samples[key].append(timed(fn, inputs))
        if profile_top:
            result["profile"] = {k: kernel_profile(fn, inputs, profile_top) for k, fn in programs.items()}
    ms = {k: statistics.median(s) for k, s in samples.items()}
    result["ms"] = {k: round(v, 4) for k, v in ms.items()}
    result["vs_eager"] = {k: round(ms["eager"] / v, 3) for k, v in ms.items() if k not in ("eager",)}
    if "torch.compile" in ms:
        result["vs_compile"] = {k: round(ms["torch.compile"] / v, 3) for k, v in ms.items() if k in built}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--variants", nargs="+", default=["default", "mma=simt", "epilogue=kernel"])
    parser.add_argument("--policy", choices=[STRICT, LIBRARY], default=STRICT)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", type=int, default=0, metavar="K", help="K slowest kernels")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = []
    with tempfile.TemporaryDirectory(prefix="stitch-variants-") as tmp:
        for path in args.problems:
            started = time.monotonic()
            try:
                r = run_problem(path, args.variants, args.policy, args.rounds, Path(tmp), args.profile)
            except Exception as exc:  # one problem's failure does not end the run
                r = {"problem": path.stem, "failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
            r["wall_s"] = round(time.monotonic() - started, 1)
            results.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
