"""The program's GEMMs as CUTLASS templates instantiated in its sources (CUDA, variant gemm_kernel=cutlass).

CUTLASS's tensor-op GEMM for compute capability 8.0 and later (it runs on Hopper) with the 3xTF32 product
(`OpMultiplyAddFastF32`: each float split into a TF32 high part and the TF32 rounding of the residual, three
tensor-core products, float accumulation): float32-class accuracy at tensor-core rates, as the synthesizer's
own 3xTF32 kernels (libops.TENSOR_CORES). Under the strict kernel policy a CUTLASS template instantiated in
the candidate's sources is its own kernel (services/verifier/README.md, D6); the Verifier's builder offers
CUTLASS's headers (stitchcuda.shared.cutlass). The bias rides in CUTLASS's epilogue (C read with a leading
dimension of 0: the bias row broadcast over the rows); a pointwise tail stays a kernel of its own. A GEMM
whose output tiles leave SMs idle (a long K over a small output) is split along K (serial split-K).

One translation unit of its own (cutlass_gemm.cu), compiled in parallel with the others; it instantiates only
the operand layouts the program's GEMMs use. At run time a GEMM whose layouts, alignment or sizes CUTLASS
cannot take (`can_implement`) runs on the synthesizer's own kernels instead.

Hopper (variant gemm_kernel=cutlass_sm90): CUTLASS 3's warp-specialized wgmma GEMM (TMA loads, a cluster of
two, the stream-K tile scheduler, which splits a long K over idle SMs) over operands split beforehand: one
pass writes A as [hi | hi | lo] and B as [hi | lo | hi] along K (hi the TF32 rounding of a float, lo the TF32
rounding of its residual), both K-major, so one TF32 GEMM of depth 3K adds exactly the three products of
3xTF32 in float accumulators; the bias rides in two more columns (ones in A, its hi and lo parts in B). The
split pass also lays out operands of any strides (transposed, broadcast over the batch) as the wgmma TF32
instruction wants them (K-major both), so one instantiation serves every layout. wgmma needs the sm_90a
target: the program is built for it too (EXTRA_CUDA_CFLAGS), and a probe kernel tells at run time whether the
device runs that code (compute capability 9.0); elsewhere the own kernels run.
"""

from __future__ import annotations

from stitchcuda.coder.synth.ir import LIB, Graph, Op, Ref, Value

FILE = "cutlass_gemm.cu"
# Operand layouts: A [M, K] and B [K, N], row-major (unit stride along K for A, N for B) or column-major.
ROW, COL = "row", "col"
_LAYOUT = {ROW: "cutlass::layout::RowMajor", COL: "cutlass::layout::ColumnMajor"}
# The GEMM-backed library ops of a custom program (codegen.Host.lib_expr, libops' stitch_* wrappers).
GEMM_FNS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "einsum"})

# The host-side entry point kernels.cu calls before its own kernels (declared there, defined here).
_PARAMS = "const float* A, const float* B, const float* bias, float* C, const int64_t* dims"
# Hidden: linked between the program's units, never exported from its .so, so two programs loaded in one
# process (a benchmark, a test session) never bind each other's entry point or CUTLASS instantiations.
_HIDDEN = '__attribute__((visibility("hidden")))'
DECLARATION = f"{_HIDDEN} bool stitch_cutlass_gemm({_PARAMS});"
# The gemm_kernel variant values built on this unit, and the extra nvcc flags of the Hopper one: its wgmma
# code for sm_90a (beside the Verifier's arch list), both targets compiled in parallel.
KERNELS = frozenset({"cutlass", "cutlass_sm90"})
SM90_CUDA_CFLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "--threads=2")

# The SM80 GEMM (instantiated per layout by the dispatch) and the SM count both GEMMs ask for.
_SM80_GEMM = r"""
// 128x128 block tiles of 16 along K, 64x64 warp tiles, m16n8k8 TF32 instructions, four pipeline stages
// (cp.async), operands 16-byte aligned (4 floats); C row-major [batch, M, N].
template <typename LayoutA, typename LayoutB>
using StitchCutlassGemm = cutlass::gemm::device::GemmUniversal<
    float, LayoutA, float, LayoutB, float, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp,
    cutlass::arch::Sm80, cutlass::gemm::GemmShape<128, 128, 16>, cutlass::gemm::GemmShape<64, 64, 16>,
    cutlass::gemm::GemmShape<16, 8, 8>, cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 4, 4, 4,
    cutlass::arch::OpMultiplyAddFastF32>;
"""

