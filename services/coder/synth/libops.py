"""GEMMs and convolutions of a synthesized program: library calls through ATen (cuBLAS/cuDNN, MKL/oneDNN)
or the synthesizer's own kernels (variant gemm=custom), as host helper functions emitted on demand.

Only the helpers a program uses are written into its source, so a program without GEMMs contains no
library call at all. The custom GEMM takes arbitrary strides (a transposed weight is read in place),
accumulates in float on CUDA (double on CPU) and adds the bias in its store; the custom convolutions
(convolution.py) and the GEMM form of einsum (einsum.py) are helpers of their own ("conv", "einsum").
"""

from __future__ import annotations

from stitchcuda.coder.synth import convolution, einsum, scans

# ---- library calls (ATen dispatches to the vendor library) ----------------------------------------------
LIBRARY_HELPERS = {
    "linear": r"""
// nn.Linear through the library: bias folded into the GEMM (addmm) when present.
at::Tensor stitch_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  const at::Tensor x2 = stitch_reshape(x, {-1, x.size(-1)});
  const at::Tensor y = b.has_value() ? at::addmm(*b, x2, w.t()) : at::mm(x2, w.t());
  return y.view(sizes);
}
""",
}

# ---- custom GEMM / conv: shared host wrappers --------------------------------------------------------------
CUSTOM_WRAPPERS = r"""
// One GEMM ready to launch: C[b] = A[b] @ B[b] (+ bias) for strided [batch, M, K] and [batch, K, N] views,
// C contiguous, allocated and not yet written; `out` is C in the caller's shape. geom: batch, M, N, K and
// the strides of A and B (stitch_gemm_launch's dims).
struct StitchGemm {
  at::Tensor x, w, bias, y, out;
  int64_t geom[10];
  const float* bias_ptr() const { return bias.defined() ? bias.data_ptr<float>() : nullptr; }
};

StitchGemm stitch_bgemm_prepare(const at::Tensor& A, const at::Tensor& B,
                                const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(A.dim() == 3 && B.dim() == 3, "gemm operands must be 3-D");
  TORCH_CHECK(A.size(0) == B.size(0) && A.size(2) == B.size(1), "gemm shapes");
  StitchGemm g;
  const int64_t dims[10] = {A.size(0), A.size(1), B.size(2), A.size(2), A.stride(0), A.stride(1),
                            A.stride(2), B.stride(0), B.stride(1), B.stride(2)};
  std::copy(dims, dims + 10, g.geom);
  g.y = at::empty({A.size(0), A.size(1), B.size(2)}, A.options());
  g.out = g.y;
  if (bias.has_value()) {
    g.bias = stitch_dense(*bias);
    TORCH_CHECK(g.bias.numel() == B.size(2), "gemm bias must have N elements");
  }
  g.x = A;
  g.w = B;
  return g;
}

// nn.Linear: x [..., K] @ w[N, K]^T (+ b), as one GEMM over the flattened leading dims.
StitchGemm stitch_linear_prepare(const at::Tensor& x, const at::Tensor& w,
                                 const c10::optional<at::Tensor>& b) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  const at::Tensor x2 = stitch_reshape(x, {-1, x.size(-1)});
  StitchGemm g = stitch_bgemm_prepare(x2.unsqueeze(0), w.t().unsqueeze(0), b);
  g.out = g.y.view(sizes);
  return g;
}
"""

# The GEMMs launched without an epilogue: only in programs that launch one.
GEMM_PLAIN_WRAPPERS = r"""
at::Tensor stitch_bgemm(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias) {
  const StitchGemm g = stitch_bgemm_prepare(A, B, bias);
  stitch_gemm_launch(g.x.data_ptr<float>(), g.w.data_ptr<float>(), g.bias_ptr(), g.y.data_ptr<float>(),
                     g.geom);
  return g.y;
}

at::Tensor stitch_mm(const at::Tensor& a, const at::Tensor& b) {
  return stitch_bgemm(a.unsqueeze(0), b.unsqueeze(0), c10::nullopt).squeeze(0);
}

at::Tensor stitch_addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  return stitch_bgemm(a.unsqueeze(0), b.unsqueeze(0), c10::optional<at::Tensor>(bias)).squeeze(0);
}

at::Tensor stitch_bmm(const at::Tensor& a, const at::Tensor& b) { return stitch_bgemm(a, b, c10::nullopt); }

// torch.matmul semantics: 1-D operands, broadcast batch dims.
at::Tensor stitch_matmul(const at::Tensor& a0, const at::Tensor& b0) {
  const at::Tensor a = a0.dim() == 1 ? a0.unsqueeze(0) : a0;
  const at::Tensor b = b0.dim() == 1 ? b0.unsqueeze(1) : b0;
  std::vector<int64_t> ab(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  const std::vector<int64_t> batch = stitch::broadcast({at::IntArrayRef(ab), at::IntArrayRef(bb)});
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  std::vector<int64_t> ea(batch), eb(batch);
  ea.push_back(M); ea.push_back(K);
  eb.push_back(K); eb.push_back(N);
  const at::Tensor A = stitch_reshape(a.expand(ea), {-1, M, K});
  const at::Tensor B = stitch_reshape(b.expand(eb), {-1, K, N});
  at::Tensor C = stitch_bgemm(A, B, c10::nullopt);
  std::vector<int64_t> out(batch);
  if (a0.dim() > 1) out.push_back(M);
  if (b0.dim() > 1) out.push_back(N);
  return C.view(out);
}

at::Tensor stitch_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  const StitchGemm g = stitch_linear_prepare(x, w, b);
  stitch_gemm_launch(g.x.data_ptr<float>(), g.w.data_ptr<float>(), g.bias_ptr(), g.y.data_ptr<float>(),
                     g.geom);
  return g.out;
}
"""

CPU_KERNELS = r"""
// Custom GEMM (CPU): one task per output row; rows of B contiguous -> axpy form, else dot products.
// dims: batch, M, N, K, then the strides sAb, sAm, sAk, sBb, sBk, sBn.
static void stitch_gemm_launch(const float* A, const float* B, const float* bias, float* C,
                               const int64_t* dims) {
  const int64_t batch = dims[0], M = dims[1], N = dims[2], K = dims[3], sAb = dims[4], sAm = dims[5],
                sAk = dims[6], sBb = dims[7], sBk = dims[8], sBn = dims[9];
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(N * K, 1));
  at::parallel_for(0, batch * M, grain, [&](int64_t r0, int64_t r1) {
    std::vector<double> acc(static_cast<size_t>(N));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / M, i = r - (r / M) * M;
      const float* a = A + b * sAb + i * sAm;
      const float* bb = B + b * sBb;
      float* c = C + r * N;
      if (sBn == 1) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t k = 0; k < K; ++k) {
          const double av = a[k * sAk];
          const float* brow = bb + k * sBk;
          for (int64_t n = 0; n < N; ++n) acc[n] += av * static_cast<double>(brow[n]);
        }
        for (int64_t n = 0; n < N; ++n) c[n] = static_cast<float>(acc[n] + (bias ? bias[n] : 0.0));
      } else {
        for (int64_t n = 0; n < N; ++n) {
          const float* bcol = bb + n * sBn;
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k)
            s += static_cast<double>(a[k * sAk]) * static_cast<double>(bcol[k * sBk]);
          c[n] = static_cast<float>(s + (bias ? bias[n] : 0.0));
        }
      }
    }
  });
}
"""

