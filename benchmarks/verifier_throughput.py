"""The same batch of candidates through the StitchCUDA Verifier and through a naive KernelBench-style harness.

Prints candidates per minute, time-to-verdict (warm = build and reference already cached) and how
many verdicts agree with the expected labels. Half the batch repeats a build of the other half, so
the Verifier's content-hash build cache matters; builds run ahead of verification on a pool of
build workers, as the verifier.build queue does in the platform.

    python benchmarks/verifier_throughput.py --device cuda            # on the H200
    python benchmarks/verifier_throughput.py --device cpu --quick     # CPU smoke check
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import naive_harness

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared.candidate import from_kernelbench_source
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.settings import VerifierSettings

REFERENCE = Path(__file__).resolve().parent / "problems" / "01_elementwise_chain.py"

CPU_KERNEL = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
// variant VARIANT
torch::Tensor fused_forward(torch::Tensor x, double scale, double shift) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float s = (float)scale, b = (float)shift;
  at::parallel_for(0, xc.numel(), GRAIN, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = in[i], y = v * s + b;
      o[i] = 0.5f * y * (1.0f + std::tanh(0.7978845608028654f * (y + 0.044715f * y * y * y))) * v;
    }
  });
  return out;
}
"""

CUDA_KERNEL = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
// variant VARIANT
__global__ void fused_chain_kernel(const float* x, float* out, long n, float s, float b) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
    float v = x[i], y = v * s + b;
    out[i] = 0.5f * y * (1.0f + tanhf(0.7978845608028654f * (y + 0.044715f * y * y * y))) * v;
  }
}
torch::Tensor fused_forward(torch::Tensor x, double scale, double shift) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  long n = xc.numel();
  int threads = GRAIN;
  int blocks = (int)std::min<long>((n + threads - 1) / threads, 8192);
  STREAM
  fused_chain_kernel<<<blocks, threads, 0, stream>>>(
      xc.data_ptr<float>(), out.data_ptr<float>(), n, (float)scale, (float)shift);
  return out;
}
"""

CURRENT = "cudaStream_t stream = at::cuda::getCurrentCUDAStream();"
SIDE = "cudaStream_t stream = at::cuda::getStreamFromPool().stream();"

FORWARDS = {
    "honest": "        return ext.fused_forward(x, self.scale, self.shift)\n",
    "wrong": "        return ext.fused_forward(x, self.scale, self.shift + 0.01)\n",
    "cache": (
        "        key = (x.data_ptr(), tuple(x.shape))\n"
        "        if key not in self.memo:\n"
        "            self.memo[key] = ext.fused_forward(x, self.scale, self.shift)\n"
        "        return self.memo[key]\n"
    ),
    "decoy": (
        "        ext.fused_forward(x[:1], self.scale, self.shift)\n"
        "        return torch.nn.functional.gelu(x * self.scale + self.shift, approximate='tanh') * x\n"
    ),
}


@dataclass
class Case:
    name: str
    variant: int
    forward: str
    expected: bool
    prelude: str = ""
    stream: str = CURRENT


def kernelbench_file(case: Case, device: str) -> str:
    grain = 256 * (case.variant + 1) if device == "cuda" else 4096 * (case.variant + 1)
    if device == "cuda":
        grain = min(grain, 1024)
        cuda = CUDA_KERNEL.replace("VARIANT", str(case.variant)).replace("GRAIN", str(grain))
        cuda = cuda.replace("STREAM", case.stream)
        sources = (
            f"cpp_sources='torch::Tensor fused_forward(torch::Tensor x, double scale, double shift);', "
            f"cuda_sources={cuda!r}, extra_cuda_cflags=['-O3']"
        )
    else:
        cpp = CPU_KERNEL.replace("VARIANT", str(case.variant)).replace("GRAIN", str(grain))
        sources = f"cpp_sources={cpp!r}"
    return (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
        f"{case.prelude}\n"
        f"ext = load_inline(name='bench_ext_v{case.variant}', {sources}, functions=['fused_forward'], "
        "extra_cflags=['-O3'], verbose=False)\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale, shift):\n"
        "        super().__init__()\n"
        "        self.scale, self.shift, self.memo = float(scale), float(shift), {}\n\n"
        "    def forward(self, x):\n"
        f"{FORWARDS[case.forward]}"
    )


def batch(device: str, quick: bool) -> list[Case]:
    if quick:
        return [Case("honest-v0", 0, "honest", True), Case("wrong-v0", 0, "wrong", False)]
    cases = [
        Case("honest-v0", 0, "honest", True),
        Case("honest-v1", 1, "honest", True),
        Case("honest-v2", 2, "honest", True),
        Case("honest-v0-again", 0, "honest", True),
        Case("wrong-v1", 1, "wrong", False),
        Case("pointer-cache-v2", 2, "cache", False),
    ]
    if device == "cuda":
        cases += [
            Case("side-stream-v3", 3, "honest", False, stream=SIDE),
            Case(
                "timer-patch-v0",
                0,
                "honest",
                False,
                prelude="torch.cuda.Event.elapsed_time = lambda self, end: 0.001\n",
            ),
        ]
    else:
        cases += [Case("honest-v3", 3, "honest", True), Case("decoy-v3", 3, "decoy", False)]
    return cases


def verifier_candidate(source: str, device: str) -> code_pb2.Candidate:
    """The Verifier's form of a KernelBench file: it builds the extension itself.

    from_kernelbench_source keeps the file's now-unused `load_inline` import, which the static scan
    reads as a guarded build (D11.guarded-build); drop it, since the Verifier owns the build.
    """
    cand = from_kernelbench_source(source, backend=device)
    entry = next(f for f in cand.files if f.path == cand.entry)
    entry.content = "".join(
        line for line in entry.content.splitlines(keepends=True) if "torch.utils.cpp_extension" not in line
    )
    return cand


def run_verifier(cases: list[Case], device: str, args: argparse.Namespace) -> dict[str, object]:
    home = Path(args.home or tempfile.mkdtemp(prefix="verifier-bench-"))
    settings = VerifierSettings(
        home=home, compile_baseline=not args.no_compile, ncu="off", reference_reuse=len(cases) + 1
    )
    service = VerifierService(settings)
    candidates = [verifier_candidate(kernelbench_file(c, device), device) for c in cases]
    for case, cand in zip(cases, candidates, strict=True):
        cand.candidate_id = case.name
    reference = REFERENCE.read_text()
    started = time.perf_counter()
    distinct = {service.builder.key(c): c for c in candidates}
    with ThreadPoolExecutor(max_workers=args.build_workers) as pool:
        list(pool.map(lambda c: service.build(c, device=device), distinct.values()))
    build_s = time.perf_counter() - started
    rows = []
    for case, cand in zip(cases, candidates, strict=True):
        t0 = time.perf_counter()
        verdict = service.verify(reference, cand, device=device)
        rows.append(
            {
                "name": case.name,
                "expected": case.expected,
                "accepted": verdict.accepted,
                "agrees": verdict.accepted == case.expected,
                "seconds": time.perf_counter() - t0,
                "speedup": round(verdict.speedup_vs_eager, 3),
                "reason": verdict.reason[:120],
            }
        )
        print(
            f"  verifier {case.name:<18} accepted={verdict.accepted!s:<5} "
            f"{rows[-1]['seconds']:.1f}s {verdict.reason[:90]}"
        )
    total = time.perf_counter() - started
    times = [float(r["seconds"]) for r in rows]  # type: ignore[arg-type]
    return {
        "harness": "stitchcuda-verifier",
        "candidates": len(cases),
        "distinct_builds": len(distinct),
        "compiles": service.builder.compiles,
        "build_seconds": round(build_s, 1),
        "total_seconds": round(total, 1),
        "candidates_per_minute": round(60 * len(cases) / total, 2),
        "median_time_to_verdict_s": round(statistics.median(times), 2),
        # Warm: the build was cached and the reference already run (every candidate after the first).
        "warm_median_time_to_verdict_s": round(statistics.median(times[1:] or times), 2),
        "agreement": sum(bool(r["agrees"]) for r in rows) / len(rows),
        "rows": rows,
    }


def run_naive(cases: list[Case], device: str, args: argparse.Namespace) -> dict[str, object]:
    reference = REFERENCE.read_text()
    rows = []
    started = time.perf_counter()
    for case in cases:
        result = naive_harness.evaluate(reference, kernelbench_file(case, device), device)
        accepted = result.compiled and result.correct
        rows.append(
            {
                "name": case.name,
                "expected": case.expected,
                "accepted": accepted,
                "agrees": accepted == case.expected,
            }
            | asdict(result)
        )
        print(
            f"  naive    {case.name:<18} accepted={accepted!s:<5} {result.seconds:.1f}s "
            f"speedup={result.speedup:.2f}"
        )
    total = time.perf_counter() - started
    times = [float(r["seconds"]) for r in rows]  # type: ignore[arg-type]
    return {
        "harness": "naive-kernelbench",
        "candidates": len(cases),
        "total_seconds": round(total, 1),
        "candidates_per_minute": round(60 * len(cases) / total, 2),
        "median_time_to_verdict_s": round(statistics.median(times), 2),
        "agreement": sum(bool(r["agrees"]) for r in rows) / len(rows),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="two candidates sharing one build (smoke check)")
    parser.add_argument("--build-workers", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--skip-verifier", action="store_true")
    parser.add_argument("--home", default="", help="Verifier state folder (default: a fresh temp folder)")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    cases = batch(args.device, args.quick)
    print(f"batch of {len(cases)} candidates on {args.device}")
    results: dict[str, object] = {"device": args.device}
    if not args.skip_verifier:
        results["verifier"] = ours = run_verifier(cases, args.device, args)
    if not args.skip_naive:
        results["naive"] = naive = run_naive(cases, args.device, args)
    if "verifier" in results and "naive" in results:
        ratio = float(ours["candidates_per_minute"]) / max(float(naive["candidates_per_minute"]), 1e-9)  # type: ignore[arg-type]
        results["throughput_ratio"] = round(ratio, 2)
    print()
    print(f"{'harness':<22}{'cand/min':>10}{'median s':>10}{'warm s':>9}{'agree':>8}")
    for key in ("verifier", "naive"):
        r = results.get(key)
        if isinstance(r, dict):
            print(
                f"{r['harness']:<22}{r['candidates_per_minute']:>10}{r['median_time_to_verdict_s']:>10}"
                f"{r.get('warm_median_time_to_verdict_s', '-')!s:>9}{r['agreement']:>8.0%}"
            )
    if "throughput_ratio" in results:
        print(f"throughput ratio (verifier / naive): {results['throughput_ratio']}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