_SMS = r"""
int64_t stitch_cutlass_sms() {
  int device = 0, sms = 0;
  STITCH_CUDA_CHECK(cudaGetDevice(&device));
  STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}
"""

_SM80_RUN = r"""
// C[b] = A[b] @ B[b] (+ bias broadcast over the rows). false: CUTLASS cannot take this GEMM (alignment,
// sizes), nothing launched.
template <typename LayoutA, typename LayoutB>
bool stitch_cutlass_run(const float* A, int64_t lda, const float* B, int64_t ldb, const float* bias, float* C,
                        const int64_t* dims) {
  using Gemm = StitchCutlassGemm<LayoutA, LayoutB>;
  const int64_t batch = dims[0], M = dims[1], N = dims[2], K = dims[3];
  const int64_t limit = int64_t{1} << 30;
  if (K == 0 || M >= limit || N >= limit || K >= limit || batch >= limit) return false;
  // CUTLASS loads and stores 4 floats at a time and checks only the sizes (can_implement): leading
  // dimensions, batch strides and pointers must keep every vector 16-byte aligned.
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (lda % 4 != 0 || ldb % 4 != 0 || (batch > 1 && (dims[4] % 4 != 0 || dims[7] % 4 != 0)) || !aligned(A) ||
      !aligned(B) || !aligned(C) || (bias != nullptr && !aligned(bias)))
    return false;
  // Serial split-K where one GEMM's tiles leave SMs idle (a long K over a small output): up to two blocks
  // an SM, each slice at least 512 deep; the slices add into C in order (CUTLASS's semaphores).
  int slices = 1;
  if (batch == 1) {
    const int64_t tiles = ((M + 127) / 128) * ((N + 127) / 128), sms = stitch_cutlass_sms();
    if (tiles < sms)
      slices = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({(2 * sms) / tiles, K / 512, 64})));
  }
  typename Gemm::Arguments args(
      batch > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
      cutlass::gemm::GemmCoord(static_cast<int>(M), static_cast<int>(N), static_cast<int>(K)),
      static_cast<int>(batch > 1 ? batch : slices), {1.f, bias != nullptr ? 1.f : 0.f}, A, B,
      bias != nullptr ? bias : C, C, dims[4], dims[7], bias != nullptr ? 0 : M * N, M * N, lda, ldb,
      bias != nullptr ? 0 : N, N);
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  cudaStream_t stream = stitch::current_stream();
  const size_t bytes = Gemm::get_workspace_size(args);
  stitch::Scratch workspace(bytes > 0 ? bytes : 1, stream);
  if (bytes > 0) STITCH_CUDA_CHECK(cudaMemsetAsync(workspace.ptr, 0, bytes, stream));
  STITCH_CHECK(gemm.initialize(args, workspace.ptr, stream) == cutlass::Status::kSuccess,
               "CUTLASS GEMM: initialize failed");
  STITCH_CHECK(gemm.run(stream) == cutlass::Status::kSuccess, "CUTLASS GEMM: launch failed");
  STITCH_LAUNCH_CHECK();
  return true;
}
"""

_SM90_TYPES = r"""
// ---- Hopper: CUTLASS 3 wgmma TF32 GEMM over operands split into TF32 pairs (3xTF32 along K) ----
using StitchSm90Tile = cute::Shape<cute::_128, cute::_128, cute::_32>;
using StitchSm90Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
using StitchSm90Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, StitchSm90Tile, StitchSm90Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 4, float,
    cutlass::layout::RowMajor, 4, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
using StitchSm90Builder = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, float, cutlass::layout::RowMajor, 4, float,
    cutlass::layout::ColumnMajor, 4, float, StitchSm90Tile, StitchSm90Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename StitchSm90Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
// wgmma adds into its accumulators with truncation: over a long K the error grows with the depth (measured
// on an H100: 1.4e-5 relative L2 over K = 65536, past the Verifier's 1e-5). The builder's mainloop with the
// promoting accumulation of CUTLASS's FP8 mainloop instead: each k-tile's products are summed by wgmma in
// fresh registers, then added to the float accumulators with rounding (mma_promotion_interval).
template <typename Mainloop>
struct StitchPromoted;
template <int Stages, typename Cluster, typename Schedule, typename... Rest>
struct StitchPromoted<cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<Stages, Cluster, Schedule>, Rest...>> {
  using type = cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<Stages, Cluster, Schedule>, Rest...>;
};
using StitchSm90Mainloop = typename StitchPromoted<StitchSm90Builder>::type;
using StitchSm90Kernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, StitchSm90Mainloop, StitchSm90Epilogue, cutlass::gemm::StreamKScheduler>;
using StitchSm90Gemm = cutlass::gemm::device::GemmUniversalAdapter<StitchSm90Kernel>;

"""