CUDA_KERNELS = r"""
// Custom SGEMM (CUDA): 64x64 block tiles over K in steps of 16, shared-memory staging that follows the
// operands' contiguous dimension, a 4x4 register tile per thread, the bias added in the store.
constexpr int GBM = 64, GBN = 64, GBK = 16;
template <typename Epi>
__global__ void __launch_bounds__(256) stitch_gemm_kernel(
    const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
        float* __restrict__ C,
    int64_t M, int64_t N, int64_t K, int64_t sAb, int64_t sAm, int64_t sAk, int64_t sBb, int64_t sBk,
        int64_t sBn, Epi epi) {
  __shared__ __align__(16) float As[GBK][GBM + 4];
  __shared__ __align__(16) float Bs[GBK][GBN + 4];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * GBM, n0 = static_cast<int64_t>(blockIdx.x) * GBN;
  const float* Ab = A + static_cast<int64_t>(blockIdx.z) * sAb;
  const float* Bb = B + static_cast<int64_t>(blockIdx.z) * sBb;
  const bool a_k_contig = sAk == 1, b_n_contig = sBn == 1;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += GBK) {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int idx = tid + l * 256;
      const int kk = a_k_contig ? idx % GBK : idx / GBM;
      const int mm = a_k_contig ? idx / GBK : idx % GBM;
      const int64_t gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < M && gk < K) ? Ab[gm * sAm + gk * sAk] : 0.f;
      const int bk = b_n_contig ? idx / GBN : idx % GBK;
      const int bn = b_n_contig ? idx % GBN : idx / GBK;
      const int64_t gn = n0 + bn, gk2 = k0 + bk;
      Bs[bk][bn] = (gn < N && gk2 < K) ? Bb[gk2 * sBk + gn * sBn] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < GBK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  const int64_t cb = static_cast<int64_t>(blockIdx.z) * M * N;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t gm = m0 + ty * 4 + i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gn = n0 + tx * 4 + j, at = cb + gm * N + gn;
      if (gn < N) C[at] = epi(acc[i][j] + (bias != nullptr ? bias[gn] : 0.f), at);
    }
  }
}

// Custom SGEMM, large tiles (CUDA): 128x128 block tiles over K in steps of 8, the next step's loads in
// registers while this step's products run (two shared buffers, one barrier a step). Each operand is staged
// along its contiguous dimension (a warp reads 32 consecutive elements, or 4 rows of 8 along K).
constexpr int HBM = 128, HBN = 128, HBK = 8;
template <typename I>
struct GemmTiles {
  I M, N, K, sAm, sAk, sBk, sBn, m0, n0;
  const float* Ab;
  const float* Bb;
  bool a_k_contig, b_k_contig;
  int tid;
  float a_reg[4], b_reg[4];

  __device__ __forceinline__ GemmTiles(const float* A, const float* B, I M_, I N_, I K_, I sAb, I sAm_,
                                       I sAk_, I sBb, I sBk_, I sBn_, int tid_)
      : M(M_), N(N_), K(K_), sAm(sAm_), sAk(sAk_), sBk(sBk_), sBn(sBn_), tid(tid_) {
    m0 = static_cast<I>(blockIdx.y) * HBM;
    n0 = static_cast<I>(blockIdx.x) * HBN;
    Ab = A + static_cast<int64_t>(blockIdx.z) * sAb;
    Bb = B + static_cast<int64_t>(blockIdx.z) * sBb;
    a_k_contig = sAk == 1 && sAm != 1;
    b_k_contig = sBk == 1 && sBn != 1;
  }
  // Element e (0..3) of this thread's loads: (row along K, column along M or N) of the tile.
  __device__ __forceinline__ void at(bool k_contig, int e, int& k, int& mn) const {
    if (k_contig) k = (tid & 1) * 4 + e, mn = tid >> 1;
    else k = tid >> 5, mn = (tid & 31) + 32 * e;
  }
  __device__ __forceinline__ void load(I k0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int k, m, n;
      at(a_k_contig, e, k, m);
      const I gk = k0 + k, gm = m0 + m;
      a_reg[e] = (gm < M && gk < K) ? __ldg(Ab + gm * sAm + gk * sAk) : 0.f;
      at(b_k_contig, e, k, n);
      const I gk2 = k0 + k, gn = n0 + n;
      b_reg[e] = (gn < N && gk2 < K) ? __ldg(Bb + gk2 * sBk + gn * sBn) : 0.f;
    }
  }
  template <int LD>
  __device__ __forceinline__ void store(float (*As)[LD], float (*Bs)[LD]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int k, m, n;
      at(a_k_contig, e, k, m);
      As[k][m] = a_reg[e];
      at(b_k_contig, e, k, n);
      Bs[k][n] = b_reg[e];
    }
  }
};

// SIMT: 8x8 outputs a thread, summed in float in K order; lanes take consecutive output columns, so stores
// are coalesced.
template <typename I, typename Epi>
__global__ void __launch_bounds__(256, sizeof(I) == 4 ? 2 : 1) stitch_gemm_big_kernel(
    const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
    float* __restrict__ C, I M, I N, I K, I sAb, I sAm, I sAk, I sBb, I sBk, I sBn, Epi epi) {
  __shared__ __align__(16) float As[2][HBK][HBM + 4];
  __shared__ __align__(16) float Bs[2][HBK][HBN + 4];
  const int tid = threadIdx.x;
  GemmTiles<I> t(A, B, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, tid);
  const int tx = tid & 15, ty = tid >> 4;  // tx: output columns, ty: output rows
  float acc[8][8] = {};
  t.load(0);
  t.store(As[0], Bs[0]);
  __syncthreads();
  int buf = 0;
  for (I k0 = 0; k0 < K; k0 += HBK) {
    const bool next = k0 + HBK < K;
    if (next) t.load(k0 + HBK);
#pragma unroll
    for (int kk = 0; kk < HBK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][64 + tx * 4]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (next) t.store(As[buf ^ 1], Bs[buf ^ 1]);
    __syncthreads();
    buf ^= 1;
  }
  const I cb = static_cast<I>(blockIdx.z) * M * N;  // C's flat index of this batch's first element
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const I gm = t.m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const I gn = t.n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4), at = cb + gm * N + gn;
      if (gn < N) C[at] = epi(acc[i][j] + (bias != nullptr ? __ldg(bias + gn) : 0.f), at);
    }
  }
}

// Tensor cores in float32 accuracy (3xTF32, sm_80 and later; tf32_split): each warp computes a 64 x 32
// block of the tile as 16 x 16 fragments; rows padded to 8 floats past 32 banks for the fragment loads.
// The accumulators go out through a per-warp 16 x 16 stage in shared memory, row-major, so a half-warp
// stores 16 consecutive columns.
constexpr int HPAD = 8;
template <typename I, typename Epi>
__global__ void __launch_bounds__(256) stitch_gemm_tc_kernel(
    const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
    float* __restrict__ C, I M, I N, I K, I sAb, I sAm, I sAk, I sBb, I sBk, I sBn, Epi epi) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  constexpr int WM = 64, FM = WM / 16, FN = 2, WARPS_M = HBM / WM;
  __shared__ __align__(32) float As[2][HBK][HBM + HPAD];
  __shared__ __align__(32) float Bs[2][HBK][HBN + HPAD];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * 32;
  GemmTiles<I> t(A, B, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, tid);
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  t.load(0);
  t.store(As[0], Bs[0]);
  __syncthreads();
  int buf = 0;
  for (I k0 = 0; k0 < K; k0 += HBK) {
    const bool next = k0 + HBK < K;
    if (next) t.load(k0 + HBK);
    tf32x3_step(acc, &As[buf][0][wm], HBM + HPAD, &Bs[buf][0][wn], HBN + HPAD);
    if (next) t.store(As[buf ^ 1], Bs[buf ^ 1]);
    __syncthreads();
    buf ^= 1;
  }
  const I cb = static_cast<I>(blockIdx.z) * M * N;  // C's flat index of this batch's first element
  float* stage = &As[0][0][0] + warp * 256;  // the A tiles are free now (the loop ended on a barrier)
  const int c = lane & 15;
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const I gn = t.n0 + wn + 16 * j + c;
      if (gn < N) {
        const float b = bias != nullptr ? __ldg(bias + gn) : 0.f;
#pragma unroll
        for (int r = lane >> 4; r < 16; r += 2) {
          const I gm = t.m0 + wm + 16 * i + r;
          if (gm < M) C[cb + gm * N + gn] = epi(stage[r * 16 + c] + b, cb + gm * N + gn);
        }
      }
      __syncwarp();
    }
  }
#endif
}

// Tensor cores (3xTF32) from compute capability 8.0, the SIMT kernel before.
template <typename I, typename Epi>
static void stitch_gemm_big_run(const dim3& grid, cudaStream_t stream, const float* A, const float* B,
                                const float* bias, float* C, int64_t M, int64_t N, int64_t K, int64_t sAb,
                                int64_t sAm, int64_t sAk, int64_t sBb, int64_t sBk, int64_t sBn,
                                const Epi& epi) {
  auto i = [](int64_t v) { return static_cast<I>(v); };
  if (stitch_tensor_cores())
    stitch_gemm_tc_kernel<I, Epi><<<grid, 256, 0, stream>>>(A, B, bias, C, i(M), i(N), i(K), i(sAb), i(sAm),
                                                            i(sAk), i(sBb), i(sBk), i(sBn), epi);
  else
    stitch_gemm_big_kernel<I, Epi><<<grid, 256, 0, stream>>>(A, B, bias, C, i(M), i(N), i(K), i(sAb), i(sAm),
                                                             i(sAk), i(sBb), i(sBk), i(sBn), epi);
}

// The large tiles where they fill the device at two blocks an SM; the 64x64 kernel otherwise.
template <typename Epi>
static bool stitch_gemm_big(const float* A, const float* B, const float* bias, float* C, int64_t batch,
                            int64_t M, int64_t N, int64_t K, int64_t sAb, int64_t sAm, int64_t sAk,
                            int64_t sBb, int64_t sBk, int64_t sBn, const Epi& epi) {
  const int64_t tiles_m = (M + HBM - 1) / HBM, tiles_n = (N + HBN - 1) / HBN;
  if (tiles_m * tiles_n * batch < 2 * sm_count() || tiles_m > 65535) return false;
  const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m),
                  static_cast<unsigned>(batch));
  cudaStream_t stream = stitch::current_stream();
  // 32-bit index math where every offset of A, B and C fits in 31 bits.
  auto span = [](int64_t b, int64_t sb, int64_t r, int64_t sr, int64_t c, int64_t sc) {
    return (b - 1) * std::abs(sb) + (r - 1) * std::abs(sr) + (c - 1) * std::abs(sc) + 1;
  };
  const int64_t limit = int64_t{1} << 31;
  if (span(batch, sAb, M, sAm, K, sAk) < limit && span(batch, sBb, K, sBk, N, sBn) < limit &&
      batch * M * N < limit)
    stitch_gemm_big_run<int32_t>(grid, stream, A, B, bias, C, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, epi);
  else
    stitch_gemm_big_run<int64_t>(grid, stream, A, B, bias, C, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, epi);
  STITCH_LAUNCH_CHECK();
  return true;
}

// Skinny GEMM (CUDA): C[b] = A[b] @ B[b] (+ bias) where A has at most kSkM rows (a small batch through a
// Linear, an RNN's recurrent step). Such a GEMM is bound by reading B once; the tiled kernels would run
// 64- or 128-row tiles nearly empty, and the Hopper path would first split all of B into TF32 parts. A block
// takes kSkCols(kKContig) columns of one batch; its threads split K into slices, each thread summing every
// row's products over its slice (one B load feeds up to kSkM FMAs), then the slices are summed in shared
// memory. A warp reads B along its contiguous dim: its lanes walk K where B is K-contiguous (nn.Linear's
// weight, transposed), they take 32 adjacent columns where B is N-contiguous. The loops stride by blockDim
// and gridDim, so the same text runs with any number of threads and blocks.
constexpr int kSkM = 16, kSkThreads = 256;
template <bool kKContig>
struct SkinnyShape {
  static constexpr int slices = kKContig ? 32 : 8, cols = kSkThreads / slices;
};
template <bool kKContig, typename Epi>
__global__ void __launch_bounds__(kSkThreads) stitch_gemm_skinny_kernel(
    const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
    float* __restrict__ C, int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sAb, int64_t sAm,
    int64_t sAk, int64_t sBb, int64_t sBk, int64_t sBn, Epi epi) {
  constexpr int kSlices = SkinnyShape<kKContig>::slices, kCols = SkinnyShape<kKContig>::cols;
  // One partial sum per row and (slice, column) pair; a row is padded by one so a warp's reads of one
  // column's slices (K-contiguous) fall on distinct banks.
  __shared__ float part[kSkM][kSkThreads + 1];
  const int64_t tiles_n = (N + kCols - 1) / kCols;
  for (int64_t tile = blockIdx.x; tile < tiles_n * batch; tile += gridDim.x) {
    const int64_t b = tile / tiles_n, n0 = (tile - b * tiles_n) * kCols;
    const float* Ab = A + b * sAb;
    const float* Bb = B + b * sBb;
    for (int v = threadIdx.x; v < kSkThreads; v += blockDim.x) {
      const int slice = kKContig ? v % kSlices : v / kCols, col = kKContig ? v / kSlices : v % kCols;
      const int64_t n = n0 + col;
      float acc[kSkM];
#pragma unroll
      for (int m = 0; m < kSkM; ++m) acc[m] = 0.f;
      if (n < N) {
        const float* bp = Bb + n * sBn;
        for (int64_t k = slice; k < K; k += kSlices) {
          const float bv = __ldg(bp + k * sBk);
          const float* ap = Ab + k * sAk;
#pragma unroll
          for (int m = 0; m < kSkM; ++m)
            if (m < M) acc[m] = fmaf(__ldg(ap + m * sAm), bv, acc[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < kSkM; ++m) part[m][v] = acc[m];
    }
    __syncthreads();
    for (int p = threadIdx.x; p < kSkM * kCols; p += blockDim.x) {
      const int m = p / kCols, col = p - (p / kCols) * kCols;
      const int64_t n = n0 + col;
      if (m < M && n < N) {
        float sum = 0.f;
        for (int sl = 0; sl < kSlices; ++sl) sum += part[m][kKContig ? col * kSlices + sl : sl * kCols + col];
        if (bias != nullptr) sum += __ldg(bias + n);
        const int64_t at = (b * M + m) * N + n;
        C[at] = epi(sum, at);
      }
    }
    __syncthreads();
  }
}

// The skinny kernel where A has at most kSkM rows, B is contiguous along K or N and the columns keep the SMs
// busy; false otherwise.
template <typename Epi>
static bool stitch_gemm_skinny(const float* A, const float* B, const float* bias, float* C, int64_t batch,
                               int64_t M, int64_t N, int64_t K, int64_t sAb, int64_t sAm, int64_t sAk,
                               int64_t sBb, int64_t sBk, int64_t sBn, const Epi& epi) {
  const bool k_contig = sBk == 1 && (sBn != 1 || K >= N);
  if (M > kSkM || (!k_contig && sBn != 1)) return false;
  const int64_t cols = k_contig ? SkinnyShape<true>::cols : SkinnyShape<false>::cols;
  const int64_t tiles = (N + cols - 1) / cols * batch;
  const int64_t most = static_cast<int64_t>(sm_count()) * 8;
  // Few columns over a long K would leave most SMs idle for the whole K: the split-K GEMMs take those.
  if (tiles * 4 < sm_count() && K >= 8192) return false;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, most));
  cudaStream_t stream = stitch::current_stream();
  if (k_contig)
    stitch_gemm_skinny_kernel<true, Epi><<<blocks, kSkThreads, 0, stream>>>(A, B, bias, C, batch, M, N, K,
                                                                          sAb, sAm, sAk, sBb, sBk, sBn, epi);
  else
    stitch_gemm_skinny_kernel<false, Epi><<<blocks, kSkThreads, 0, stream>>>(A, B, bias, C, batch, M, N, K,
                                                                           sAb, sAm, sAk, sBb, sBk, sBn, epi);
  STITCH_LAUNCH_CHECK();
  return true;
}

// One GEMM with its epilogue (`epi(v, i)`: v the element of C, bias included, i its flat index in C).
// dims: batch, M, N, K, then the strides sAb, sAm, sAk, sBb, sBk, sBn.
template <typename Epi>
static void stitch_gemm_with(const float* A, const float* B, const float* bias, float* C, const int64_t* dims,
                             const Epi& epi) {
  const int64_t batch = dims[0], M = dims[1], N = dims[2], K = dims[3], sAb = dims[4], sAm = dims[5],
                sAk = dims[6], sBb = dims[7], sBk = dims[8], sBn = dims[9];
  if (batch == 0 || M == 0 || N == 0) return;
  if (stitch_gemm_skinny(A, B, bias, C, batch, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, epi)) return;
  STITCH_CHECK(batch <= 65535, "custom gemm: batch too large");
  if (stitch_gemm_big(A, B, bias, C, batch, M, N, K, sAb, sAm, sAk, sBb, sBk, sBn, epi)) return;
  const dim3 grid(static_cast<unsigned>((N + GBN - 1) / GBN), static_cast<unsigned>((M + GBM - 1) / GBM),
                  static_cast<unsigned>(batch));
  stitch_gemm_kernel<Epi><<<grid, 256, 0, stitch::current_stream()>>>(A, B, bias, C, M, N, K, sAb, sAm, sAk,
                                                                      sBb, sBk, sBn, epi);
  STITCH_LAUNCH_CHECK();
}
"""

