"""Hopper's convolution (variant conv_kernel=cutlass_sm90, cutlass_conv.py) around CUTLASS's kernel: the split
passes and the store, their CUDA text run on the CPU (a thread per CUDA thread, tests/unit/coder's WMMA-free
emulation), with CUTLASS's convolution stood in for by a float64 one over the same split, channels-last
operands. No GPU here, so this is where the layout is checked: the input as [hi | hi | lo] and the weight as
[hi | lo | hi] along padded channels, output channels padded and dropped again, the bias and an epilogue in the
store, 1-3 spatial dims, strides, padding and dilation; that the sum is 3xTF32-accurate (and plain TF32 is
not); and that the program carries the unit only where the variant asks for it. tests/gpu/test_synth_gpu.py
runs the whole path on a Hopper device."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from test_coder_conv_igemm import load_emulated
from test_coder_cuda_build import NVCC, nvcc_command
from torch.nn import functional

from stitchcuda.coder.synth import convolution, cutlass_conv, cutlass_gemm
from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared import cutlass
from stitchcuda.shared.policy import STRICT, KernelPolicy

ON_CPU = r"""
__PRELUDE__
static thread_local StitchDim3 gridDim;
static inline uint32_t __float_as_uint(float v) { uint32_t u; std::memcpy(&u, &v, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float v; std::memcpy(&v, &u, 4); return v; }
using std::isfinite;
typedef void* cudaStream_t;
#define STITCH_CUDA_CHECK(expr) (expr)
static inline int cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return 0; }
__TF32__
// Runs `kernel` over a grid of (bx, by) blocks of 256 threads, each CUDA thread a thread here.
template <typename F>
static void stitch_grid(unsigned bx, unsigned by, F kernel) {
  pthread_barrier_init(&stitch_barrier, nullptr, 256);
  for (unsigned y = 0; y < by; ++y)
    for (unsigned x = 0; x < bx; ++x) {
      std::vector<std::thread> block;
      for (unsigned t = 0; t < 256; ++t)
        block.emplace_back([=] {
          blockIdx = {x, y, 0};
          threadIdx = {t, 0, 0};
          gridDim = {bx, by, 1};
          kernel();
        });
      for (std::thread& th : block) th.join();
    }
  pthread_barrier_destroy(&stitch_barrier);
}
// The split pass's launcher (cutlass_gemm.SM90_COMMON's grid) running its kernel here.
static void stitch_sm90_split(const float* src, int64_t sb, int64_t sr, int64_t sk, int64_t rows, int64_t K,
                              int64_t Kp, int64_t batches, bool b_side, const float* bias, bool with_bias,
                              float* out, cudaStream_t) {
  const int64_t tiles_k = (K + 31) / 32, tiles = ((rows + 31) / 32) * tiles_k;
  stitch_grid(tiles, batches,
              [=] { stitch_tf32x3_split(src, sb, sr, sk, rows, K, Kp, tiles_k, b_side, bias, with_bias, out); });
}
__SPLIT__
// A program's epilogue as the store sees it: tanh(v) / 2 plus the flat index / 1000.
struct StitchTestEpi {
  bool on;
  float operator()(float v, int64_t i) const { return on ? std::tanh(v) * 0.5f + i * 1e-3f : v; }
};
__STORE__