# What both Hopper units use (the GEMM's here, the convolution's, cutlass_conv.py): the sm_90a probe, the TF32
# split of a float and the pass that lays an operand out split, K-major.
SM90_COMMON = r"""
// Writes 1 where the device runs this unit's sm_90a code (wgmma), nothing elsewhere.
__global__ void stitch_sm90a_probe(int* flag) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *flag = 1;
#else
  (void)flag;
#endif
}

// Whether the current device runs the sm_90a code: asked once per device (a one-thread kernel), never while
// the stream is being captured into a graph (then not yet known counts as no).
bool stitch_sm90_ready(cudaStream_t stream) {
  static std::atomic<int> state[64];  // 0 not asked, 1 yes, 2 no
  int device = 0;
  STITCH_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return false;
  int known = state[device].load();
  if (known == 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    STITCH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return false;
    int major = 0, minor = 0;
    STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    int ran = 0;
    if (major == 9 && minor == 0) {
      stitch::Scratch flag(sizeof(int), stream);
      STITCH_CUDA_CHECK(cudaMemsetAsync(flag.ptr, 0, sizeof(int), stream));
      stitch_sm90a_probe<<<1, 1, 0, stream>>>(static_cast<int*>(flag.ptr));
      STITCH_LAUNCH_CHECK();
      STITCH_CUDA_CHECK(cudaMemcpyAsync(&ran, flag.ptr, sizeof(int), cudaMemcpyDeviceToHost, stream));
      STITCH_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    known = ran == 1 ? 1 : 2;
    state[device].store(known);
  }
  return known == 1;
}

// TF32 rounding of a float (to nearest, ties away; 10 mantissa bits): exact in a TF32 operand.
__device__ __forceinline__ float stitch_tf32_round(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN as they are
  return __uint_as_float((u + 0x1000u) & 0xffffe000u);
}

// A float as a TF32 pair: hi its TF32 rounding, lo the TF32 rounding of the residual (0 where hi is not
// finite: Inf and NaN, or a float that rounds past the largest).
__device__ __forceinline__ void stitch_tf32_pair(float v, float& hi, float& lo) {
  hi = stitch_tf32_round(v);
  lo = isfinite(hi) ? stitch_tf32_round(v - hi) : 0.f;
}

// One operand, rows R (M of A, N of B) by depth K read at src[b * sb + r * sr + k * sk], written K-major as
// out[b][r][0..Kp): A as [hi | hi | lo], B as [hi | lo | hi] (b_side), then the bias columns (A: two ones;
// B: the bias's hi and lo parts) and zeros to Kp. 32x32 tiles through shared memory, loaded along whichever
// of r and k has the unit stride and stored along k.
__global__ void __launch_bounds__(256)
    stitch_tf32x3_split(const float* __restrict__ src, int64_t sb, int64_t sr, int64_t sk, int64_t R,
                        int64_t K, int64_t Kp, int64_t tiles_k, bool b_side, const float* bias,
                        bool with_bias, float* __restrict__ out) {
  __shared__ float tile[32][33];
  const int64_t tile_id = blockIdx.x, b = blockIdx.y;
  const int64_t r0 = (tile_id / tiles_k) * 32, k0 = (tile_id % tiles_k) * 32;
  const float* in = src + b * sb;
  const bool along_r = sr == 1 && sk != 1;
  for (int i = threadIdx.x; i < 1024; i += 256) {
    const int fast = i % 32, slow = i / 32, rr = along_r ? fast : slow, kk = along_r ? slow : fast;
    const int64_t r = r0 + rr, k = k0 + kk;
    tile[rr][kk] = r < R && k < K ? in[r * sr + k * sk] : 0.f;
  }
  __syncthreads();
  float* dst = out + b * R * Kp;
  for (int i = threadIdx.x; i < 1024; i += 256) {
    const int kk = i % 32, rr = i / 32;
    const int64_t r = r0 + rr, k = k0 + kk;
    if (r >= R || k >= K) continue;
    float hi, lo;
    stitch_tf32_pair(tile[rr][kk], hi, lo);
    float* row = dst + r * Kp;
    row[k] = hi;
    row[K + k] = b_side ? lo : hi;
    row[2 * K + k] = b_side ? hi : lo;
  }
  if (k0 != 0) return;
  for (int64_t i = threadIdx.x; i < 32 * (Kp - 3 * K); i += 256) {
    const int64_t rr = i / (Kp - 3 * K), c = i % (Kp - 3 * K), r = r0 + rr;
    if (r >= R) continue;
    float v = 0.f;
    if (with_bias && c < 2) {
      if (!b_side) {
        v = 1.f;
      } else {
        float hi, lo;
        stitch_tf32_pair(bias[r], hi, lo);
        v = c == 0 ? hi : lo;
      }
    }
    dst[r * Kp + 3 * K + c] = v;
  }
}

// Splits `rows` rows of one operand (`batches` batches) into out, K-major, Kp deep.
void stitch_sm90_split(const float* src, int64_t sb, int64_t sr, int64_t sk, int64_t rows, int64_t K,
                       int64_t Kp, int64_t batches, bool b_side, const float* bias, bool with_bias,
                       float* out, cudaStream_t stream) {
  const int64_t tiles_k = (K + 31) / 32, tiles = ((rows + 31) / 32) * tiles_k;
  STITCH_CHECK(tiles < (int64_t{1} << 31), "CUTLASS: operands too large to split");
  stitch_tf32x3_split<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(batches)), 256, 0, stream>>>(
      src, sb, sr, sk, rows, K, Kp, tiles_k, b_side, bias, with_bias, out);
  STITCH_LAUNCH_CHECK();
}

"""