# The GEMM's launcher without an epilogue (CUDA): only in programs that launch one.
CUDA_GEMM_PLAIN = r"""
static void stitch_gemm_launch(const float* A, const float* B, const float* bias, float* C,
                               const int64_t* dims) {
  stitch_gemm_with(A, B, bias, C, dims, StitchNoEpi{});
}
"""

# The same where the program's GEMMs are CUTLASS templates (variant gemm_kernel=cutlass, cutlass_gemm.py):
# CUTLASS first where the device has its tensor cores (compute capability 8.0; the variant mma governs only
# the own kernels), the own kernels for a GEMM it cannot take.
CUDA_GEMM_CUTLASS = r"""
static void stitch_gemm_launch(const float* A, const float* B, const float* bias, float* C,
                               const int64_t* dims) {
  if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) return;
  // A few rows (an RNN's step, a small batch): the skinny kernel reads B once, CUTLASS would tile it.
  if (dims[1] <= kSkM && stitch_gemm_skinny(A, B, bias, C, dims[0], dims[1], dims[2], dims[3], dims[4],
                                            dims[5], dims[6], dims[7], dims[8], dims[9], StitchNoEpi{}))
    return;
  if (stitch_tensor_core_device() && stitch_cutlass_gemm(A, B, bias, C, dims)) return;
  stitch_gemm_with(A, B, bias, C, dims, StitchNoEpi{});
}
"""

