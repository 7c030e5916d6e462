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

from stitchcuda.coder.synth import convolution, libops

# CUDA's built-ins for kernel text compiled by the host compiler: a thread here per CUDA thread.
EMULATION_PRELUDE = r"""
#include <torch/extension.h>
#include <pthread.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __forceinline__ inline
#define STITCH_HD inline
#define STITCH_UNROLL
struct StitchDim3 { unsigned x, y, z; };
static thread_local StitchDim3 blockIdx, threadIdx;
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __ldg(const float* p) { return *p; }
static pthread_barrier_t stitch_barrier;
static inline void __syncthreads() { pthread_barrier_wait(&stitch_barrier); }
// Every __syncwarp() of the kernels here is reached by all threads of the block alike.
static inline void __syncwarp() { pthread_barrier_wait(&stitch_barrier); }
#define __device__
// WMMA for the CPU: a thread's fragment holds the whole tile (the hardware's spreads it over the warp in an
// order the API leaves unspecified, so kernels touch elements only elementwise); every thread of a warp
// computes the same tile and stores the same values. TF32 is float with 13 low mantissa bits rounded off
// (to nearest, ties away from zero, as cvt.rna.tf32.f32); products of TF32 values are exact in float.
namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {}; struct col_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment;
template <int R, int C, bool kRowMajor> struct tile {
  static constexpr int rows = R, cols = C, num_elements = R * C;
  static constexpr bool row_major_layout = kRowMajor;
  float x[R * C];
};
template <int M, int N, int K, typename L>
struct fragment<matrix_a, M, N, K, precision::tf32, L> : tile<M, K, std::is_same<L, row_major>::value> {};
template <int M, int N, int K, typename L>
struct fragment<matrix_b, M, N, K, precision::tf32, L> : tile<K, N, std::is_same<L, row_major>::value> {};
template <int M, int N, int K>
struct fragment<accumulator, M, N, K, float, void> : tile<M, N, true> {};
template <typename F> inline void load_matrix_sync(F& f, const float* p, unsigned ldm) {
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = F::row_major_layout ? p[r * ldm + c] : p[c * ldm + r];
}
template <typename F> inline void store_matrix_sync(float* p, const F& f, unsigned ldm, layout_t l) {
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * F::cols + c];
}
template <typename F> inline void fill_fragment(F& f, float v) { for (float& e : f.x) e = v; }
template <typename D, typename A, typename B> inline void mma_sync(D& d, const A& a, const B& b, const D& c) {
  float out[D::num_elements];
  for (int m = 0; m < D::rows; ++m)
    for (int n = 0; n < D::cols; ++n) {
      float s = c.x[m * D::cols + n];
      for (int k = 0; k < A::cols; ++k) s = fmaf(a.x[m * A::cols + k], b.x[k * B::cols + n], s);
      out[m * D::cols + n] = s;
    }
  for (int i = 0; i < D::num_elements; ++i) d.x[i] = out[i];
}
inline float __float_to_tf32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &bits, 4);
  return v;
}
}}  // namespace nvcuda::wmma
"""