_SM90_GEMM = r"""
// One split operand at a time stays within this many bytes: a larger GEMM runs panel by panel (rows of A,
// columns of B), so its scratch memory is bounded whatever the operands' sizes (a 32768^2 weight would take
// 12 GiB at once).
constexpr size_t kStitchSplitBytes = size_t{1} << 30;

// D (rows ldd apart, batches stride_batch_d apart) = A3 @ B3^T over Kp: the GEMM of split operands. false:
// CUTLASS cannot take these sizes (nothing launched).
bool stitch_sm90_run(const float* a3, int64_t batch_a, const float* b3, int64_t batch_b, float* D, int64_t M,
                     int64_t N, int64_t Kp, int64_t ldd, int64_t stride_batch_d, int64_t batch,
                     const cutlass::KernelHardwareInfo& hw, cudaStream_t stream) {
  using Kernel = StitchSm90Gemm::GemmKernel;
  const typename Kernel::StrideA stride_a = cute::make_stride(Kp, cute::Int<1>{}, batch_a);
  const typename Kernel::StrideB stride_b = cute::make_stride(Kp, cute::Int<1>{}, batch_b);
  const typename Kernel::StrideD stride_d = cute::make_stride(ldd, cute::Int<1>{}, stride_batch_d);
  typename StitchSm90Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(M), static_cast<int>(N), static_cast<int>(Kp), static_cast<int>(batch)},
      {a3, stride_a, b3, stride_b},
      {{1.f, 0.f}, nullptr, typename Kernel::StrideC{}, D, stride_d},
      hw};
  StitchSm90Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  const size_t bytes = StitchSm90Gemm::get_workspace_size(args);
  stitch::Scratch workspace(bytes > 0 ? bytes : 1, stream);
  STITCH_CHECK(gemm.initialize(args, workspace.ptr, stream) == cutlass::Status::kSuccess,
               "CUTLASS SM90 GEMM: initialize failed");
  STITCH_CHECK(gemm.run(stream) == cutlass::Status::kSuccess, "CUTLASS SM90 GEMM: launch failed");
  STITCH_LAUNCH_CHECK();
  return true;
}

// dst (rows of n floats) = src (rows ldsrc apart): a GEMM's result out of its padded scratch.
__global__ void __launch_bounds__(256)
    stitch_sm90_unpad(const float* __restrict__ src, int64_t ldsrc, float* __restrict__ dst, int64_t rows,
                      int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * 256LL + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * 256) {
    const int64_t r = i / n, c = i - r * n;
    dst[i] = src[r * ldsrc + c];
  }
}

// The GEMM of operands whose split passes kStitchSplitBytes: one batch at a time, up to that many bytes of
// rows of A, then of columns of B (whole tiles). D's rows ldd apart, batches M * ldd apart.
bool stitch_sm90_panels(const float* A, const float* B, const float* bias, float* D, int64_t ldd,
                        const int64_t* dims, int64_t Kp, const cutlass::KernelHardwareInfo& hw,
                        cudaStream_t stream) {
  const int64_t batch = dims[0], M = dims[1], N = dims[2], K = dims[3], sAb = dims[4], sAm = dims[5],
                sAk = dims[6], sBb = dims[7], sBk = dims[8], sBn = dims[9];
  const bool with_bias = bias != nullptr;
  const size_t row_bytes = static_cast<size_t>(Kp) * sizeof(float);
  const int64_t fit = static_cast<int64_t>(kStitchSplitBytes / row_bytes) / 128 * 128;
  const int64_t panel = std::max<int64_t>(128, fit);
  const int64_t panel_m = std::min(M, panel), panel_n = std::min(N, panel);
  stitch::Scratch a3(static_cast<size_t>(panel_m) * row_bytes, stream);
  stitch::Scratch b3(static_cast<size_t>((panel_n + 3) / 4 * 4) * row_bytes, stream);
  float* a = static_cast<float*>(a3.ptr);
  float* b = static_cast<float*>(b3.ptr);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t m0 = 0; m0 < M; m0 += panel_m) {
      const int64_t rows = std::min(panel_m, M - m0);
      stitch_sm90_split(A + i * sAb + m0 * sAm, 0, sAm, sAk, rows, K, Kp, 1, false, nullptr, with_bias, a,
                        stream);
      for (int64_t n0 = 0; n0 < N; n0 += panel_n) {
        const int64_t cols = std::min(panel_n, N - n0);
        // B's only panel of this batch is split once, for its first row panel.
        if (m0 == 0 || panel_n < N)
          stitch_sm90_split(B + i * sBb + n0 * sBn, 0, sBn, sBk, cols, K, Kp, 1, true,
                            with_bias ? bias + n0 : nullptr, with_bias, b, stream);
        // Past N (a padded D), whole rows of 16 bytes: the extra columns land in D's padding.
        const int64_t extent = std::min((cols + 3) / 4 * 4, ldd - n0);
        float* d = D + i * M * ldd + m0 * ldd + n0;
        if (!stitch_sm90_run(a, 0, b, 0, d, rows, extent, Kp, ldd, rows * ldd, 1, hw, stream)) return false;
      }
    }
  }
  return true;
}

// C[b] = A[b] @ B[b] (+ bias) on Hopper's tensor cores, float32-class accurate. false: not this device or
// not this GEMM (sizes past int, or CUTLASS cannot take them), C not written. TMA stores rows 16 bytes
// apart: where C's rows are not (N not a multiple of 4, or C not 16-byte aligned) the GEMM writes a padded
// scratch copied into C after.
bool stitch_cutlass_sm90(const float* A, const float* B, const float* bias, float* C, const int64_t* dims) {
  const int64_t batch = dims[0], M = dims[1], N = dims[2], K = dims[3], sAb = dims[4], sAm = dims[5],
                sAk = dims[6], sBb = dims[7], sBk = dims[8], sBn = dims[9];
  const int64_t Kp = (3 * K + (bias != nullptr ? 2 : 0) + 3) / 4 * 4, limit = int64_t{1} << 31;
  if (K == 0 || M >= limit || N >= limit || Kp >= limit) return false;
  cudaStream_t stream = stitch::current_stream();
  if (!stitch_sm90_ready(stream)) return false;
  // The GEMM's N extent: N, or ldc where padded (the extra columns, products of whatever B3 holds past its
  // rows, are computed and never copied out; B3 is allocated that far).
  const bool padded = N % 4 != 0 || reinterpret_cast<uintptr_t>(C) % 16 != 0;
  const int64_t ldc = padded ? (N + 3) / 4 * 4 : N;
  stitch::Scratch staged(padded ? static_cast<size_t>(batch * M * ldc) * sizeof(float) : 1, stream);
  float* D = padded ? static_cast<float*>(staged.ptr) : C;
  cutlass::KernelHardwareInfo hw;
  STITCH_CUDA_CHECK(cudaGetDevice(&hw.device_id));
  hw.sm_count = static_cast<int>(stitch_cutlass_sms());
  const bool with_bias = bias != nullptr;
  const size_t row_bytes = static_cast<size_t>(Kp) * sizeof(float);
  // An operand shared by every batch (batch stride 0) is split once.
  const int64_t batches_a = batch > 1 && sAb != 0 ? batch : 1, batches_b = batch > 1 && sBb != 0 ? batch : 1;
  if (static_cast<size_t>(batches_a * M) * row_bytes <= kStitchSplitBytes &&
      static_cast<size_t>(batches_b * N) * row_bytes <= kStitchSplitBytes) {
    stitch::Scratch a3(static_cast<size_t>(batches_a * M) * row_bytes, stream);
    stitch::Scratch b3(static_cast<size_t>(batches_b * N + ldc - N) * row_bytes, stream);
    float* a = static_cast<float*>(a3.ptr);
    float* b = static_cast<float*>(b3.ptr);
    stitch_sm90_split(A, sAb, sAm, sAk, M, K, Kp, batches_a, false, nullptr, with_bias, a, stream);
    stitch_sm90_split(B, sBb, sBn, sBk, N, K, Kp, batches_b, true, bias, with_bias, b, stream);
    if (!stitch_sm90_run(a, batches_a > 1 ? M * Kp : 0, b, batches_b > 1 ? N * Kp : 0, D, M, ldc, Kp, ldc,
                         M * ldc, batch, hw, stream))
      return false;
  } else if (!stitch_sm90_panels(A, B, bias, D, ldc, dims, Kp, hw, stream)) {
    return false;
  }
  if (padded) {
    const int64_t blocks = std::min<int64_t>((batch * M * N + 255) / 256, int64_t{1} << 20);
    stitch_sm90_unpad<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), 256, 0, stream>>>(D, ldc, C,
                                                                                               batch * M, N);
    STITCH_LAUNCH_CHECK();
  }
  return true;
}

"""

