"""The implicit-GEMM convolution kernel's text (CUDA) run on the CPU: every CUDA thread of a block is a thread
here, `__shared__` arrays are shared, `__syncthreads()` is a barrier. No GPU here, so this is where its tiling
(partial tiles in M, N and K, the two shared buffers, the im2col gather over strides, paddings, dilations and
groups, 1-3 spatial dims) is checked against torch; tests/gpu/test_synth_conv_gpu.py runs it on a device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import cpp_extension

from stitchcuda.coder.synth import convolution

# CUDA's built-ins for kernel text compiled by the host compiler: a thread here per CUDA thread.
EMULATION_PRELUDE = r"""
#include <torch/extension.h>
#include <pthread.h>
#include <cmath>
#include <thread>
#include <vector>
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __forceinline__ inline
#define STITCH_HD inline
struct StitchDim3 { unsigned x, y, z; };
static thread_local StitchDim3 blockIdx, threadIdx;
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __ldg(const float* p) { return *p; }
static pthread_barrier_t stitch_barrier;
static inline void __syncthreads() { pthread_barrier_wait(&stitch_barrier); }
"""

IGEMM_ON_CPU = r"""
__PRELUDE__
__COMMON__
__KERNEL__
template <int kTN, typename I>
static void stitch_conv_igemm_emulated(const float* x, const float* w, const float* bias, float* y,
                                       const ConvGeom& g) {
  const int64_t cog = g.co / g.groups, M = g.n * g.out[0] * g.out[1] * g.out[2];
  const int64_t grid_m = (M + CBM - 1) / CBM, grid_n = (cog + 16 * kTN - 1) / (16 * kTN);
  pthread_barrier_init(&stitch_barrier, nullptr, 256);
  for (unsigned bz = 0; bz < g.groups; ++bz)
    for (unsigned by = 0; by < grid_n; ++by)
      for (unsigned bx = 0; bx < grid_m; ++bx) {
        std::vector<std::thread> block;
        for (unsigned t = 0; t < 256; ++t)
          block.emplace_back([=, &g] {
            blockIdx = {bx, by, bz};
            threadIdx = {t, 0, 0};
            stitch_conv_igemm_kernel<kTN, I>(x, w, bias, y, g);
          });
        for (std::thread& th : block) th.join();
      }
  pthread_barrier_destroy(&stitch_barrier);
}
static int64_t stitch_tn = 8;
static bool stitch_wide = false;
static void stitch_conv_launch(const float* x, const float* w, const float* bias, float* y,
                               const int64_t* geom, bool transposed) {
  const ConvGeom g = conv_geom(geom);
  if (stitch_wide)
    stitch_tn == 8 ? stitch_conv_igemm_emulated<8, int64_t>(x, w, bias, y, g)
                   : stitch_conv_igemm_emulated<4, int64_t>(x, w, bias, y, g);
  else
    stitch_tn == 8 ? stitch_conv_igemm_emulated<8, int32_t>(x, w, bias, y, g)
                   : stitch_conv_igemm_emulated<4, int32_t>(x, w, bias, y, g);
}
__HOST__
at::Tensor stitch_conv_tn(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
                          const std::vector<int64_t>& dil, int64_t groups, int64_t tn, bool wide) {
  stitch_tn = tn;
  stitch_wide = wide;
  const std::vector<int64_t> none(stride.size(), 0);
  return stitch_conv(x, w, bias, stride, pad, pad, dil, none, groups, false);
}
"""


def load_emulated(name: str, source: str, function: str, build_dir: Path) -> Any:
    """Kernel text (with `__PRELUDE__` where CUDA's built-ins go) built for the CPU; the extension."""
    return cpp_extension.load_inline(  # type: ignore[no-untyped-call]
        name=name,
        cpp_sources=[source.replace("__PRELUDE__", EMULATION_PRELUDE)],
        functions=[function],
        extra_cflags=["-O1", "-pthread"],
        extra_ldflags=["-pthread"],
        build_directory=str(build_dir),
    )


# (x shape, weight shape, stride, padding, dilation, groups, bias)
GEOMETRIES = [
    ((2, 8, 9, 11), (32, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),  # 198 positions: two M tiles
    ((1, 12, 13, 10), (48, 6, 3, 2), (2, 1), (2, 1), (2, 1), 2, True),  # groups; a partial N tile
    ((1, 4, 5, 6, 7), (128, 4, 3, 2, 3), (1, 2, 1), (1, 0, 2), (2, 1, 1), 1, False),  # 3-D
    ((3, 5, 50), (100, 5, 4), (3,), (2,), (1,), 1, True),  # 1-D; K = 20, not a multiple of 8
    ((1, 40, 6, 6), (20, 40, 3, 3), (1, 1), (0, 0), (1, 1), 1, True),  # K = 360 over 45 steps
]


@pytest.mark.slow
def test_igemm_kernel_text_emulated_on_the_cpu_matches_torch(tmp_path: Path) -> None:
    source = convolution.CUDA
    kernel = source[source.index("constexpr int CBM") : source.index("// The implicit GEMM where")]
    source = IGEMM_ON_CPU.replace("__COMMON__", convolution.COMMON).replace("__KERNEL__", kernel)
    ext = load_emulated(
        "stitch_conv_igemm_on_cpu", source.replace("__HOST__", convolution.HOST), "stitch_conv_tn", tmp_path
    )
    functional = torch.nn.functional
    torch.manual_seed(0)
    for xs, ws, stride, pad, dil, groups, has_bias in GEOMETRIES:
        x, w = torch.randn(xs), torch.randn(ws)
        b = torch.randn(ws[0]) if has_bias else None
        nd = len(ws) - 2
        want = getattr(functional, f"conv{nd}d")(
            x.double(), w.double(), b.double() if b is not None else None, stride, pad, dil, groups
        )
        for tn in (4, 8):
            for wide in (False, True):  # 32- and 64-bit index math
                got = ext.stitch_conv_tn(x, w, b, list(stride), list(pad), list(dil), groups, tn, wide)
                assert got.shape == want.shape
                torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