CAUSAL_CPU = r"""
// Causal mask of attention scores [..., L, S], in place: -inf where key index > query index.
static void stitch_causal_fill(at::Tensor& scores) {
  const int64_t L = scores.size(-2), S = scores.size(-1), total = scores.numel();
  float* p = scores.data_ptr<float>();
  at::parallel_for(0, total / std::max<int64_t>(S, 1), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % L;
      for (int64_t j = i + 1; j < S; ++j) p[r * S + j] = -INFINITY;
    }
  });
}
"""

CAUSAL_CUDA = r"""
__global__ void __launch_bounds__(256) stitch_causal_kernel(float* __restrict__ p, int64_t L, int64_t S,
    int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = o % S, i = (o / S) % L;
    if (j > i) p[o] = -INFINITY;
  }
}

static void stitch_causal_launch(float* p, int64_t L, int64_t S, int64_t total) {
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_causal_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(p, L, S, total);
  STITCH_LAUNCH_CHECK();
}
"""

CAUSAL_CUDA_HOST = r"""
// Causal mask of attention scores [..., L, S], in place: -inf where key index > query index.
static void stitch_causal_fill(at::Tensor& scores) {
  stitch_causal_launch(scores.data_ptr<float>(), scores.size(-2), scores.size(-1), scores.numel());
}
"""


