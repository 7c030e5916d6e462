"""The program's direct convolutions on Hopper's tensor cores (CUDA, variant conv_kernel=cutlass_sm90).

CUTLASS 3's implicit-GEMM convolution for compute capability 9.0 (TMA im2col loads, warp-specialized wgmma,
instantiated in the program's own sources, so the strict policy counts it as the program's own kernel) over
operands split beforehand into TF32 pairs along the channels, as the Hopper GEMM splits along K
(cutlass_gemm.py): one pass writes the input channels-last as [hi | hi | lo] and the weight as
[hi | lo | hi], so one TF32 convolution over three times the channels adds exactly the three products of
3xTF32 in float accumulators. Channels are padded with zeros to a multiple of four (TMA moves 16 bytes), the
output channels too; the convolution writes its output channels-last into a scratch, and the program's own
kernel (convolution.py, CUDA_TC) lays it out as the program's [N, C, spatial...] while it adds the bias and
applies the epilogue, so a fused epilogue stays one pass over the output.

One instantiation serves every rank (1-3 spatial dims, as a 3-D problem with leading size-1 dims), stride,
padding and dilation that TMA's im2col mode takes (`can_implement`); a convolution it refuses, a grouped or
transposed one, or one too deep for wgmma's truncating accumulation runs on the own kernels. A translation
unit of its own (cutlass_conv.cu: CUTLASS 3's convolution and its 2.x GEMM headers, which the Hopper GEMM's
unit includes, match each other's kernel templates), with the Hopper GEMM's probe and TF32 split
(cutlass_gemm.SM90_COMMON).
"""

from __future__ import annotations

from stitchcuda.coder.synth import cutlass_gemm

FILE = "cutlass_conv.cu"

# The host-side entry point kernels.cu calls (declared there, defined in cutlass_gemm.cu).
_PARAMS = (
    "const float* x, const float* w, float* out, const int64_t* geom, int64_t out_channels_padded, "
    "bool transposed"
)
DECLARATION = f'__attribute__((visibility("hidden"))) bool stitch_cutlass_conv({_PARAMS});'

HEADERS = [
    "#include <cute/tensor.hpp>",
    "#include <cutlass/epilogue/collective/collective_builder.hpp>",
    "#include <cutlass/conv/collective/collective_builder.hpp>",
    "#include <cutlass/conv/convnd_problem_shape.hpp>",
    "#include <cutlass/conv/convolution.h>",
    "#include <cutlass/conv/device/conv_universal_adapter.hpp>",
    "#include <cutlass/conv/dispatch_policy.hpp>",
    "#include <cutlass/conv/kernel/conv_universal.hpp>",
]

# Inside the unit's anonymous namespace, after cutlass_gemm.SM90_COMMON.
SOURCE = r"""
// ---- Hopper: CUTLASS 3 implicit-GEMM convolution over channels split into TF32 pairs ----
using StitchConvTile = cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_32>>;
using StitchConvCluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
using StitchConvEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, StitchConvTile, StitchConvCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::TensorNDHWC, 4,
    float, cutlass::layout::TensorNDHWC, 4, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
using StitchConvMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, float,
    cutlass::layout::TensorNDHWC, 4, float, cutlass::layout::TensorNDHWC, 4, float, StitchConvTile,
    StitchConvCluster,
    cutlass::conv::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename StitchConvEpilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
using StitchConvProblem = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 3>;
using StitchConvKernel =
    cutlass::conv::kernel::ConvUniversal<StitchConvProblem, StitchConvMainloop, StitchConvEpilogue>;
using StitchConv = cutlass::conv::device::ConvUniversalAdapter<StitchConvKernel>;

// wgmma truncates as it accumulates: past this depth (channels x 3 x taps) the error of a sum could pass the
// Verifier's tolerance (the GEMM measured 1.4e-5 relative L2 at 65536), and the own kernels run instead.
constexpr int64_t kStitchConvMaxDepth = 24576;

// The operands of one convolution split into TF32 pairs by the GEMM's split pass (cutlass_gemm.SM90_COMMON),
// channels the depth: the input [N, C, S] (S the positions) as N batches of S rows, [N, S, Cp] with
// hi | hi | lo of each position's channels; the weight [CO, C, T] (T the taps) as CO batches of T rows,
// [COp, T, Cp] with hi | lo | hi; zeros past 3C, output channels past CO all zeros. transposed: the weight of
// a transposed convolution, [C, CO, T], its taps reversed (the direct convolution it equals at stride 1).
void stitch_conv_split(const float* x, const float* w, int64_t N, int64_t C, int64_t S, int64_t CO,
                       int64_t COp, int64_t T, int64_t Cp, bool transposed, float* xs, float* ws,
                       cudaStream_t stream) {
  stitch_sm90_split(x, C * S, 1, S, S, C, Cp, N, false, nullptr, false, xs, stream);
  if (transposed)
    stitch_sm90_split(w + (T - 1), T, -1, CO * T, T, C, Cp, CO, true, nullptr, false, ws, stream);
  else
    stitch_sm90_split(w, C * T, 1, T, T, C, Cp, CO, true, nullptr, false, ws, stream);
  const size_t padding = static_cast<size_t>((COp - CO) * T * Cp) * sizeof(float);
  if (padding > 0) STITCH_CUDA_CHECK(cudaMemsetAsync(ws + CO * T * Cp, 0, padding, stream));
}
"""