IGEMM_ON_CPU = r"""
__PRELUDE__
__COMMON__
static bool stitch_tc = false;
__KERNEL__
// A program's epilogue as the kernels see it: here tanh(v) / 2 plus a residual read at the same flat index.
static const float* stitch_residual = nullptr;
struct StitchTestEpi {
  const float* r;
  template <typename I>
  float operator()(float v, I i) const { return r != nullptr ? std::tanh(v) * 0.5f + r[i] : v; }
};
template <int kTN, typename I, bool kT>
static void stitch_conv_igemm_emulated(const float* x, const float* w, const float* bias, float* y,
                                       const ConvGeom& g) {
  const StitchTestEpi epi{stitch_residual};
  const ConvGrid grid = conv_igemm_grid(g, kT, kTN);
  pthread_barrier_init(&stitch_barrier, nullptr, 256);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.n; ++by)
      for (unsigned bx = 0; bx < grid.m; ++bx) {
        std::vector<std::thread> block;
        for (unsigned t = 0; t < 256; ++t)
          block.emplace_back([=, &g] {
            blockIdx = {bx, by, bz};
            threadIdx = {t, 0, 0};
            if (stitch_tc)
              stitch_conv_tc_kernel<kTN, I, kT>(x, w, bias, y, g, epi);
            else
              stitch_conv_igemm_kernel<kTN, I, kT>(x, w, bias, y, g, epi);
          });
        for (std::thread& th : block) th.join();
      }
  pthread_barrier_destroy(&stitch_barrier);
}
static int64_t stitch_tn = 8;
static bool stitch_wide = false;
template <bool kT>
static void stitch_conv_pick(const float* x, const float* w, const float* bias, float* y, const ConvGeom& g) {
  if (stitch_wide)
    stitch_tn == 8 ? stitch_conv_igemm_emulated<8, int64_t, kT>(x, w, bias, y, g)
                   : stitch_conv_igemm_emulated<4, int64_t, kT>(x, w, bias, y, g);
  else
    stitch_tn == 8 ? stitch_conv_igemm_emulated<8, int32_t, kT>(x, w, bias, y, g)
                   : stitch_conv_igemm_emulated<4, int32_t, kT>(x, w, bias, y, g);
}
static void stitch_conv_launch(const float* x, const float* w, const float* bias, float* y,
                               const int64_t* geom, bool transposed) {
  const ConvGeom g = conv_geom(geom);
  transposed ? stitch_conv_pick<true>(x, w, bias, y, g) : stitch_conv_pick<false>(x, w, bias, y, g);
}
__HOST__
at::Tensor stitch_conv_tn(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
                          const std::vector<int64_t>& dil, int64_t groups, int64_t tn, bool wide, bool tc,
                          const std::vector<int64_t>& out_pad, bool transposed,
                          const c10::optional<at::Tensor>& residual, int64_t channels, int64_t offset) {
  stitch_residual = residual.has_value() ? residual->data_ptr<float>() : nullptr;
  stitch_tc = tc;
  stitch_tn = tn;
  stitch_wide = wide;
  if (channels == 0) return stitch_conv(x, w, bias, stride, pad, pad, dil, out_pad, groups, transposed);
  // Into channels [offset, offset + CO) of a concatenation `channels` wide: the whole buffer back.
  StitchCatInto into{channels, at::Tensor()};
  stitch_conv_to(x, w, bias, stride, pad, pad, dil, out_pad, groups, transposed, &into, offset);
  return into.buf;
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


# Transposed: (x shape, weight shape [C, CO/groups, taps...], stride, padding, output padding, dilation,
# groups, bias). Strides make several output phases, some with no taps (stride > kernel extent) or none of the
# positions (an output shorter than the stride).
TRANSPOSED = [
    ((2, 8, 5, 6), (8, 16, 3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1, True),  # four phases, 2x2 / 2x1 taps
    ((1, 6, 4, 3, 5), (6, 10, 3, 2, 3), (2, 1, 3), (1, 0, 1), (0, 0, 2), (1, 2, 1), 2, True),  # 3-D, groups
    ((3, 16, 7), (16, 20, 2), (3,), (0,), (1,), (1,), 1, False),  # stride 3 > 2 taps: a phase with no taps
    ((1, 4, 6, 5), (4, 24, 3, 3), (2, 2), (2, 1), (0, 1), (2, 3), 1, True),  # dilation against stride
    ((1, 20, 1, 4), (20, 17, 1, 3), (2, 1), (0, 0), (0, 0), (1, 1), 1, True),  # one output row: empty phase
]


def emulated_conv(tmp_path: Path, name: str, split: str = "") -> Any:
    """Both implicit-GEMM kernels' text built for the CPU, with the tensor cores' split and step (or `split`)."""
    source = convolution.CUDA
    kernels = source[source.index("constexpr int CBM") : source.index(KERNELS_END)]
    source = IGEMM_ON_CPU.replace("__COMMON__", convolution.COMMON).replace(
        "__KERNEL__", (split or tf32_split()) + kernels
    )
    host = libops.DENSE_CPU + convolution.HOST
    return load_emulated(name, source.replace("__HOST__", host), "stitch_conv_tn", tmp_path)


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The emulated kernels, built once for the module (SIMT or tensor cores is a run-time switch)."""
    return emulated_conv(tmp_path_factory.mktemp("conv_emulated"), "stitch_conv_igemm_on_cpu")


