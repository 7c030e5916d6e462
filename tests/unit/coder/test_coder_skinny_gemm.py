"""The skinny GEMM (libops.CUDA_KERNELS, `stitch_gemm_skinny_kernel`): a GEMM whose A has a few rows (an RNN's
recurrent step, a small batch through a Linear) reads B once instead of tiling it. Its kernel text runs on
the CPU here (one thread, one block: its loops stride by blockDim and gridDim) against float64 torch over
both of B's layouts, strided and broadcast operands, batches, a bias and an epilogue, every row count up to
the kernel's limit and K or N of 0 and 1; the launcher's choice of layout is checked the same way."""

from __future__ import annotations

import pytest
import torch
from torch.utils import cpp_extension

ON_CPU = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#define __global__
#define __launch_bounds__(n)
#define __device__
#define __shared__ static
#define __syncthreads()
struct StitchDim { unsigned x; };
static const StitchDim blockIdx{0}, threadIdx{0}, gridDim{1}, blockDim{1};
static inline float __ldg(const float* p) { return *p; }
// The epilogue of a fused pointwise tail: v the element (bias included), i its flat index in C.
struct HalfPlusIndex {
  float operator()(float v, int64_t i) const { return 0.5f * v + static_cast<float>(i); }
};
__KERNEL__
// C = A @ B (+ bias) through the kernel text, the layout as the launcher picks it (k_contig).
at::Tensor skinny(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias, bool epi) {
  const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  TORCH_CHECK(M <= kSkM, "more rows than the kernel takes");
  at::Tensor c = at::empty({batch, M, N}, a.options());
  const int64_t sBk = b.stride(1), sBn = b.stride(2);
  const bool k_contig = sBk == 1 && (sBn != 1 || K >= N);
  TORCH_CHECK(k_contig || sBn == 1, "B must be contiguous along K or N");
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t args[] = {batch, M, N, K, a.stride(0), a.stride(1), a.stride(2), b.stride(0), sBk, sBn};
#define STITCH_SKINNY(KC, EPI) \
  stitch_gemm_skinny_kernel<KC>(a.data_ptr<float>(), b.data_ptr<float>(), bp, c.data_ptr<float>(), args[0], \
      args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], EPI)
  if (k_contig && epi) STITCH_SKINNY(true, HalfPlusIndex{});
  else if (k_contig) STITCH_SKINNY(true, StitchNoEpi{});
  else if (epi) STITCH_SKINNY(false, HalfPlusIndex{});
  else STITCH_SKINNY(false, StitchNoEpi{});
  return c;
}
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):
    from stitchcuda.coder.synth import libops

    start = libops.CUDA_KERNELS.index("constexpr int kSkM")
    end = libops.CUDA_KERNELS.index("// The skinny kernel where")
    kernel = libops.CUDA_KERNELS[start:end]
    epi = "struct StitchNoEpi {\n  float operator()(float v, int64_t) const { return v; }\n};\n"
    return cpp_extension.load_inline(  # type: ignore[no-untyped-call]
        name="stitch_skinny_on_cpu",
        cpp_sources=[ON_CPU.replace("__KERNEL__", epi + kernel)],
        functions=["skinny"],
        extra_cflags=["-O1"],
        build_directory=str(tmp_path_factory.mktemp("skinny")),
    )


def _b(batch: int, k: int, n: int, k_contig: bool, broadcast: bool) -> torch.Tensor:
    """B [batch, K, N]: stored [N, K] and transposed (nn.Linear's weight) or [K, N]; shared by every batch
    (stride 0) where `broadcast`."""
    rows = 1 if broadcast else batch
    base = torch.randn(rows, n, k).transpose(1, 2) if k_contig else torch.randn(rows, k, n)
    return base.expand(batch, k, n) if broadcast else base


CASES = [
    # batch, M, K, N, B contiguous along K, B broadcast over the batch, A transposed, bias
    (1, 10, 256, 1024, True, False, False, True),  # an LSTM's recurrent step (B = 10, H = 256)
    (1, 1, 333, 77, True, False, False, False),
    (3, 16, 70, 45, True, True, True, True),
    (2, 5, 129, 300, False, False, False, True),
    (2, 16, 31, 33, False, True, True, False),
    (1, 7, 1, 9, True, False, False, True),  # K of 1
    (1, 4, 0, 6, False, False, False, True),  # K of 0: the bias alone
    (2, 3, 12, 1, True, False, False, False),  # N of 1
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_skinny_kernel_text_matches_float64_torch(ext, case) -> None:
    batch, m, k, n, k_contig, broadcast, a_t, has_bias = case
    torch.manual_seed(hash(case) % 1000)
    a = torch.randn(batch, k, m).transpose(1, 2) if a_t else torch.randn(batch, m, k)
    b = _b(batch, k, n, k_contig, broadcast)
    bias = torch.randn(n) if has_bias else None
    want = a.double() @ b.double() + (bias.double() if bias is not None else 0.0)
    got = ext.skinny(a, b, bias, False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # An epilogue sees each element with its bias and its flat index in C.
    index = torch.arange(want.numel(), dtype=torch.float64).reshape(want.shape)
    torch.testing.assert_close(
        ext.skinny(a, b, bias, True).double(), 0.5 * want + index, rtol=1e-5, atol=1e-4
    )


@pytest.mark.slow
def test_skinny_kernel_takes_every_row_count_up_to_its_limit(ext) -> None:
    for m in range(1, 17):
        a, b = torch.randn(2, m, 40), torch.randn(2, 21, 40).transpose(1, 2)
        torch.testing.assert_close(
            ext.skinny(a, b, None, False).double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5
        )


def test_skinny_kernel_limits_are_what_the_launchers_check() -> None:
    from stitchcuda.coder.synth import libops

    text = libops.CUDA_KERNELS
    assert "constexpr int kSkM = 16" in text
    # The launcher with an epilogue tries the skinny kernel first; the CUTLASS launcher before CUTLASS.
    with_epi = text[text.index("static void stitch_gemm_with(") :]
    assert with_epi.index("stitch_gemm_skinny(") < with_epi.index("stitch_gemm_big(")
    cutlass = libops.CUDA_GEMM_CUTLASS
    assert cutlass.index("stitch_gemm_skinny(") < cutlass.index("stitch_cutlass_gemm(")