# After the anonymous namespace: the entry point.
ENTRY = r"""
// The direct convolution of geom (convolution.py's ConvGeom fields) of x [N, C, D, H, W] by w [CO, C, taps],
// into out [N, OD, OH, OW, COp] channels-last (COp: CO padded to a multiple of 4, its extra channels zero),
// on Hopper's tensor cores in float32-class accuracy. transposed: the transposed convolution of geom by w
// [C, CO, taps], where every stride is 1: the direct convolution by the flipped kernel with dil (k - 1) - pad
// zeros before each dim. false: not this device, or a convolution this kernel does not take (grouped,
// strided transposed, too deep, or refused by CUTLASS); out not written.
__HIDDEN__ bool stitch_cutlass_conv(__PARAMS__) {
  const int64_t N = geom[0], C = geom[1], CO = geom[2], groups = geom[3];
  const int64_t COp = out_channels_padded, Cp = (3 * C + 3) / 4 * 4;
  int64_t in[3], out_sz[3], k[3], stride[3], pad[3], dil[3], S = 1, OS = 1, T = 1;
  for (int j = 0; j < 3; ++j) {
    in[j] = geom[4 + j];
    out_sz[j] = geom[7 + j];
    k[j] = geom[10 + j];
    stride[j] = geom[13 + j];
    pad[j] = geom[16 + j];
    dil[j] = geom[19 + j];
    S *= in[j];
    OS *= out_sz[j];
    T *= k[j];
  }
  if (transposed)
    for (int j = 0; j < 3; ++j) {
      if (stride[j] != 1 || dil[j] * (k[j] - 1) < pad[j]) return false;
      pad[j] = dil[j] * (k[j] - 1) - pad[j];
    }
  const int64_t limit = int64_t{1} << 31;
  // The split pass runs a batch (an image, an output channel) a row of blocks: at most 65535.
  if (groups != 1 || COp % 4 != 0 || COp < CO || Cp * T > kStitchConvMaxDepth || N * S * Cp >= limit ||
      N * OS * COp >= limit || N * OS == 0 || N > 65535 || CO > 65535)
    return false;
  cudaStream_t stream = stitch::current_stream();
  if (!stitch_sm90_ready(stream)) return false;
  // The padding after each dim that gives this output extent (a convolution's floor may drop input).
  int64_t pad_hi[3];
  for (int j = 0; j < 3; ++j)
    pad_hi[j] = std::max<int64_t>(0, (out_sz[j] - 1) * stride[j] + dil[j] * (k[j] - 1) + 1 - in[j] - pad[j]);
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  StitchConvProblem problem(cutlass::conv::Mode::kCrossCorrelation,
                            {i32(N), i32(in[0]), i32(in[1]), i32(in[2]), i32(Cp)},
                            {i32(COp), i32(k[0]), i32(k[1]), i32(k[2]), i32(Cp)},
                            {i32(pad[0]), i32(pad[1]), i32(pad[2])},
                            {i32(pad_hi[0]), i32(pad_hi[1]), i32(pad_hi[2])},
                            {i32(stride[0]), i32(stride[1]), i32(stride[2])},
                            {i32(dil[0]), i32(dil[1]), i32(dil[2])}, 1);
  for (int j = 0; j < 3; ++j)
    if (problem.shape_C[1 + j] != out_sz[j]) return false;
  stitch::Scratch xs(static_cast<size_t>(N * S * Cp) * sizeof(float), stream);
  stitch::Scratch ws(static_cast<size_t>(COp * T * Cp) * sizeof(float), stream);
  using Kernel = StitchConv::ConvKernel;
  typename Kernel::StrideD stride_d;
  cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = problem.stride_C[StitchConvProblem::RankT - 2 - i];
  });
  typename StitchConv::Arguments args{
      problem,
      {static_cast<const float*>(xs.ptr), static_cast<const float*>(ws.ptr)},
      {{1.f, 0.f}, nullptr, typename Kernel::StrideC{}, out, stride_d}};
  StitchConv conv;
  if (conv.can_implement(args) != cutlass::Status::kSuccess) return false;
  stitch_conv_split(x, w, N, C, S, CO, COp, T, Cp, transposed, static_cast<float*>(xs.ptr),
                    static_cast<float*>(ws.ptr), stream);
  const size_t bytes = StitchConv::get_workspace_size(args);
  stitch::Scratch workspace(bytes > 0 ? bytes : 1, stream);
  STITCH_CHECK(conv.initialize(args, workspace.ptr, stream) == cutlass::Status::kSuccess,
               "CUTLASS SM90 convolution: initialize failed");
  STITCH_CHECK(conv.run(stream) == cutlass::Status::kSuccess, "CUTLASS SM90 convolution: launch failed");
  STITCH_LAUNCH_CHECK();
  return true;
}
""".replace("__PARAMS__", _PARAMS).replace("__HIDDEN__", '__attribute__((visibility("hidden")))')


def source(bridge: str, header: str) -> str:
    """cutlass_conv.cu: `bridge` declares the stream, scratch memory and checks forward.cpp defines
    (cuda.BRIDGE), `header` is the program's shared header. The same text in every program that has it."""
    return "\n".join(
        [
            "// Synthesized by StitchCUDA's built-in coder (CUDA backend): direct convolutions as",
            "// CUTLASS 3's Hopper implicit GEMM instantiated here (3xTF32 over split channels); kernels.cu",
            "// calls stitch_cutlass_conv. No program's name here: the Verifier's builds share its object.",
            *cutlass_gemm.prelude(header),
            *HEADERS,
            bridge,
            "namespace {",
            cutlass_gemm.SM90_COMMON,
            SOURCE,
            "}  // namespace",
            ENTRY,
            "#pragma GCC visibility pop",
        ]
    )


__all__ = ["DECLARATION", "FILE", "source"]