# ---- dense copies: a strided view made contiguous by the program's own kernel ----------------------------
# torch's contiguous() is an ATen copy kernel: a ViT's expanded class token in a cat, or the class row picked
# before its head, made ATen the program's largest kernel at small sizes (D6). Every helper and operand that
# needs a dense tensor gets it from stitch_dense: a no-op for a contiguous tensor, else one gather kernel
# over the view's dims, collapsed (size-1 dims dropped, dims that are one run merged) to at most 8.
_DENSE_LAYOUT = r"""
// The view's dims, outermost first, with size-1 dims dropped and neighbours that form one run merged:
// meta[0..7] sizes, meta[8..15] strides, meta[16] rank. False past 8 dims (torch then copies).
inline bool stitch_dense_layout(const at::Tensor& t, int64_t* meta) {
  int64_t rank = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t n = t.size(d), stride = t.stride(d);
    if (n == 1) continue;
    if (rank > 0 && meta[8 + rank - 1] == n * stride) {
      meta[rank - 1] *= n;
      meta[8 + rank - 1] = stride;
      continue;
    }
    if (rank == 8) return false;
    meta[rank] = n;
    meta[8 + rank] = stride;
    ++rank;
  }
  meta[16] = rank;
  return true;
}
"""

_DENSE_INDEX = r"""
struct StitchStrided {
  int64_t size[8];
  int64_t stride[8];
  int64_t rank;
};

static StitchStrided stitch_strided_unpack(const int64_t* meta) {
  StitchStrided s{};
  for (int d = 0; d < 8; ++d) {
    s.size[d] = meta[d];
    s.stride[d] = meta[8 + d];
  }
  s.rank = meta[16];
  return s;
}

// Where element o of the view's dense copy sits in the view.
STITCH_HD int64_t stitch_strided_offset(const StitchStrided& s, int64_t o) {
  int64_t at = 0;
  STITCH_UNROLL
  for (int d = 7; d >= 0; --d) {
    if (d < s.rank) {
      at += (o % s.size[d]) * s.stride[d];
      o /= s.size[d];
    }
  }
  return at;
}
"""

_RESHAPE = r"""
// Whether t's elements in order form a view of shape (ATen's rule for reshape: each run of t's dims that is
// one stride chain must be covered by whole dims of shape).
inline bool stitch_viewable(const at::Tensor& t, const std::vector<int64_t>& shape) {
  const int64_t dims = t.dim();
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t base = t.stride(dims - 1), tensor_numel = 1, view_numel = 1;
  for (int64_t d = dims - 1; d >= 0; --d) {
    tensor_numel *= t.size(d);
    if (d == 0 || (t.size(d - 1) != 1 && t.stride(d - 1) != tensor_numel * base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) view_numel *= shape[view_d--];
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        base = t.stride(d - 1);
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// t.reshape(sizes) whose copy, where no view exists, is the program's own (stitch_dense), not ATen's.
[[maybe_unused]] static at::Tensor stitch_reshape(const at::Tensor& t, at::IntArrayRef sizes) {
  if (t.is_contiguous() || t.dim() == 0 || t.numel() == 0) return t.reshape(sizes);
  std::vector<int64_t> shape(sizes.begin(), sizes.end());
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      TORCH_CHECK(infer < 0, "only one dimension can be inferred");
      infer = static_cast<int64_t>(d);
    } else {
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    TORCH_CHECK(known != 0 && t.numel() % known == 0, "shape ", sizes, " is invalid for input of size ",
                t.numel());
    shape[infer] = t.numel() / known;
  }
  int64_t count = 1;
  for (int64_t n : shape) count *= n;
  TORCH_CHECK(count == t.numel(), "shape ", sizes, " is invalid for input of size ", t.numel());
  return stitch_viewable(t, shape) ? t.view(shape) : stitch_dense(t).view(shape);
}

// t.flatten(start, end) through stitch_reshape.
[[maybe_unused]] static at::Tensor stitch_flatten(const at::Tensor& t, int64_t start, int64_t end) {
  const int64_t dims = t.dim();
  if (dims == 0) return t.reshape({1});
  if (start < 0) start += dims;
  if (end < 0) end += dims;
  if (start == end) return t;
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().begin() + start);
  int64_t run = 1;
  for (int64_t d = start; d <= end; ++d) run *= t.size(d);
  shape.push_back(run);
  for (int64_t d = end + 1; d < dims; ++d) shape.push_back(t.size(d));
  return stitch_reshape(t, shape);
}
"""

DENSE_CPU = (
    _DENSE_LAYOUT
    + _DENSE_INDEX
    + r"""
template <typename T>
static void stitch_dense_copy(const T* src, T* dst, const StitchStrided& s, int64_t total) {
  at::parallel_for(0, total, 4096, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) dst[o] = src[stitch_strided_offset(s, o)];
  });
}

// t as a contiguous tensor: t itself when it is, else the program's own copy of the view.
[[maybe_unused]] static at::Tensor stitch_dense(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  int64_t meta[17] = {0};
  if (!stitch_dense_layout(t, meta)) return t.contiguous();
  at::Tensor out = at::empty(t.sizes(), t.options());
  const StitchStrided s = stitch_strided_unpack(meta);
  const int64_t total = t.numel();
  switch (t.element_size()) {
    case 1: stitch_dense_copy(static_cast<const uint8_t*>(t.data_ptr()),
                              static_cast<uint8_t*>(out.data_ptr()), s, total); break;
    case 2: stitch_dense_copy(static_cast<const uint16_t*>(t.data_ptr()),
                              static_cast<uint16_t*>(out.data_ptr()), s, total); break;
    case 4: stitch_dense_copy(static_cast<const uint32_t*>(t.data_ptr()),
                              static_cast<uint32_t*>(out.data_ptr()), s, total); break;
    case 8: stitch_dense_copy(static_cast<const uint64_t*>(t.data_ptr()),
                              static_cast<uint64_t*>(out.data_ptr()), s, total); break;
    default: return t.contiguous();
  }
  return out;
}
"""
    + _RESHAPE
)

