"""The custom SGEMM's large-tile kernel text (CUDA) run on the CPU, thread by thread as
test_coder_conv_igemm.py runs the convolution: operands staged along either contiguous dimension, partial
tiles in M, N and K, batches, bias, 32- and 64-bit index math, against torch in float64."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_coder_conv_igemm import KERNELS_END, load_emulated, tf32_split

from stitchcuda.coder.synth import libops

GEMM_ON_CPU = r"""
__PRELUDE__
#include <cstdlib>
static bool stitch_tc = false;
__KERNEL__
// A program's epilogue as the kernels see it: here tanh(v) / 2 plus a residual read at the same flat index.
struct StitchTestEpi {
  const float* r;
  template <typename I>
  float operator()(float v, I i) const { return r != nullptr ? std::tanh(v) * 0.5f + r[i] : v; }
};
template <typename I>
static void stitch_gemm_emulated(const float* A, const float* B, const float* bias, float* C, int64_t batch,
                                 int64_t M, int64_t N, int64_t K, const int64_t* s, const float* residual) {
  const StitchTestEpi epi{residual};
  pthread_barrier_init(&stitch_barrier, nullptr, 256);
  for (unsigned bz = 0; bz < batch; ++bz)
    for (unsigned by = 0; by < (M + HBM - 1) / HBM; ++by)
      for (unsigned bx = 0; bx < (N + HBN - 1) / HBN; ++bx) {
        std::vector<std::thread> block;
        for (unsigned t = 0; t < 256; ++t)
          block.emplace_back([=] {
            blockIdx = {bx, by, bz};
            threadIdx = {t, 0, 0};
            if (stitch_tc)
              stitch_gemm_tc_kernel<I>(A, B, bias, C, M, N, K, s[0], s[1], s[2], s[3], s[4], s[5], epi);
            else
              stitch_gemm_big_kernel<I>(A, B, bias, C, M, N, K, s[0], s[1], s[2], s[3], s[4], s[5], epi);
          });
        for (std::thread& th : block) th.join();
      }
  pthread_barrier_destroy(&stitch_barrier);
}
// C [batch, M, N] = A [batch, M, K] @ B [batch, K, N] (+ bias), with the operands' own strides.
at::Tensor stitch_gemm_tiles(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias,
                             bool wide, bool tc, const c10::optional<at::Tensor>& residual) {
  stitch_tc = tc;
  const float* r = residual.has_value() ? residual->data_ptr<float>() : nullptr;
  const int64_t batch = A.size(0), M = A.size(1), K = A.size(2), N = B.size(2);
  at::Tensor C = at::empty({batch, M, N}, A.options());
  const int64_t s[6] = {A.stride(0), A.stride(1), A.stride(2), B.stride(0), B.stride(1), B.stride(2)};
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  if (wide)
    stitch_gemm_emulated<int64_t>(A.data_ptr<float>(), B.data_ptr<float>(), b, C.data_ptr<float>(), batch, M, N, K, s, r);
  else
    stitch_gemm_emulated<int32_t>(A.data_ptr<float>(), B.data_ptr<float>(), b, C.data_ptr<float>(), batch, M, N, K, s, r);
  return C;
}
"""


def emulated_gemm(tmp_path: Path, name: str) -> Any:
    """Both large-tile kernels' text built for the CPU."""
    source = libops.CUDA_KERNELS
    kernel = tf32_split() + source[source.index("constexpr int HBM") : source.index(KERNELS_END)]
    return load_emulated(name, GEMM_ON_CPU.replace("__KERNEL__", kernel), "stitch_gemm_tiles", tmp_path)


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The emulated kernels, built once for the module (SIMT or tensor cores is a run-time switch)."""
    return emulated_gemm(tmp_path_factory.mktemp("gemm_emulated"), "stitch_gemm_tiles_on_cpu")


# (batch, M, N, K, A stored K-major?, B stored N-major?, bias)
SHAPES = [
    (1, 130, 70, 19, True, True, True),  # partial tiles everywhere
    (2, 128, 128, 24, False, False, False),  # exact tiles, both operands staged the other way
    (1, 5, 200, 33, True, False, True),  # a Linear layer's shape: B is the weight [N, K]
    (3, 257, 9, 8, False, True, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "3xtf32"])
def test_large_tile_gemm_kernel_text_emulated_on_the_cpu_matches_torch(ext: Any, tensor_cores: bool) -> None:
    torch.manual_seed(0)
    for batch, m, n, k, a_rows, b_rows, has_bias in SHAPES:
        a = torch.randn(batch, m, k) if a_rows else torch.randn(batch, k, m).transpose(1, 2)
        b = torch.randn(batch, k, n) if b_rows else torch.randn(batch, n, k).transpose(1, 2)
        bias = torch.randn(n) if has_bias else None
        want = a.double() @ b.double() + (bias.double() if bias is not None else 0)
        for wide in (False, True):
            got = ext.stitch_gemm_tiles(a, b, bias, wide, tensor_cores, None)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
            assert float((got.double() - want).norm() / want.norm()) < 2e-6


@pytest.mark.slow
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "3xtf32"])
def test_the_gemm_epilogue_runs_in_the_store_at_each_elements_flat_index(
    ext: Any, tensor_cores: bool
) -> None:
    """A program's pointwise kernel over a Linear's output runs inside the GEMM's store: each element of C,
    bias included, goes through the epilogue with its flat index in C [batch, M, N] (partial tiles, batches)."""
    torch.manual_seed(1)
    for batch, m, n, k, a_rows, b_rows, has_bias in SHAPES[::3]:
        a = torch.randn(batch, m, k) if a_rows else torch.randn(batch, k, m).transpose(1, 2)
        b = torch.randn(batch, k, n) if b_rows else torch.randn(batch, n, k).transpose(1, 2)
        bias = torch.randn(n) if has_bias else None
        residual = torch.randn(batch, m, n)
        want = a.double() @ b.double() + (bias.double() if bias is not None else 0)
        want = torch.tanh(want) * 0.5 + residual.double()
        got = ext.stitch_gemm_tiles(a, b, bias, tensor_cores, tensor_cores, residual)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