// which 0: the input [N, C, S] and the weight `other` [CO, C, T] split as [N, S, Cp] and [COp, T, Cp] by the
// unit's stitch_conv_split (1: a transposed convolution's weight [C, CO, T]); 2: the channels-last
// [N, S, COp] stored as [N, CO, S] with bias `other` and (epi) the epilogue, into channels padded.. of a
// concatenation [N, CO + 2 padded, S] (its other channels NaN).
std::vector<at::Tensor> stitch_conv_layout(int64_t which, const at::Tensor& t,
                                           const c10::optional<at::Tensor>& other, int64_t channels,
                                           int64_t padded, bool epi) {
  const float* src = t.data_ptr<float>();
  if (which == 0 || which == 1) {
    const bool transposed = which == 1;
    const at::Tensor& w = *other;
    const int64_t N = t.size(0), C = t.size(1), S = t.size(2);
    const int64_t CO = w.size(transposed ? 1 : 0), T = w.size(2), COp = channels, Cp = padded;
    at::Tensor xs = at::full({N, S, Cp}, NAN, t.options()), ws = at::full({COp, T, Cp}, NAN, t.options());
    stitch_conv_split(src, w.data_ptr<float>(), N, C, S, CO, COp, T, Cp, transposed, xs.data_ptr<float>(),
                      ws.data_ptr<float>(), nullptr);
    return {xs, ws};
  }
  const int64_t N = t.size(0), S = t.size(1), COp = t.size(2), CO = channels, yskip = 2 * padded * S;
  at::Tensor y = at::full({N, CO + 2 * padded, S}, NAN, t.options());
  float* dst = y.data_ptr<float>() + padded * S;
  const float* b = other.has_value() ? other->data_ptr<float>() : nullptr;
  const int64_t tiles_s = (S + 31) / 32, tiles = ((CO + 31) / 32) * tiles_s;
  // Two batches of images (as the launcher runs a large convolution), the second from image n0.
  const int64_t first = (N + 1) / 2;
  stitch_grid(tiles, first, [=] { stitch_conv_tc_store(src, 0, S, CO, COp, tiles_s, yskip, b, dst, StitchTestEpi{epi}); });
  if (N > first) {
    const float* rest = src + first * S * COp;
    stitch_grid(tiles, N - first,
                [=] { stitch_conv_tc_store(rest, first, S, CO, COp, tiles_s, yskip, b, dst, StitchTestEpi{epi}); });
  }
  return {y};
}
"""


def _between(text: str, start: str, end: str | None = None) -> str:
    begin = text.index(start)
    return text[begin : text.index(end, begin)] if end else text[begin:]


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> Any:
    source = (
        ON_CPU.replace(
            "__TF32__",
            _between(cutlass_gemm.SM90_COMMON, "// TF32 rounding of a float", "// Splits `rows` rows"),
        )
        .replace("__SPLIT__", _between(cutlass_conv.SOURCE, "// The operands of one convolution split"))
        .replace(
            "__STORE__",
            _between(
                convolution.CUDA_SM90, "// The channels-last scratch", "// The fraction of a tensor-core"
            ),
        )
        .replace("__device__ __forceinline__", "inline")
    )
    return load_emulated(
        "stitch_cutlass_conv_layout_on_cpu", source, "stitch_conv_layout", tmp_path_factory.mktemp("layout")
    )


def _tf32(v: torch.Tensor) -> torch.Tensor:
    """TF32 rounding (to nearest, ties away), as the kernels round."""
    bits = v.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _split(
    ext: Any, x: torch.Tensor, w: torch.Tensor, *, transposed: bool
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The split input [N, S, Cp] and weight [COp, T, Cp] through the unit's text, with Cp and COp."""
    n, c = x.shape[:2]
    co = w.shape[1] if transposed else w.shape[0]
    cp, cop = (3 * c + 3) // 4 * 4, (co + 3) // 4 * 4
    xs, ws = ext.stitch_conv_layout(
        1 if transposed else 0, x.reshape(n, c, -1), w.reshape(w.shape[0], w.shape[1], -1), cop, cp, False
    )
    # Every element written; output channels past CO all zeros.
    assert not xs.isnan().any() and not ws.isnan().any() and not ws[co:].any()
    return xs, ws, cp, cop


# (x shape, weight shape, stride, padding, dilation, bias)
GEOMETRIES = [
    ((2, 5, 9, 11), (7, 5, 3, 3), (1, 1), (1, 1), (1, 1), True),  # 3C = 15 -> 16, CO = 7 -> 8
    ((1, 40, 6, 7), (33, 40, 3, 2), (2, 1), (1, 0), (1, 2), False),  # channels past one 32-wide tile
    ((2, 4, 5, 6, 7), (12, 4, 3, 2, 3), (1, 2, 1), (1, 0, 2), (2, 1, 1), True),  # 3-D, C = 4 -> 12
    ((3, 6, 50), (9, 6, 4), (3,), (2,), (1,), True),  # 1-D
]


