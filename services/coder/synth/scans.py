"""The synthesizer's own kernels for order-dependent ops: prefix scans (cumsum/cumprod, reverse and exclusive
forms), flips and triangular masks, as host helpers emitted on demand (helper names "scan", "flip", "tri").

Each host helper makes its input contiguous and views it as lines (outer x len x inner for a scan, the
last two dims for a triangle), so one kernel serves every dim. CPU: at::parallel_for over lines, sums in
double. CUDA: see SCAN_CUDA's comment for the blocked scan's design.
"""

from __future__ import annotations

# Both backends' host part of the scan: contiguous input, the outer x len x inner split along `dim`.
_SCAN_PRELUDE = r"""  const at::Tensor x = stitch_dense(x0);
  if (x.dim() > 0 && dim < 0) dim += x.dim();
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) outer *= x.size(d);
    else if (d == dim) len = x.size(d);
    else inner *= x.size(d);
  }
  at::Tensor out = at::empty(x.sizes(), x.options());
"""

SCAN_CPU = r"""
// Prefix sum/product along one dim (cumsum, cumprod; from the end when reverse; exclusive: each element
// gets the combination of the elements strictly before it). One task per outer slice; the inner elements
// of a step are contiguous, so the running values of a slice are a vector accumulated in double.
static at::Tensor stitch_scan(const at::Tensor& x0, int64_t dim, bool prod, bool reverse, bool exclusive) {
__SCAN_PRELUDE__
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(len * inner, 1));
  at::parallel_for(0, outer, grain, [&](int64_t o0, int64_t o1) {
    std::vector<double> acc(static_cast<size_t>(inner));
    for (int64_t o = o0; o < o1; ++o) {
      std::fill(acc.begin(), acc.end(), prod ? 1.0 : 0.0);
      for (int64_t s = 0; s < len; ++s) {
        const int64_t k = reverse ? len - 1 - s : s;
        const float* xs = src + (o * len + k) * inner;
        float* ys = dst + (o * len + k) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const double before = acc[i];
          acc[i] = prod ? before * xs[i] : before + xs[i];
          ys[i] = static_cast<float>(exclusive ? before : acc[i]);
        }
      }
    }
  });
  return out;
}
""".replace("__SCAN_PRELUDE__\n", _SCAN_PRELUDE)