DENSE_CUDA = (
    _DENSE_INDEX
    + r"""
template <typename T>
__global__ void __launch_bounds__(256) stitch_dense_kernel(const T* __restrict__ src, T* __restrict__ dst,
    StitchStrided s, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[o] = src[stitch_strided_offset(s, o)];
}

template <typename T>
static void stitch_dense_typed(const void* src, void* dst, const StitchStrided& s, int64_t total) {
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_dense_kernel<T><<<blocks, 256, 0, stitch::current_stream()>>>(static_cast<const T*>(src),
                                                                        static_cast<T*>(dst), s, total);
  STITCH_LAUNCH_CHECK();
}

// Elements of 1, 2, 4 or 8 bytes gathered from the view that meta describes into a dense buffer.
static void stitch_dense_launch(const void* src, void* dst, int64_t element_size, const int64_t* meta,
    int64_t total) {
  if (total == 0) return;
  const StitchStrided s = stitch_strided_unpack(meta);
  if (element_size == 1) stitch_dense_typed<uint8_t>(src, dst, s, total);
  else if (element_size == 2) stitch_dense_typed<uint16_t>(src, dst, s, total);
  else if (element_size == 4) stitch_dense_typed<uint32_t>(src, dst, s, total);
  else stitch_dense_typed<uint64_t>(src, dst, s, total);
}
"""
)


DENSE_CUDA_HOST = (
    _DENSE_LAYOUT
    + r"""
// t as a contiguous tensor: t itself when it is, else the program's own copy of the view (one kernel; a
// host tensor, such as an index made on the CPU, is copied by torch).
[[maybe_unused]] static at::Tensor stitch_dense(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  if (!t.is_cuda()) return t.contiguous();
  int64_t meta[17] = {0};
  const int64_t size = static_cast<int64_t>(t.element_size());
  if (!stitch_dense_layout(t, meta) || (size != 1 && size != 2 && size != 4 && size != 8)) {
    return t.contiguous();
  }
  at::Tensor out = at::empty(t.sizes(), t.options());
  stitch_dense_launch(t.data_ptr(), out.data_ptr(), size, meta, t.numel());
  return out;
}
"""
    + _RESHAPE
)


# Both backends' host part: checks the parts, allocates the output, splits it into rows x cat-dim x inner.
_CAT_PRELUDE = r"""  TORCH_CHECK(!parts.empty(), "cat of no tensors");
  const int64_t rank = parts[0].dim();
  if (dim < 0) dim += rank;
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[dim] = 0;
  for (const at::Tensor& p : parts) {
    TORCH_CHECK(p.dim() == rank, "cat: parts of different ranks");
    for (int64_t d = 0; d < rank; ++d)
      TORCH_CHECK(d == dim || p.size(d) == parts[0].size(d), "cat: sizes differ off the cat dim");
    sizes[dim] += p.size(dim);
  }
  at::Tensor out = at::empty(sizes, parts[0].options());
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) rows *= sizes[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= sizes[d];
"""

CAT_CPU = r"""
// torch.cat of float32 tensors along one dim: each part's rows copied into their slice of the output.
static at::Tensor stitch_cat(const std::vector<at::Tensor>& parts, int64_t dim) {
__CAT_PRELUDE__  const int64_t width = sizes[dim] * inner;
  float* dst = out.data_ptr<float>();
  int64_t offset = 0;
  for (const at::Tensor& part : parts) {
    const at::Tensor p = stitch_dense(part);
    const int64_t span = p.size(dim) * inner;
    const float* src = p.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::copy(src + r * span, src + (r + 1) * span, dst + r * width + offset);
    });
    offset += span;
  }
  return out;
}
""".replace("__CAT_PRELUDE__", _CAT_PRELUDE)

CAT_CUDA = r"""
__global__ void __launch_bounds__(256) stitch_cat_kernel(const float* __restrict__ src,
    float* __restrict__ dst, int64_t span, int64_t width, int64_t offset, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = o / span;
    dst[r * width + offset + (o - r * span)] = src[o];
  }
}

static void stitch_cat_launch(const float* src, float* dst, int64_t rows, int64_t span, int64_t width,
    int64_t offset) {
  const int64_t total = rows * span;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_cat_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(src, dst, span, width, offset, total);
  STITCH_LAUNCH_CHECK();
}
"""

CAT_CUDA_HOST = r"""
// torch.cat of float32 tensors along one dim: one copy kernel per part into its slice of the output.
static at::Tensor stitch_cat(const std::vector<at::Tensor>& parts, int64_t dim) {
__CAT_PRELUDE__  int64_t offset = 0;
  for (const at::Tensor& part : parts) {
    const at::Tensor p = stitch_dense(part);
    const int64_t span = p.size(dim) * inner;
    stitch_cat_launch(p.data_ptr<float>(), out.data_ptr<float>(), rows, span, sizes[dim] * inner, offset);
    offset += span;
  }
  return out;
}
""".replace("__CAT_PRELUDE__", _CAT_PRELUDE)

# A concatenation along dim 1 some of whose parts their convolutions wrote in place (convolution.py's
# StitchCatInto): the other parts are copied into their slices, and the buffer becomes the result.
CAT_INTO_CUDA_HOST = r"""
static at::Tensor stitch_cat_into(StitchCatInto& into, const std::vector<at::Tensor>& parts,
                                  const std::vector<bool>& written) {
  at::Tensor out = std::move(into.buf);
  into.buf = at::Tensor();
  const int64_t channels = into.channels;
  TORCH_CHECK(out.defined() && out.dim() >= 2 && out.size(1) == channels,
              "cat: the concatenation its convolutions write was not allocated");
  const int64_t rows = out.size(0), inner = out.numel() / std::max<int64_t>(1, rows * channels);
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const at::Tensor& part = parts[i];
    TORCH_CHECK(part.dim() == out.dim(), "cat: parts of different ranks");
    for (int64_t d = 0; d < out.dim(); ++d)
      TORCH_CHECK(d == 1 || part.size(d) == out.size(d), "cat: sizes differ off the cat dim");
    if (written[i]) {
      TORCH_CHECK(part.is_alias_of(out) && part.storage_offset() == out.storage_offset() + offset * inner,
                  "cat: a part written in place is not at its slice");
    } else {
      const at::Tensor p = stitch_dense(part);
      stitch_cat_launch(p.data_ptr<float>(), out.data_ptr<float>(), rows, p.size(1) * inner, channels * inner,
                        offset * inner);
    }
    offset += part.size(1);
  }
  TORCH_CHECK(offset == channels, "cat: the parts do not fill the concatenation");
  return out;
}
"""


