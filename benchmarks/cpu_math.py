"""The synthesizer's host exp/tanh (stitch_runtime.h) against torch's, side by side in one run.

Builds a tiny extension whose loops are written the way the CPU back end writes them (a __restrict__ range
function, cloned for x86-64-v3, under at::parallel_for) and prints accuracy against float64 and the time per
call next to torch.exp / torch.tanh on the same tensor.

    python benchmarks/cpu_math.py [--numel 4194304] [--threads 1] [--iters 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from stitchcuda.coder.synth.cpu import CFLAGS, LDFLAGS
from stitchcuda.coder.synth.runtime import HEADER, HEADER_NAME

SOURCE = r"""
#include "stitch_runtime.h"
#include <ATen/Parallel.h>
using namespace stitch;

#define RANGE(NAME, EXPR)                                                                  \
  STITCH_CPU_CLONES static void NAME##_range(int64_t b, int64_t e, const float* __restrict__ x, \
                                             float* __restrict__ y) {                        \
    for (int64_t i = b; i < e; ++i) y[i] = EXPR(x[i]);                                     \
  }                                                                                         \
  at::Tensor NAME(at::Tensor x) {                                                           \
    auto y = at::empty_like(x);                                                             \
    const float* xp = x.data_ptr<float>();                                                  \
    float* yp = y.data_ptr<float>();                                                        \
    at::parallel_for(0, x.numel(), 32768, [&](int64_t b, int64_t e) { NAME##_range(b, e, xp, yp); }); \
    return y;                                                                               \
  }

RANGE(ours_exp, st_expf)
RANGE(ours_tanh, st_tanhf)
RANGE(libm_tanh, tanhf)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("exp", &ours_exp);
  m.def("tanh", &ours_tanh);
  m.def("libm_tanh", &libm_tanh);
}
"""


def median_ms(fn, x: torch.Tensor, iters: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="stitch-cpu-math-"))
    (folder / HEADER_NAME).write_text(HEADER)
    (folder / "math.cpp").write_text(SOURCE)
    ext = load(
        name="stitch_cpu_math",
        sources=[str(folder / "math.cpp")],
        extra_cflags=[*CFLAGS, f"-I{folder}"],
        extra_ldflags=LDFLAGS,
        build_directory=str(folder),
    )
    x = torch.randn(args.numel) * 4
    x64 = x.double()
    print(f"{args.numel} float32 elements, {args.threads} thread(s), median of {args.iters} calls")
    print(f"{'function':<10} {'rel L2':>9} {'max rel':>9} {'ours ms':>9} {'torch ms':>9} {'ratio':>7}")
    rows = [
        ("exp", ext.exp, torch.exp),
        ("tanh", ext.tanh, torch.tanh),
        ("libm tanh", ext.libm_tanh, torch.tanh),
    ]
    for name, ours, ref in rows:
        y, r = ours(x).double(), ref(x64)
        rel = ((y - r).norm() / r.norm()).item()
        max_rel = ((y - r).abs() / r.abs().clamp_min(1e-30)).max().item()
        mine, theirs = median_ms(ours, x, args.iters), median_ms(ref, x, args.iters)
        print(f"{name:<10} {rel:9.1e} {max_rel:9.1e} {mine:9.3f} {theirs:9.3f} {theirs / mine:6.2f}x")
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-8, -100.0, 100.0])
    for name, ours, ref in rows[:2]:
        same = torch.allclose(ours(special), ref(special), equal_nan=True, atol=1e-30, rtol=1e-6)
        print(f"{name}: special values (0, -0, +-inf, nan, tiny, +-100) {'match' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