SCAN_CUDA = r"""
// Prefix sum/product along one dim on the GPU, correct for any length.
// Contiguous lines (inner == 1, the scan dim is the last): one block per line (grid-stride over lines),
// walking the line in tiles of SCAN_THREADS * SCAN_ITEMS elements. Each thread scans its SCAN_ITEMS
// consecutive elements in registers, a warp-shuffle scan combines the thread totals, a second one over the
// warp totals (shared memory) gives each thread its prefix within the tile, and the running total of the
// earlier tiles (the carry, kept in double so a long row does not drift) is combined in before the store.
// Strided lines (inner > 1): one thread per (outer, inner) column walks its line serially; neighbouring
// threads read neighbouring addresses, so each step is a coalesced row; sums use Kahan compensation.
// Reverse lines are read and written through the mirrored index; exclusive outputs use the prefix before
// the element (never a division, so products with zeros stay exact).
constexpr int SCAN_THREADS = 256, SCAN_ITEMS = 4, SCAN_WARPS = SCAN_THREADS / 32;

template <bool PROD>
__device__ __forceinline__ float scan_combine(float a, float b) { return PROD ? a * b : a + b; }

template <bool PROD>
__device__ __forceinline__ float warp_inclusive(float v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v = scan_combine<PROD>(o, v);
  }
  return v;
}

template <bool PROD>
__global__ void __launch_bounds__(SCAN_THREADS) stitch_scan_rows_kernel(
    const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t len, bool reverse,
    bool exclusive) {
  __shared__ float warp_totals[SCAN_WARPS];
  __shared__ double tile_total;
  const float identity = PROD ? 1.f : 0.f;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  constexpr int64_t tile = static_cast<int64_t>(SCAN_THREADS) * SCAN_ITEMS;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * len;
    float* yr = y + row * len;
    double carry = PROD ? 1.0 : 0.0;
    for (int64_t t0 = 0; t0 < len; t0 += tile) {
      const int64_t base = t0 + static_cast<int64_t>(threadIdx.x) * SCAN_ITEMS;
      float r[SCAN_ITEMS];
#pragma unroll
      for (int j = 0; j < SCAN_ITEMS; ++j) {
        const int64_t s = base + j;
        const float v = s < len ? xr[reverse ? len - 1 - s : s] : identity;
        r[j] = j == 0 ? v : scan_combine<PROD>(r[j - 1], v);
      }
      // Thread totals -> inclusive within the warp -> warp totals -> exclusive prefix of this thread.
      const float mine = r[SCAN_ITEMS - 1];
      const float in_warp = warp_inclusive<PROD>(mine, lane);
      if (lane == 31) warp_totals[warp] = in_warp;
      __syncthreads();
      if (warp == 0) {
        const float w = lane < SCAN_WARPS ? warp_totals[lane] : identity;
        const float ws = warp_inclusive<PROD>(w, lane);
        if (lane < SCAN_WARPS) warp_totals[lane] = ws;
        if (lane == SCAN_WARPS - 1) tile_total = static_cast<double>(ws);
      }
      __syncthreads();
      float before = __shfl_up_sync(0xffffffffu, in_warp, 1);
      if (lane == 0) before = identity;
      if (warp > 0) before = scan_combine<PROD>(warp_totals[warp - 1], before);
#pragma unroll
      for (int j = 0; j < SCAN_ITEMS; ++j) {
        const int64_t s = base + j;
        if (s >= len) break;
        const float local = exclusive ? (j == 0 ? before : scan_combine<PROD>(before, r[j - 1]))
                                      : scan_combine<PROD>(before, r[j]);
        const double value = PROD ? carry * local : carry + local;
        yr[reverse ? len - 1 - s : s] = static_cast<float>(value);
      }
      carry = PROD ? carry * tile_total : carry + tile_total;
      __syncthreads();  // warp_totals and tile_total are rewritten by the next tile
    }
  }
}

template <bool PROD>
__global__ void __launch_bounds__(SCAN_THREADS) stitch_scan_columns_kernel(
    const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t len, int64_t inner,
    bool reverse, bool exclusive) {
  const int64_t columns = outer * inner;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner, i = c - o * inner;
    const float* xc = x + o * len * inner + i;
    float* yc = y + o * len * inner + i;
    float acc = PROD ? 1.f : 0.f, comp = 0.f;
    for (int64_t s = 0; s < len; ++s) {
      const int64_t k = reverse ? len - 1 - s : s;
      const float v = xc[k * inner];
      const float before = acc;
      if (PROD) {
        acc *= v;
      } else {
        const float term = v - comp;
        const float sum = acc + term;
        comp = (sum - acc) - term;
        acc = sum;
      }
      yc[k * inner] = exclusive ? before : acc;
    }
  }
}

template <bool PROD>
static void stitch_scan_dispatch(const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                                 bool reverse, bool exclusive) {
  if (inner == 1) {
    const int64_t blocks = std::min<int64_t>(outer, static_cast<int64_t>(sm_count()) * 16);
    stitch_scan_rows_kernel<PROD><<<blocks, SCAN_THREADS, 0, stitch::current_stream()>>>(
        x, y, outer, len, reverse, exclusive);
  } else {
    const int64_t blocks = std::min<int64_t>((outer * inner + SCAN_THREADS - 1) / SCAN_THREADS,
                                             static_cast<int64_t>(sm_count()) * 8);
    stitch_scan_columns_kernel<PROD><<<blocks, SCAN_THREADS, 0, stitch::current_stream()>>>(
        x, y, outer, len, inner, reverse, exclusive);
  }
}

static void stitch_scan_launch(const float* x, float* y, int64_t outer, int64_t len, int64_t inner, bool prod,
    bool reverse, bool exclusive) {
  if (outer * len * inner == 0) return;
  if (prod) stitch_scan_dispatch<true>(x, y, outer, len, inner, reverse, exclusive);
  else stitch_scan_dispatch<false>(x, y, outer, len, inner, reverse, exclusive);
  STITCH_LAUNCH_CHECK();
}
"""

SCAN_CUDA_HOST = r"""
// Prefix sum/product along one dim (cumsum, cumprod; reverse, exclusive): the blocked scan kernel.
static at::Tensor stitch_scan(const at::Tensor& x0, int64_t dim, bool prod, bool reverse, bool exclusive) {
__SCAN_PRELUDE__
  stitch_scan_launch(x.data_ptr<float>(), out.data_ptr<float>(), outer, len, inner, prod, reverse,
                     exclusive);
  return out;
}
""".replace("__SCAN_PRELUDE__\n", _SCAN_PRELUDE)

# Both backends' host part of the flip: contiguous input, its sizes and the flipped dims as a bit mask.
_FLIP_PRELUDE = r"""  const at::Tensor x = stitch_dense(x0);
  const int64_t rank = x.dim();
  TORCH_CHECK(rank <= 8, "flip: more than 8 dims");
  int64_t sizes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int flips = 0;
  for (int64_t d = 0; d < rank; ++d) sizes[d] = x.size(d);
  for (int64_t d : dims) flips |= 1 << (d < 0 ? d + rank : d);
  at::Tensor out = at::empty(x.sizes(), x.options());
"""

FLIP_CPU = r"""
// torch.flip: each output element gathers the input element at the mirrored index of the flipped dims.
static at::Tensor stitch_flip(const at::Tensor& x0, std::vector<int64_t> dims) {
__FLIP_PRELUDE__
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, x.numel(), 4096, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t rest = o, from = 0, stride = 1;
      for (int64_t d = rank - 1; d >= 0; --d) {
        const int64_t c = rest % sizes[d];
        rest /= sizes[d];
        from += ((flips >> d) & 1 ? sizes[d] - 1 - c : c) * stride;
        stride *= sizes[d];
      }
      dst[o] = src[from];
    }
  });
  return out;
}
""".replace("__FLIP_PRELUDE__\n", _FLIP_PRELUDE)