@pytest.mark.slow
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{len(g[0]) - 2}d-c{g[0][1]}-co{g[1][0]}")
@pytest.mark.parametrize("epi", [False, True])
def test_split_convolution_and_store_match_torch(ext: Any, geometry: tuple[Any, ...], epi: bool) -> None:
    x_shape, w_shape, stride, padding, dilation, with_bias = geometry
    torch.manual_seed(len(x_shape) * 10 + w_shape[0])
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    bias = torch.randn(w_shape[0]) if with_bias else None
    n, c, *spatial = x_shape
    co, _, *kernel = w_shape
    xs, ws, cp, cop = _split(ext, x, w, transposed=False)
    # The input hi, hi, lo of each channel, zeros past 3C; the weight zeros past 3C.
    xt = x.reshape(n, c, -1).transpose(1, 2)
    hi, lo = _tf32(xt), _tf32(xt - _tf32(xt))
    assert torch.equal(xs[..., :c], hi) and torch.equal(xs[..., c : 2 * c], hi)
    assert torch.equal(xs[..., 2 * c : 3 * c], lo) and not xs[..., 3 * c :].any()
    assert not ws[:, :, 3 * c :].any()

    # CUTLASS's convolution over the split operands (channels-last, KTRSC weight), stood in for in float64.
    conv = {1: functional.conv1d, 2: functional.conv2d, 3: functional.conv3d}[len(spatial)]
    xs_nc = xs.reshape(n, *spatial, cp).movedim(-1, 1).double()
    ws_nc = ws.reshape(cop, *kernel, cp).movedim(-1, 1).double()
    d = conv(xs_nc, ws_nc, stride=stride, padding=padding, dilation=dilation).float()
    out_spatial = d.shape[2:]
    d_last = d.movedim(1, -1).reshape(n, -1, cop).contiguous()
    # Into channels 2.. of a concatenation 4 channels wider where the epilogue runs (its flat index is the
    # convolution's own): the others stay untouched.
    extra = 2 if epi else 0
    whole = ext.stitch_conv_layout(2, d_last, bias, co, extra, epi)[0]
    assert whole[:, :extra].isnan().all() and whole[:, extra + co :].isnan().all()
    y = whole[:, extra : extra + co].reshape(n, co, *out_spatial)

    want = conv(
        x.double(), w.double(), bias.double() if bias is not None else None, stride, padding, dilation
    )
    if epi:
        flat = torch.arange(want.numel(), dtype=torch.float64).reshape(want.shape)
        want = torch.tanh(want) * 0.5 + flat * 1e-3
    assert not y.isnan().any()
    rel = ((y.double() - want).norm() / want.norm()).item()
    assert rel < 2e-6, f"3xTF32 relative L2 {rel:.2e}"
    # The low parts matter: TF32 alone (hi x hi) misses the same tolerance by far.
    if not epi:
        plain = conv(
            _tf32(x).double(),
            _tf32(w).double(),
            bias.double() if bias is not None else None,
            stride,
            padding,
            dilation,
        )
        assert ((plain - want).norm() / want.norm()).item() > 2e-5


# Transposed, stride 1: (x shape, weight shape [C, CO, taps...], padding, output padding, dilation, bias).
TRANSPOSED = [
    ((2, 6, 7, 9), (6, 10, 3, 3), (1, 1), (0, 0), (1, 1), True),
    ((1, 5, 4, 5, 6), (5, 7, 2, 3, 2), (0, 1, 1), (1, 0, 0), (2, 1, 1), False),  # 3-D, output padding
    ((3, 9, 20), (9, 4, 5), (2,), (0,), (3,), True),  # 1-D, dilated
]