# ---- indexing by an int64 tensor: index_select, embedding, x[index] ----------------------------------------
_INDEX_PRELUDE = r"""  if (dim < 0) dim += src.dim();
  TORCH_CHECK(dim >= 0 && dim < src.dim(), "index: dim out of range");
  TORCH_CHECK(index.scalar_type() == at::kLong, "index: the index must be int64");
  const at::Tensor s = stitch_dense(src);
  const at::Tensor idx = stitch_dense(index);
  std::vector<int64_t> sizes(s.sizes().begin(), s.sizes().begin() + dim);
  for (int64_t d : idx.sizes()) sizes.push_back(d);
  for (int64_t d = dim + 1; d < s.dim(); ++d) sizes.push_back(s.size(d));
  at::Tensor out = at::empty(sizes, s.options());
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) rows *= s.size(d);
  for (int64_t d = dim + 1; d < s.dim(); ++d) inner *= s.size(d);
  const int64_t picks = idx.numel(), extent = s.size(dim);
"""

INDEX_CPU = r"""
// src's slices along dim picked by an int64 index of any shape (index_select, embedding, x[index]):
// out = src.sizes[:dim] + index.sizes + src.sizes[dim+1:]. An index out of range is an error, as in torch.
static at::Tensor stitch_index(const at::Tensor& src, int64_t dim, const at::Tensor& index) {
__INDEX_PRELUDE__  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t j = 0; j < picks; ++j)
    TORCH_CHECK(ix[j] >= -extent && ix[j] < extent, "index ", ix[j], " is out of range for size ", extent);
  const float* in = s.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, rows * picks, 16, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t r = o / picks, j = o - r * picks;
      const int64_t at_ = ix[j] < 0 ? ix[j] + extent : ix[j];
      std::copy(in + (r * extent + at_) * inner, in + (r * extent + at_ + 1) * inner, dst + o * inner);
    }
  });
  return out;
}
""".replace("__INDEX_PRELUDE__", _INDEX_PRELUDE)

INDEX_CUDA = r"""
// out[r, j, c] = src[r, index[j], c]. An index out of range writes NaN (a kernel cannot raise): the
// Verifier's comparison then fails the program rather than reading outside the tensor.
__global__ void __launch_bounds__(256) stitch_index_kernel(const float* __restrict__ src,
    const int64_t* __restrict__ index, float* __restrict__ dst, int64_t picks, int64_t extent,
    int64_t inner, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = o % inner, rj = o / inner;
    const int64_t r = rj / picks, j = rj - r * picks;
    int64_t at_ = index[j];
    if (at_ < 0) at_ += extent;
    dst[o] = (at_ >= 0 && at_ < extent) ? src[(r * extent + at_) * inner + c] : __int_as_float(0x7fc00000);
  }
}

static void stitch_index_launch(const float* src, const int64_t* index, float* dst, int64_t rows,
    int64_t picks, int64_t extent, int64_t inner) {
  const int64_t total = rows * picks * inner;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_index_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(src, index, dst, picks, extent, inner,
                                                                    total);
  STITCH_LAUNCH_CHECK();
}
"""

INDEX_CUDA_HOST = r"""
// src's slices along dim picked by an int64 index of any shape (index_select, embedding, x[index]).
static at::Tensor stitch_index(const at::Tensor& src, int64_t dim, const at::Tensor& index) {
__INDEX_PRELUDE__  TORCH_CHECK(idx.device() == s.device(), "index: the index is on another device");
  stitch_index_launch(s.data_ptr<float>(), idx.data_ptr<int64_t>(), out.data_ptr<float>(), rows, picks,
                      extent, inner);
  return out;
}
""".replace("__INDEX_PRELUDE__", _INDEX_PRELUDE)


# ---- torch.roll: every element moved along some dims, cyclically (shifted windows) -------------------------
# The host packs sizes, shifts and rank in 17 int64 (meta); the kernels' file unpacks them into its struct.
_ROLL_PRELUDE = r"""  TORCH_CHECK(shifts.size() == dims.size(), "roll: as many shifts as dims");
  const at::Tensor s = stitch_dense(src);
  const int64_t rank = s.dim();
  TORCH_CHECK(rank <= 8, "roll: at most 8 dims");
  int64_t meta[17] = {0};
  for (int64_t d = 0; d < rank; ++d) meta[d] = s.size(d);
  meta[16] = rank;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + rank : dims[i];
    TORCH_CHECK(d >= 0 && d < rank, "roll: dim out of range");
    const int64_t n = meta[d];
    meta[8 + d] = n ? ((meta[8 + d] + shifts[i]) % n + n) % n : 0;
  }
  at::Tensor out = at::empty(s.sizes(), s.options());
"""

_ROLL_INDEX = r"""
struct StitchRoll {
  int64_t size[8];
  int64_t shift[8];
  int64_t rank;
};

static StitchRoll stitch_roll_unpack(const int64_t* meta) {
  StitchRoll r{};
  for (int d = 0; d < 8; ++d) {
    r.size[d] = meta[d];
    r.shift[d] = meta[8 + d];
  }
  r.rank = meta[16];
  return r;
}

// The source offset of output element o: each coordinate moved back by its dim's shift, cyclically.
STITCH_HD inline int64_t stitch_roll_source(const StitchRoll& r, int64_t o) {
  int64_t src = 0, stride = 1;
  for (int64_t d = r.rank - 1; d >= 0; --d) {
    const int64_t n = r.size[d];
    const int64_t i = o % n;
    o /= n;
    int64_t j = i - r.shift[d];
    if (j < 0) j += n;
    src += j * stride;
    stride *= n;
  }
  return src;
}
"""

ROLL_CPU = (
    "#define STITCH_HD\n"
    + _ROLL_INDEX
    + r"""
static at::Tensor stitch_roll(const at::Tensor& src, std::vector<int64_t> shifts, std::vector<int64_t> dims) {
__ROLL_PRELUDE__  const StitchRoll r = stitch_roll_unpack(meta);
  const float* in = s.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, s.numel(), 2048, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) dst[o] = in[stitch_roll_source(r, o)];
  });
  return out;
}
""".replace("__ROLL_PRELUDE__", _ROLL_PRELUDE)
)

ROLL_CUDA = (
    "#define STITCH_HD __host__ __device__\n"
    + _ROLL_INDEX
    + r"""
__global__ void __launch_bounds__(256) stitch_roll_kernel(const float* __restrict__ src,
    float* __restrict__ dst, StitchRoll r, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[o] = src[stitch_roll_source(r, o)];
}

static void stitch_roll_launch(const float* src, float* dst, const int64_t* meta, int64_t total) {
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, static_cast<int64_t>(sm_count()) * 8);
  stitch_roll_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(src, dst, stitch_roll_unpack(meta), total);
  STITCH_LAUNCH_CHECK();
}
"""
)