FLIP_CUDA = r"""
// torch.flip: one thread per output element gathers the mirrored input element (sizes passed by value).
struct FlipDims {
  int64_t size[8];
  int rank;
  int flips;
};

__global__ void __launch_bounds__(256) stitch_flip_kernel(const float* __restrict__ x, float* __restrict__ y,
    FlipDims f, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = o, from = 0, stride = 1;
    for (int d = f.rank - 1; d >= 0; --d) {
      const int64_t c = rest % f.size[d];
      rest /= f.size[d];
      from += ((f.flips >> d) & 1 ? f.size[d] - 1 - c : c) * stride;
      stride *= f.size[d];
    }
    y[o] = x[from];
  }
}

static void stitch_flip_launch(const float* x, float* y, const int64_t* sizes, int rank, int flips,
    int64_t total) {
  if (total == 0) return;
  FlipDims f{};
  for (int d = 0; d < rank; ++d) f.size[d] = sizes[d];
  f.rank = rank;
  f.flips = flips;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_flip_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(x, y, f, total);
  STITCH_LAUNCH_CHECK();
}
"""

FLIP_CUDA_HOST = r"""
// torch.flip: the gather kernel over the contiguous input.
static at::Tensor stitch_flip(const at::Tensor& x0, std::vector<int64_t> dims) {
__FLIP_PRELUDE__
  stitch_flip_launch(x.data_ptr<float>(), out.data_ptr<float>(), sizes, static_cast<int>(rank),
                     flips, x.numel());
  return out;
}
""".replace("__FLIP_PRELUDE__\n", _FLIP_PRELUDE)

# Both backends' host part of triu/tril: contiguous input of at least 2 dims, its last two sizes.
_TRI_PRELUDE = r"""  TORCH_CHECK(x0.dim() >= 2, "triu/tril: the input needs at least 2 dims");
  const at::Tensor x = stitch_dense(x0);
  const int64_t L = x.size(-2), S = x.size(-1);
  at::Tensor out = at::empty(x.sizes(), x.options());
"""

TRI_CPU = r"""
// torch.triu (upper) / torch.tril: element (i, j) of the last two dims kept where j - i >= diagonal
// (upper) or j - i <= diagonal (lower), else zero.
static at::Tensor stitch_tri(const at::Tensor& x0, bool upper, int64_t diagonal) {
__TRI_PRELUDE__
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, x.numel() / std::max<int64_t>(S, 1), 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % L;
      for (int64_t j = 0; j < S; ++j) {
        const bool keep = upper ? j - i >= diagonal : j - i <= diagonal;
        dst[r * S + j] = keep ? src[r * S + j] : 0.f;
      }
    }
  });
  return out;
}
""".replace("__TRI_PRELUDE__\n", _TRI_PRELUDE)

TRI_CUDA = r"""
// torch.triu / torch.tril: one thread per element, kept or zeroed by its (row, column) in the last two dims.
__global__ void __launch_bounds__(256) stitch_tri_kernel(const float* __restrict__ x, float* __restrict__ y,
    int64_t L, int64_t S, bool upper, int64_t diagonal, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = o % S, i = (o / S) % L;
    const bool keep = upper ? j - i >= diagonal : j - i <= diagonal;
    y[o] = keep ? x[o] : 0.f;
  }
}

static void stitch_tri_launch(const float* x, float* y, int64_t L, int64_t S, bool upper, int64_t diagonal,
    int64_t total) {
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_tri_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(x, y, L, S, upper, diagonal, total);
  STITCH_LAUNCH_CHECK();
}
"""

TRI_CUDA_HOST = r"""
// torch.triu / torch.tril: the masking kernel over the contiguous input.
static at::Tensor stitch_tri(const at::Tensor& x0, bool upper, int64_t diagonal) {
__TRI_PRELUDE__
  stitch_tri_launch(x.data_ptr<float>(), out.data_ptr<float>(), L, S, upper, diagonal,
                    x.numel());
  return out;
}
""".replace("__TRI_PRELUDE__\n", _TRI_PRELUDE)

HELPERS = ("scan", "flip", "tri")
_CPU = {"scan": SCAN_CPU, "flip": FLIP_CPU, "tri": TRI_CPU}
_CUDA_DEVICE = {"scan": SCAN_CUDA, "flip": FLIP_CUDA, "tri": TRI_CUDA}
_CUDA_HOST = {"scan": SCAN_CUDA_HOST, "flip": FLIP_CUDA_HOST, "tri": TRI_CUDA_HOST}


def device_source(helpers: set[str], backend: str) -> str:
    """The kernels and raw-pointer launchers of the helpers a program uses (CUDA only)."""
    if backend != "cuda":
        return ""
    return "\n".join(_CUDA_DEVICE[h] for h in HELPERS if h in helpers)


def host_source(helpers: set[str], backend: str) -> str:
    """The tensor-level helpers a program's host code calls (the whole helper on CPU)."""
    table = _CUDA_HOST if backend == "cuda" else _CPU
    return "\n".join(table[h] for h in HELPERS if h in helpers)