@pytest.mark.slow
@pytest.mark.parametrize("geometry", TRANSPOSED, ids=lambda g: f"{len(g[0]) - 2}d-c{g[0][1]}")
def test_stride_one_transposed_convolution_is_the_flipped_direct_one(
    ext: Any, geometry: tuple[Any, ...]
) -> None:
    """A transposed convolution of stride 1 goes through the same kernel as the direct convolution of its
    weight with the taps reversed, input and output channels swapped, and dil (k - 1) - pad zeros before each
    dim (dil (k - 1) - pad + output padding after): the split weight of stitch_cutlass_conv's `transposed`."""
    x_shape, w_shape, padding, out_pad, dilation, with_bias = geometry
    torch.manual_seed(len(x_shape) * 10 + w_shape[1])
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    bias = torch.randn(w_shape[1]) if with_bias else None
    n, c, *spatial = x_shape
    _, co, *kernel = w_shape
    xs, ws, cp, cop = _split(ext, x, w, transposed=True)
    conv = {1: functional.conv1d, 2: functional.conv2d, 3: functional.conv3d}[len(spatial)]
    pads: list[int] = []
    for k, p, op, d in reversed(list(zip(kernel, padding, out_pad, dilation, strict=True))):
        pads += [d * (k - 1) - p, d * (k - 1) - p + op]
    xs_nc = functional.pad(xs.reshape(n, *spatial, cp).movedim(-1, 1).double(), pads)
    d = conv(xs_nc, ws.reshape(cop, *kernel, cp).movedim(-1, 1).double(), dilation=dilation).float()
    out_spatial = d.shape[2:]
    d_last = d.movedim(1, -1).reshape(n, -1, cop).contiguous()
    y = ext.stitch_conv_layout(2, d_last, bias, co, 0, False)[0]
    transpose = {
        1: functional.conv_transpose1d,
        2: functional.conv_transpose2d,
        3: functional.conv_transpose3d,
    }
    want = transpose[len(spatial)](
        x.double(), w.double(), bias.double() if bias is not None else None, 1, padding, out_pad, 1, dilation
    )
    assert tuple(want.shape[2:]) == tuple(out_spatial)
    rel = ((y.reshape(want.shape).double() - want).norm() / want.norm()).item()
    assert rel < 2e-6, f"3xTF32 relative L2 {rel:.2e}"


CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 16, 12, 12)]

def get_init_inputs():
    return []
"""


def test_the_unit_is_in_the_program_only_where_the_variant_asks() -> None:
    synth = Synthesizer()
    strict = KernelPolicy(STRICT)
    on = synth.synthesize(CONV, None, variant=Variant(), device="cuda", policy=strict)
    off = synth.synthesize(CONV, None, variant=Variant(conv_kernel="own"), device="cuda", policy=strict)
    assert cutlass_conv.FILE in on.files and cutlass_conv.FILE in on.build.sources
    assert (
        "if (stitch_conv_tc_sm90(" in on.files["kernels.cu"]
        and cutlass_conv.DECLARATION in on.files["kernels.cu"]
    )
    assert "-gencode=arch=compute_90a,code=sm_90a" in on.build.cuda_cflags
    # The unit names no program (the Verifier's builds share its object).
    assert on.build.extension_name not in on.files[cutlass_conv.FILE]
    assert cutlass_conv.FILE not in off.files and "stitch_cutlass_conv" not in off.files["kernels.cu"]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.skipif(cutlass.include_dir() is None, reason="the nvidia-cutlass package is not installed")
def test_the_unit_compiles_for_sm90a_without_serialized_wgmma(tmp_path: Path) -> None:
    """The instantiation of CUTLASS's Hopper convolution compiles (no GPU here to run it) with the flags the
    program carries, and no call inside its mainloop serializes the wgmma pipeline (ptxas's C7510)."""
    synthesis = Synthesizer(in_process=True).synthesize(
        CONV, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT)
    )
    for name, text in synthesis.files.items():
        (tmp_path / name).write_text(text)
    unit = tmp_path / cutlass_conv.FILE
    command = [
        *nvcc_command(unit, tmp_path / "unit.o"),
        *cutlass.build_flags([unit.read_text()]),
        *cutlass_gemm.SM90_CUDA_CFLAGS,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "C7510" not in done.stdout + done.stderr