_ENTRY = r"""
// dims: batch, M, N, K, then the strides sAb, sAm, sAk, sBb, sBk, sBn (stitch_gemm_launch's).
__HIDDEN__ bool stitch_cutlass_gemm(__PARAMS__) {
__BODY__
}
"""
# The SM80 entry's body: the instantiated layout the operands' strides match.
_SM80_DISPATCH = """\
  // A layout is row-major where its unit stride is along K (A) or N (B), column-major where it is along M
  // (A) or K (B).
  const int64_t sAm = dims[5], sAk = dims[6], sBk = dims[8], sBn = dims[9];
  const bool a_row = sAk == 1, a_col = !a_row && sAm == 1, b_row = sBn == 1, b_col = !b_row && sBk == 1;
  (void)a_col;
  (void)b_col;
__DISPATCH__
  return false;"""


def _layout(value: Value) -> str | None:
    """A GEMM operand's layout from its traced strides: unit stride along its last dim (row-major), along
    the one before (column-major), or neither (None). A vector is one row."""
    if len(value.stride) < 2 or value.stride[-1] == 1 or value.shape[-1] == 1:
        return ROW
    return COL if value.stride[-2] == 1 or value.shape[-2] == 1 else None


def has_gemm(ops: list[Op]) -> bool:
    """Whether any of the program's ops is a GEMM-backed library op."""
    return any(op.kind == LIB and op.fn in GEMM_FNS for op in ops)