# Where the kernels end and their host launchers begin, in both kernel texts.
KERNELS_END = "// Tensor cores (3xTF32) from compute capability 8.0"


def tf32_split() -> str:
    """The tensor-core kernels' shared split and K step (libops.TENSOR_CORES without its device query)."""
    return libops.TENSOR_CORES[: libops.TENSOR_CORES.index("// Whether this device runs")]


def reference(xs: tuple[int, ...], ws: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
              dil: tuple[int, ...], groups: int, has_bias: bool) -> tuple[Any, ...]:  # fmt: skip
    x, w = torch.randn(xs), torch.randn(ws)
    b = torch.randn(ws[0]) if has_bias else None
    nd = len(ws) - 2
    want = getattr(torch.nn.functional, f"conv{nd}d")(
        x.double(), w.double(), b.double() if b is not None else None, stride, pad, dil, groups
    )
    return x, w, b, want


def conv_on_cpu(ext: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: tuple[int, ...],
                pad: tuple[int, ...], dil: tuple[int, ...], groups: int, *, tn: int, wide: bool,
                tensor_cores: bool, out_pad: tuple[int, ...] | None = None,
                residual: torch.Tensor | None = None, into: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """One convolution through the emulated kernels: transposed where `out_pad` is given; with `residual`,
    the kernels' store goes through the test epilogue tanh(v) / 2 + residual; with `into` (channels, offset),
    it writes its slice of a concatenation that wide and returns the concatenation."""
    transposed = out_pad is not None
    pads = list(out_pad) if out_pad is not None else [0] * len(stride)
    return ext.stitch_conv_tn(  # type: ignore[no-any-return]
        x,
        w,
        b,
        list(stride),
        list(pad),
        list(dil),
        groups,
        tn,
        wide,
        tensor_cores,
        pads,
        transposed,
        residual,
        *into,
    )


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.slow
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "3xtf32"])
def test_igemm_kernel_text_emulated_on_the_cpu_matches_torch(ext: Any, tensor_cores: bool) -> None:
    torch.manual_seed(0)
    for xs, ws, stride, pad, dil, groups, has_bias in GEOMETRIES:
        x, w, b, want = reference(xs, ws, stride, pad, dil, groups, has_bias)
        # 32- and 64-bit index math; the tensor-core kernel shares the SIMT kernel's tiles, so two of the four.
        shapes = [(4, False), (8, True)] if tensor_cores else [(4, False), (4, True), (8, False), (8, True)]
        for tn, wide in shapes:
            got = conv_on_cpu(
                ext, x, w, b, stride, pad, dil, groups, tn=tn, wide=wide, tensor_cores=tensor_cores
            )
            assert got.shape == want.shape
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
            assert rel_l2(got, want) < 2e-6