ROLL_CUDA_HOST = r"""
// torch.roll of a float32 tensor along some dims: one kernel, each output element read from its source.
static at::Tensor stitch_roll(const at::Tensor& src, std::vector<int64_t> shifts, std::vector<int64_t> dims) {
__ROLL_PRELUDE__  stitch_roll_launch(s.data_ptr<float>(), out.data_ptr<float>(), meta, s.numel());
  return out;
}
""".replace("__ROLL_PRELUDE__", _ROLL_PRELUDE)


def helper_source(helpers: set[str], backend: str) -> str:
    """The helper functions a program's host code calls, in dependency order (one translation unit: CPU)."""
    return "\n".join([device_source(helpers, backend), host_source(helpers, backend)]).strip("\n")


# Both tensor-core kernels' (GEMM, convolution) split of float32 operands and the device query.
TENSOR_CORES = r"""
// The own GEMM and convolution kernels store each output element through an epilogue `epi(v, i)`: v the
// element (bias included), i its flat index in the output. StitchNoEpi stores v; a program's pointwise kernel
// over the output (activation, scaling, clamp, residual) becomes an epilogue functor of its own, so the
// output is written once, already transformed, and never read back.
struct StitchNoEpi {
  template <typename I>
  __device__ __forceinline__ float operator()(float v, I) const { return v; }
};

// 3xTF32: each operand element is split into a TF32 high part and the TF32 rounding of its residual, and a
// product is hi*hi + hi*lo + lo*hi (lo*lo is below float32's precision), accumulated in float: float32-class
// accuracy at tensor-core rates. A fragment's elements are touched only elementwise (their order within the
// warp is unspecified). Inf and NaN keep the high part alone.
template <typename Frag>
__device__ __forceinline__ void tf32_split(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float v = hi.x[i];
    const float h = nvcuda::wmma::__float_to_tf32(v);
    hi.x[i] = h;
    lo.x[i] = fabsf(v) <= 3.402823466e38f ? nvcuda::wmma::__float_to_tf32(v - h) : 0.f;
  }
}

// One K step of 8 on tensor cores: a warp's FM x FN accumulators (16 x 16 fragments) += its 16 FM rows of A
// (column-major in shared memory, leading dimension lda) times its 16 FN columns of B (row-major, ldb), each
// product as hi*lo + lo*hi + hi*hi.
template <int FM, int FN, typename Acc>
__device__ __forceinline__ void tf32x3_step(Acc (&acc)[FM][FN], const float* a, int lda, const float* b,
                                            int ldb) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_hi[FN], b_lo[FN];
#pragma unroll
  for (int j = 0; j < FN; ++j) {
    wmma::load_matrix_sync(b_hi[j], b + 16 * j, ldb);
    tf32_split(b_hi[j], b_lo[j]);
  }
#pragma unroll
  for (int i = 0; i < FM; ++i) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> a_hi, a_lo;
    wmma::load_matrix_sync(a_hi, a + 16 * i, lda);
    tf32_split(a_hi, a_lo);
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::mma_sync(acc[i][j], a_lo, b_hi[j], acc[i][j]);
      wmma::mma_sync(acc[i][j], a_hi, b_lo[j], acc[i][j]);
      wmma::mma_sync(acc[i][j], a_hi, b_hi[j], acc[i][j]);
    }
  }
}

// Whether this device runs the tensor-core kernels (compute capability 8.0 or later): CUTLASS's GEMMs
// wherever it does, the own kernels unless the variant is mma=simt.
inline bool stitch_tensor_core_device() {
  int device = 0, major = 0;
  STITCH_CUDA_CHECK(cudaGetDevice(&device));
  STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

inline bool stitch_tensor_cores() {
#ifdef STITCH_SIMT_ONLY
  return false;
#else
  return stitch_tensor_core_device();
#endif
}
"""


def device_source(helpers: set[str], backend: str) -> str:
    """The helpers' kernels and raw-pointer launchers: on CUDA, the torch-free translation unit's part."""
    parts: list[str] = [DENSE_CUDA] if backend == "cuda" else []
    if ("custom" in helpers or "conv" in helpers) and backend == "cuda":
        parts.append(TENSOR_CORES)
    if "custom" in helpers and backend == "cuda":
        plain = CUDA_GEMM_CUTLASS if "cutlass" in helpers else CUDA_GEMM_PLAIN
        parts.append(CUDA_KERNELS + (plain if "gemm_plain" in helpers else ""))
    elif "custom" in helpers:
        parts.append(CPU_KERNELS)
    if "conv" in helpers:
        parts.append(
            convolution.device_source(backend, plain="conv_plain" in helpers, sm90="conv_sm90" in helpers)
        )
    if "causal" in helpers and backend == "cuda":
        parts.append(CAUSAL_CUDA)
    if "cat" in helpers and backend == "cuda":
        parts.append(CAT_CUDA)
    if "index" in helpers and backend == "cuda":
        parts.append(INDEX_CUDA)
    if "roll" in helpers and backend == "cuda":
        parts.append(ROLL_CUDA)
    parts.append(scans.device_source(helpers, backend))
    return "\n".join(p for p in parts if p)


def host_source(helpers: set[str], backend: str) -> str:
    """The helpers that take tensors (library calls, the custom kernels' wrappers): the host part."""
    parts: list[str] = [DENSE_CUDA_HOST if backend == "cuda" else DENSE_CPU]
    if "custom" in helpers:
        plain = "gemm_plain" in helpers or backend != "cuda"
        parts.append(CUSTOM_WRAPPERS + (GEMM_PLAIN_WRAPPERS if plain else ""))
    elif "linear" in helpers:
        parts.append(LIBRARY_HELPERS["linear"])
    if "conv" in helpers:
        parts.append(convolution.host_source(backend, plain="conv_plain" in helpers))
    if "einsum" in helpers:
        parts.append(einsum.HOST)
    if "causal" in helpers:
        parts.append(CAUSAL_CUDA_HOST if backend == "cuda" else CAUSAL_CPU)
    if "cat" in helpers:
        parts.append(CAT_CUDA_HOST if backend == "cuda" else CAT_CPU)
    if "cat_into" in helpers and backend == "cuda":
        parts.append(CAT_INTO_CUDA_HOST)
    if "index" in helpers:
        parts.append(INDEX_CUDA_HOST if backend == "cuda" else INDEX_CPU)
    if "roll" in helpers:
        parts.append(ROLL_CUDA_HOST if backend == "cuda" else ROLL_CPU)
    parts.append(scans.host_source(helpers, backend))
    return "\n".join(p for p in parts if p)