def layouts_of(graph: Graph, ops: list[Op]) -> set[tuple[str, str]]:
    """The (A, B) layouts to instantiate for the program's GEMM ops, from their operands' traced strides:
    nn.Linear multiplies by the weight's transpose (B column-major); matmul, mm, bmm and addmm take their
    operands as laid out (a transposed view is column-major); einsum contractions are row-major (the
    program arranges their operands). A GEMM of another layout runs on the own kernels."""
    found: set[tuple[str, str]] = set()
    for op in ops:
        if op.kind != LIB or op.fn not in GEMM_FNS:
            continue
        if op.fn == "linear":
            found.add((ROW, COL))
            continue
        operands = [a for a in op.args if isinstance(a, Ref)][-2:] if op.fn != "einsum" else []
        if len(operands) != 2:
            found.add((ROW, ROW))
            continue
        a, b = (_layout(graph.values[x.id]) for x in operands)
        if a is not None and b is not None:
            found.add((a, b))
    return found


def source(layouts: set[tuple[str, str]], bridge: str, header: str, *, sm90: bool = False) -> str:
    """cutlass_gemm.cu for these layouts; `bridge` declares the stream, scratch memory and checks forward.cpp
    defines (cuda.BRIDGE), `header` is the program's shared header. sm90: the Hopper GEMM instead, which
    takes every layout (the layouts are not instantiated)."""
    dispatch = [
        f"  if (a_{a} && b_{b})\n"
        f"    return stitch_cutlass_run<{_LAYOUT[a]}, {_LAYOUT[b]}>(A, "
        f"{'sAm' if a == ROW else 'sAk'}, B, {'sBk' if b == ROW else 'sBn'}, bias, C, dims);"
        for a, b in sorted(layouts)
    ]
    body = (
        "  return stitch_cutlass_sm90(A, B, bias, C, dims);"
        if sm90
        else _SM80_DISPATCH.replace("__DISPATCH__", "\n".join(dispatch))
    )
    sm80_headers = [
        "#include <cutlass/epilogue/thread/linear_combination.h>",
        "#include <cutlass/gemm/device/gemm_universal.h>",
    ]
    sm90_headers = [
        "#include <cute/tensor.hpp>",
        "#include <cutlass/epilogue/collective/collective_builder.hpp>",
        "#include <cutlass/gemm/collective/collective_builder.hpp>",
        "#include <cutlass/gemm/device/gemm_universal_adapter.h>",
        "#include <cutlass/gemm/dispatch_policy.hpp>",
        "#include <cutlass/gemm/kernel/gemm_universal.hpp>",
        "#include <cutlass/gemm/kernel/tile_scheduler.hpp>",
    ]
    return "\n".join(
        [
            "// Synthesized by StitchCUDA's built-in coder (CUDA backend): the GEMMs as CUTLASS",
            "// templates instantiated here (3xTF32 tensor-op GEMM); kernels.cu calls stitch_cutlass_gemm.",
            "// No program's name here: programs with alike GEMMs carry the same text, and the",
            "// Verifier's builds share its compiled object.",
            *prelude(header),
            *(sm90_headers if sm90 else sm80_headers),
            bridge,
            "namespace {",
            *([_SMS, _SM90_TYPES, SM90_COMMON, _SM90_GEMM] if sm90 else [_SM80_GEMM + _SMS + _SM80_RUN]),
            "}  // namespace",
            _ENTRY.replace("__PARAMS__", _PARAMS).replace("__HIDDEN__", _HIDDEN).replace("__BODY__", body),
            "#pragma GCC visibility pop",
        ]
    )


def prelude(header: str) -> list[str]:
    """The opening lines of a CUTLASS unit (this one's, cutlass_conv.py's) up to CUTLASS's own headers."""
    return [
        "// CUTLASS's device-side asserts off: a call in a wgmma pipeline serializes it.",
        "#define NDEBUG 1",
        f'#include "{header}"',
        "",
        "#include <cuda_runtime.h>",
        "",
        "#include <algorithm>",
        "#include <atomic>",
        "#include <cstdint>",
        "",
        "// Every CUTLASS symbol this unit instantiates stays inside the program's .so.",
        "#pragma GCC visibility push(hidden)",
        "#include <cutlass/cutlass.h>",
    ]


__all__ = [
    "DECLARATION",
    "FILE",
    "KERNELS",
    "SM90_COMMON",
    "SM90_CUDA_CFLAGS",
    "has_gemm",
    "layouts_of",
    "prelude",
    "source",
]