@pytest.mark.slow
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "3xtf32"])
def test_transposed_igemm_emulated_on_the_cpu_matches_torch(ext: Any, tensor_cores: bool) -> None:
    """One GEMM per output phase, over the taps that land on it: every phase's positions, the phases with
    no taps (bias alone) and those with no positions, groups, dilations, output padding, 1-3 dims."""
    torch.manual_seed(2)
    for xs, ws, stride, pad, out_pad, dil, groups, has_bias in TRANSPOSED:
        x, w = torch.randn(xs), torch.randn(ws)
        b = torch.randn(ws[1] * groups) if has_bias else None
        nd = len(ws) - 2
        want = getattr(torch.nn.functional, f"conv_transpose{nd}d")(
            x.double(), w.double(), b.double() if b is not None else None, stride, pad, out_pad, groups, dil
        )
        for tn in (4, 8):
            got = conv_on_cpu(
                ext,
                x,
                w,
                b,
                stride,
                pad,
                dil,
                groups,
                tn=tn,
                wide=tn == 8,
                tensor_cores=tensor_cores,
                out_pad=out_pad,
            )
            assert got.shape == want.shape
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tensor_core_products_need_the_residual_terms_for_float32_accuracy(tmp_path: Path) -> None:
    """The split is what makes TF32 tensor cores float32-accurate: the same kernel with the hi*lo and lo*hi
    products dropped is plain TF32, an error the Verifier rejects (and the emulated TF32 rounding is real)."""
    split = tf32_split()
    residuals = [line for line in split.splitlines() if "mma_sync" in line and "_lo" in line]
    assert len(residuals) == 2, residuals
    for line in residuals:
        split = split.replace(line + "\n", "")
    plain = emulated_conv(tmp_path, "stitch_conv_plain_tf32_on_cpu", split)
    torch.manual_seed(1)
    xs, ws, stride, pad, dil, groups, has_bias = GEOMETRIES[4]
    x, w, b, want = reference(xs, ws, stride, pad, dil, groups, has_bias)
    got = conv_on_cpu(plain, x, w, b, stride, pad, dil, groups, tn=4, wide=False, tensor_cores=True)
    assert rel_l2(got, want) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "3xtf32"])
@pytest.mark.parametrize("into", [None, (False, 3), (True, 0)], ids=["own-output", "cat-32bit", "cat-64bit"])
def test_the_epilogue_runs_in_the_store_at_each_elements_flat_index(
    ext: Any, tensor_cores: bool, into: tuple[bool, int] | None
) -> None:
    """A program's pointwise kernel over the convolution's output runs inside the convolution's store: each
    output element, bias included, goes through the epilogue with its own flat index in y (a residual read
    there lands on the right element), for plain and transposed convolutions, every output phase. `into`
    (64-bit index math, first channel): the convolution writes its slice of a concatenation 5 channels wider
    (images farther apart than CO planes), the epilogue still at the element's index in the convolution's
    own output."""
    torch.manual_seed(3)
    cases = [
        (xs, ws, stride, pad, None, dil, groups, bias)
        for xs, ws, stride, pad, dil, groups, bias in GEOMETRIES[:2]
    ]
    cases += TRANSPOSED[:2]
    for xs, ws, stride, pad, out_pad, dil, groups, has_bias in cases:
        x, w = torch.randn(xs), torch.randn(ws)
        co = ws[1] * groups if out_pad is not None else ws[0]
        b = torch.randn(co) if has_bias else None
        plain = conv_on_cpu(ext, x, w, b, stride, pad, dil, groups, tn=4, wide=False, tensor_cores=tensor_cores,
                            out_pad=out_pad)  # fmt: skip
        residual = torch.randn(plain.shape)
        wide, offset = into if into is not None else (True, 0)
        got = conv_on_cpu(ext, x, w, b, stride, pad, dil, groups, tn=8, wide=wide, tensor_cores=tensor_cores,
                          out_pad=out_pad, residual=residual,
                          into=(co + 5, offset) if into is not None else (0, 0))  # fmt: skip
        if into is not None:
            assert got.shape == (plain.shape[0], co + 5, *plain.shape[2:])
            got = got[:, offset : offset + co]
        want = torch.tanh(plain.double()) * 0.5 + residual.double()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
