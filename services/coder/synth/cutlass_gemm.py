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

_TEMPLATE = r"""
// 128x128 block tiles of 16 along K, 64x64 warp tiles, m16n8k8 TF32 instructions, four pipeline stages
// (cp.async), operands 16-byte aligned (4 floats); C row-major [batch, M, N].
template <typename LayoutA, typename LayoutB>
using StitchCutlassGemm = cutlass::gemm::device::GemmUniversal<
    float, LayoutA, float, LayoutB, float, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp,
    cutlass::arch::Sm80, cutlass::gemm::GemmShape<128, 128, 16>, cutlass::gemm::GemmShape<64, 64, 16>,
    cutlass::gemm::GemmShape<16, 8, 8>, cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 4, 4, 4,
    cutlass::arch::OpMultiplyAddFastF32>;

int64_t stitch_cutlass_sms() {
  int device = 0, sms = 0;
  STITCH_CUDA_CHECK(cudaGetDevice(&device));
  STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

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

_ENTRY = r"""
// dims: batch, M, N, K, then the strides sAb, sAm, sAk, sBb, sBk, sBn (stitch_gemm_launch's). A layout is
// row-major where its unit stride is along K (A) or N (B), column-major where it is along M (A) or K (B).
__HIDDEN__ bool stitch_cutlass_gemm(__PARAMS__) {
  const int64_t sAm = dims[5], sAk = dims[6], sBk = dims[8], sBn = dims[9];
  const bool a_row = sAk == 1, a_col = !a_row && sAm == 1, b_row = sBn == 1, b_col = !b_row && sBk == 1;
  (void)a_col;
  (void)b_col;
__DISPATCH__
  return false;
}
"""


def _layout(value: Value) -> str | None:
    """A GEMM operand's layout from its traced strides: unit stride along its last dim (row-major), along
    the one before (column-major), or neither (None). A vector is one row."""
    if len(value.stride) < 2 or value.stride[-1] == 1 or value.shape[-1] == 1:
        return ROW
    return COL if value.stride[-2] == 1 or value.shape[-2] == 1 else None


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


def source(ext_name: str, layouts: set[tuple[str, str]], bridge: str, header: str) -> str:
    """cutlass_gemm.cu for these layouts; `bridge` declares the stream, scratch memory and checks forward.cpp
    defines (cuda.BRIDGE), `header` is the program's shared header."""
    dispatch = [
        f"  if (a_{a} && b_{b})\n"
        f"    return stitch_cutlass_run<{_LAYOUT[a]}, {_LAYOUT[b]}>(A, {'sAm' if a == ROW else 'sAk'}, B, "
        f"{'sBk' if b == ROW else 'sBn'}, bias, C, dims);"
        for a, b in sorted(layouts)
    ]
    return "\n".join(
        [
            f"// {ext_name}: synthesized by StitchCUDA's built-in coder (CUDA backend), the GEMMs as CUTLASS",
            "// templates instantiated here (3xTF32 tensor-op GEMM); kernels.cu calls stitch_cutlass_gemm.",
            f'#include "{header}"',
            "",
            "#include <cuda_runtime.h>",
            "",
            "#include <algorithm>",
            "#include <cstdint>",
            "",
            "// Every CUTLASS symbol this unit instantiates stays inside the program's .so.",
            "#pragma GCC visibility push(hidden)",
            "#include <cutlass/cutlass.h>",
            "#include <cutlass/epilogue/thread/linear_combination.h>",
            "#include <cutlass/gemm/device/gemm_universal.h>",
            bridge,
            "namespace {",
            _TEMPLATE,
            "}  // namespace",
            _ENTRY.replace("__PARAMS__", _PARAMS)
            .replace("__HIDDEN__", _HIDDEN)
            .replace("__DISPATCH__", "\n".join(dispatch)),
            "#pragma GCC visibility pop",
        ]
    )


__all__ = ["DECLARATION", "FILE", "layouts_of", "source"]
