"""The CUDA back end: grid-stride kernels with float4 accesses, warp-shuffle block reductions,
__launch_bounds__, launched on the caller's stream; library calls (cuBLAS/cuDNN through ATen) stay in
the host code with their epilogues fused into these kernels.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from stitchcuda.coder.synth import convolution, cutlass_conv, cutlass_gemm, libops, rnn
from stitchcuda.coder.synth.codegen import (
    CTYPE,
    Host,
    KernelBodies,
    KernelInfo,
    Scope,
    acc_combine,
    acc_final,
    acc_init,
    acc_type,
    acc_update,
    flat_load,
    local_var,
    tensor_var,
)
from stitchcuda.coder.synth.cpu import indent, launch_lines
from stitchcuda.coder.synth.cuda_columns import column_kernel
from stitchcuda.coder.synth.cuda_levels import BLOCK_GROUP, split_levels
from stitchcuda.coder.synth.cuda_patterns import moments_finish, moments_pair, online_softmax_pair
from stitchcuda.coder.synth.fusion import Program, fuse_library_epilogues
from stitchcuda.coder.synth.ir import Attr, Ref, Unsupported
from stitchcuda.coder.synth.runtime import (
    BINDING_FILE,
    GCC_O1,
    HEADER_NAME,
    binding_source,
    operator_includes,
)
from stitchcuda.coder.synth.variants import Variant

CFLAGS = ["-O3", "-std=c++17"]
CUDA_CFLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
LDFLAGS: list[str] = []

DEVICE_HELPERS = r"""
// ---- device helpers: warp-shuffle block reductions ----
__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ double shfl_xor(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ stitch::ArgAcc shfl_xor(stitch::ArgAcc v, int o) {
  stitch::ArgAcc r;
  r.v = __shfl_xor_sync(0xffffffffu, v.v, o);
  r.i = __shfl_xor_sync(0xffffffffu, v.i, o);
  return r;
}

// Every thread of the block gets the combined value. `smem` holds one slot per warp (32 slots).
template <typename T, typename F>
__device__ __forceinline__ T block_allreduce(T v, F combine, T* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(v, shfl_xor(v, o));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T total = smem[0];
  for (int w = 1; w < nwarps; ++w) total = combine(total, smem[w]);
  return total;
}

// A softmax's running maximum and sum of exp(x - m), as the two passes compute them: NaN poisons the sum
// (the row is NaN either way), +inf makes it NaN (exp(inf - inf)), -inf elements add nothing.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum maxsum_add(MaxSum a, float x) {
  if (x > a.m) {
    a.s = x == INFINITY ? NAN : a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else if (x != x) {
    a.s = x;
  } else if (a.m != -INFINITY) {
    a.s += expf(x - a.m);
  }
  return a;
}
__device__ __forceinline__ MaxSum maxsum_combine(MaxSum a, MaxSum b) {
  const float m = a.m > b.m ? a.m : b.m;
  // A part whose maximum is -inf holds only zeros (or NaN): scaled by 0, never by exp(NaN).
  const float sa = a.s * (a.m == -INFINITY ? 0.0f : expf(a.m - m));
  const float sb = b.s * (b.m == -INFINITY ? 0.0f : expf(b.m - m));
  return MaxSum{m, sa + sb};
}
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int o) {
  return MaxSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
}

// WARP: the lanes of a warp combine by shuffles alone (a warp per row); otherwise the whole block.
template <bool WARP, typename T, typename F>
__device__ __forceinline__ T group_allreduce(T v, F combine, T* smem) {
  if constexpr (WARP) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = combine(v, shfl_xor(v, o));
    return v;
  } else {
    return block_allreduce<T>(v, combine, smem);
  }
}

__device__ __forceinline__ float lane4(const float4& f, int l) {
  return l == 0 ? f.x : (l == 1 ? f.y : (l == 2 ? f.z : f.w));
}

inline int sm_count() {
  int device = 0, count = 0;
  STITCH_CUDA_CHECK(cudaGetDevice(&device));
  STITCH_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int pow2_at_least(int64_t x, int lo, int hi) {
  int t = lo;
  while (t < hi && t < x) t <<= 1;
  return t;
}
"""


class CudaKernels:
    def __init__(self, program: Program, variant: Variant) -> None:
        self.p = program
        self.g = program.graph
        self.variant = variant
        self.block = int(variant.block)
        self.row_block = int(variant.row_block)
        self.vec_allowed = variant.vec == "4"
        self.bodies = KernelBodies()

    # ---- shared pieces -------------------------------------------------------------------------------
    def scalar_fn(self, info: KernelInfo) -> Callable[[Any], str]:
        keys = [key for _, key in info.scalars]

        def scalar(a: Any) -> str:
            if isinstance(a, Attr):
                return f"s{keys.index('attr:' + a.path)}"
            if isinstance(a, Ref):
                return f"s{keys.index('host:' + a.id)}"
            raise Unsupported(f"scalar {a!r}")

        return scalar

    def kernel_params(self, info: KernelInfo, extra: list[str]) -> list[str]:
        k = info.kernel
        out = []
        for i, o in enumerate(info.operands):
            ctype = CTYPE[self.g.values[o.id].dtype]
            restrict = "" if o.id == k.inplace else " __restrict__"
            out.append(f"const {ctype}*{restrict} in{i}")
        root_ctype = CTYPE[self.g.values[k.root].dtype]
        out.append(f"{root_ctype}*{'' if k.inplace else ' __restrict__'} out")
        out.append(f"const {k.name}_descs D")
        out.extend(extra)
        out.extend(f"float s{i}" for i in range(len(info.scalars)))
        return out

    def call_args(self, info: KernelInfo, extra: list[str]) -> list[str]:
        args = [f"in{i}" for i in range(len(info.operands))] + ["out", "D", *extra]
        return args + [f"s{i}" for i in range(len(info.scalars))]

    def launcher_params(self, info: KernelInfo, extra: list[str]) -> list[str]:
        k = info.kernel
        out = []
        for i, o in enumerate(info.operands):
            out.append(f"const {CTYPE[self.g.values[o.id].dtype]}* in{i}")
        out.append(f"{CTYPE[self.g.values[k.root].dtype]}* out")
        out.append("const stitch::Desc* descs")
        out.extend(extra)
        out.extend(f"float s{i}" for i in range(len(info.scalars)))
        return out

    def desc_struct(self, info: KernelInfo) -> list[str]:
        k = info.kernel
        n = max(len(info.general), 1)
        return [f"struct {k.name}_descs {{", f"  stitch::Desc d[{n}];", "};"]

    def desc_fill(self, info: KernelInfo) -> list[str]:
        k = info.kernel
        return [
            f"{k.name}_descs D{{}};",
            f"for (int j = 0; j < {len(info.general)}; ++j) D.d[j] = descs[j];",
        ]

    def slot(self, info: KernelInfo, i: int) -> int:
        return info.general.index(i)

    def row_bases(self, info: KernelInfo, index: str = "I", row: str = "r") -> list[str]:
        """Each strided or broadcast operand's offset of row `row` (index type `index`): `b<k>`."""
        return [
            f"const int64_t b{i} = stitch::row_off<{index}>(D.d[{self.slot(info, i)}], {row});"
            for i in info.general
        ]

    def col_strides(self, info: KernelInfo) -> list[str]:
        """Each strided or broadcast operand's step along the innermost column: `cs<k>`."""
        return [
            f"const int64_t cs{i} = D.d[{self.slot(info, i)}].nc ? D.d[{self.slot(info, i)}].cstr[0] : 0;"
            for i in info.general
        ]

    def scalar_setup(self, info: KernelInfo) -> list[str]:
        return [
            f"const {CTYPE[self.g.values[o.id].dtype]} z{i} = in{i}[0];"
            for i, o in enumerate(info.operands)
            if o.access == "scalar"
        ]

    def vectorizable(self, info: KernelInfo) -> bool:
        if not self.vec_allowed or self.g.values[info.kernel.root].dtype != "float32":
            return False
        return all(self.g.values[o.id].dtype == "float32" for o in info.operands if o.access == "contig")

    def contig_ptrs(self, info: KernelInfo) -> list[str]:
        return [f"in{i}" for i, o in enumerate(info.operands) if o.access == "contig"]

    # ---- pointwise -------------------------------------------------------------------------------------
    def pointwise(self, info: KernelInfo) -> str:
        k = info.kernel
        index = {o.id: i for i, o in enumerate(info.operands)}
        general = info.general
        vec_ok = self.vectorizable(info)

        def body(vector: bool) -> list[str]:
            def load(ident: str) -> str:
                i = index[ident]
                acc = info.operands[i].access
                if acc == "scalar":
                    return f"z{i}"
                if acc == "contig":
                    return f"lane4(f{i}, l)" if vector else f"in{i}[i]"
                return f"in{i}[b{i} + static_cast<int64_t>(c) * cs{i}]"

            scope = Scope(self.g, info.ops, self.scalar_fn(info), load)
            value = scope.need(k.root)
            return [*scope.lines, f"res[l] = {value};"]

        bases = self.row_bases(info)
        strides = self.col_strides(info)
        root_ctype = CTYPE[self.g.values[k.root].dtype]
        vec_loads = [
            f"const float4 f{i} = reinterpret_cast<const float4*>(in{i})[v];"
            for i, o in enumerate(info.operands)
            if o.access == "contig"
        ]
        row_of = ["const I r = i0 / cols;", "const I c0 = i0 - r * cols;", *bases] if general else []
        vec_loop = [
            "const I nvec = n / VEC;",
            "for (I v = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;",
            "     v += static_cast<I>(gridDim.x) * blockDim.x) {",
            "  const I i0 = v * VEC;",
            *indent(row_of, 2),
            f"  {root_ctype} res[VEC];",
            "  if constexpr (VEC == 4) {",
            *indent(vec_loads, 4),
            "#pragma unroll",
            "    for (int l = 0; l < 4; ++l) {",
            "      const I i = i0 + l;",
            "      const I c = " + ("c0 + l;" if general else "0;"),
            "      (void)i; (void)c;",
            *indent(body(True), 6),
            "    }",
            "    reinterpret_cast<float4*>(out)[v] = make_float4(res[0], res[1], res[2], res[3]);",
            "  } else {",
            "    const int l = 0;",
            "    const I i = i0;",
            "    const I c = " + ("c0;" if general else "0;"),
            "    (void)i; (void)c;",
            *indent(body(False), 4),
            "    out[i0] = res[0];",
            "  }",
            "}",
        ]
        tail_row = (
            ["const I r = i / cols;", "const I c = i - r * cols;", *bases] if general else ["const I c = 0;"]
        )
        tail = [
            "// Elements past the last full vector (flat contiguous case only).",
            "for (I i = nvec * VEC + static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;",
            "     i += static_cast<I>(gridDim.x) * blockDim.x) {",
            *indent(tail_row, 2),
            "  (void)c;",
            f"  {root_ctype} res[1];",
            "  const int l = 0;",
            *indent(body(False), 2),
            "  out[i] = res[0];",
            "}",
        ]
        kernel_body = [*self.scalar_setup(info), *strides, *vec_loop, *tail]
        params = self.kernel_params(info, ["const I n", "const I cols"])
        kernel = [
            *self.desc_struct(info),
            "",
            f"// {k.name}: pointwise over {', '.join(k.origins)}",
            "template <int VEC, typename I>",
            f"__global__ void __launch_bounds__({self.block}) {k.name}_kernel(",
            "    " + ",\n    ".join(params) + ") {",
            *indent(kernel_body, 2),
            "}",
        ]
        block = self.block
        align = " && ".join(f"aligned16({p})" for p in [*self.contig_ptrs(info), "out"])
        vec_cond = f"{align} && (cols % 4 == 0 || {str(not general).lower()})" if vec_ok else "false"
        wide = ", ".join(self.call_args(info, ["n", "cols"]))
        narrow = ", ".join(self.call_args(info, ["static_cast<int32_t>(n)", "static_cast<int32_t>(cols)"]))
        launcher = [
            f"static void {k.name}_launch(",
            "    " + ",\n    ".join(self.launcher_params(info, ["int64_t n", "int64_t cols"])) + ") {",
            *indent(self.desc_fill(info), 2),
            "  if (n == 0) return;",
            "  cudaStream_t stream = stitch::current_stream();",
            f"  const bool vec4 = {vec_cond};",
            "  const int64_t work = vec4 ? (n + 3) / 4 : n;",
            "  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>("
            f"(work + {block - 1}) / {block}, "
            f"static_cast<int64_t>(sm_count()) * {max(2048 // block, 1)}));",
            "  const bool small = n < (int64_t(1) << 31) - 1;",
            *(
                [
                    "  if (vec4 && small)",
                    f"    {k.name}_kernel<4, int32_t><<<blocks, {block}, 0, stream>>>({narrow});",
                    "  else if (vec4)",
                    f"    {k.name}_kernel<4, int64_t><<<blocks, {block}, 0, stream>>>({wide});",
                    "  else if (small)",
                ]
                if vec_ok
                # Only the scalar instantiations exist when float4 cannot apply (non-float data).
                else ["  if (small)"]
            ),
            f"    {k.name}_kernel<1, int32_t><<<blocks, {block}, 0, stream>>>({narrow});",
            "  else",
            f"    {k.name}_kernel<1, int64_t><<<blocks, {block}, 0, stream>>>({wide});",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
        return "\n".join([*kernel, "", *launcher])

    # ---- row kernels -------------------------------------------------------------------------------------
    def row(self, info: KernelInfo) -> str:
        k = info.kernel
        if not k.trailing:
            return self.row_columns(info)
        index = {o.id: i for i, o in enumerate(info.operands)}
        scalar = self.scalar_fn(info)
        vec_ok = self.vectorizable(info)

        used: set[int] = set()

        def element_load(vector: bool) -> Callable[[str], str]:
            def load(ident: str) -> str:
                i = index[ident]
                acc = info.operands[i].access
                if acc == "scalar":
                    return f"z{i}"
                if acc == "contig":
                    used.add(i)
                    return f"lane4(f{i}, l)" if vector else f"in{i}[r * cols + c]"
                return f"in{i}[b{i} + stitch::col_off<int64_t>(D.d[{self.slot(info, i)}], c)]"

            return load

        def row_load(ident: str) -> str:
            i = index[ident]
            acc = info.operands[i].access
            if acc == "scalar":
                return f"z{i}"
            if acc == "contig":
                return f"in{i}[r * cols]"
            return f"in{i}[b{i}]"

        def bases() -> list[str]:
            return self.row_bases(info, "int64_t")

        # Single-pass reductions (a sum, a norm) accumulate in double: a lane may add 10^4 elements of a row,
        # and memory-bound, the FP64 adds are free. A softmax's or a norm's passes keep float registers.
        single = info.max_level == 1 and k.root_level == "row"
        accs = {r.op.out: acc_type(r.op.fn, self.variant.acc, default_double=single) for r in info.reductions}
        # Row caching (CACHED=true): each thread keeps the float4s of the contiguous operands it loaded
        # in the first pass that reads them, in registers, and later passes reuse them instead of reading
        # the row again. Valid when cols <= threads * 4 * RCACHE (checked on the host).
        loaded: set[int] = set()
        cached_ops: set[int] = set()
        row_cache = [True]  # whether element passes emit the cached branch (off when too many operands)

        def cached_loads(pass_used: set[int]) -> list[str]:
            out = []
            for i in sorted(pass_used):
                if i in loaded:
                    out.append(f"const float4 f{i} = cache{i}[it];")
                    cached_ops.add(i)
                else:
                    out.append(
                        f"const float4 f{i} = reinterpret_cast<const float4*>(in{i} + r * cols)[c0 / 4];"
                    )
                    out.append(f"cache{i}[it] = f{i};")
                    cached_ops.add(i)
            loaded.update(pass_used)
            return out

        def cached_loop(body: list[str], loads: list[str], head: list[str], tail: list[str]) -> list[str]:
            return [
                "#pragma unroll",
                f"for (int it = 0; it < {k.name}_RCACHE; ++it) {{",
                "  const int64_t c0 = tid * 4 + static_cast<int64_t>(it) * nthr * 4;",
                "  if (c0 < cols) {",
                *indent(loads, 4),
                *indent(head, 4),
                "#pragma unroll",
                "    for (int l = 0; l < 4; ++l) {",
                "      const int64_t c = c0 + l;",
                "      (void)c;",
                *indent(body, 6),
                "    }",
                *indent(tail, 4),
                "  }",
                "}",
            ]

        def column_loop(
            inner_lines: Callable[[bool], list[str]], c_begin: str, c_end: str, cache: bool = False
        ) -> list[str]:
            used.clear()
            vec_body = inner_lines(True)
            pass_used = set(used)
            scalar_body = inner_lines(False)
            prefix: list[str] = []
            if cache and row_cache[0]:
                prefix = [
                    "if constexpr (VEC == 4 && CACHED) {",
                    *indent(cached_loop(vec_body, cached_loads(pass_used), [], []), 2),
                    "} else",
                ]
            vec_loads_here = [
                f"const float4 f{i} = reinterpret_cast<const float4*>(in{i} + r * cols)[c0 / 4];"
                for i in sorted(pass_used)
            ]
            return [
                *prefix,
                "if constexpr (VEC == 4) {",
                # Unrolled so that each thread keeps several independent loads in flight.
                "#pragma unroll 4",
                f"  for (int64_t c0 = {c_begin} + tid * 4; c0 < {c_end}; c0 += nthr * 4) {{",
                *indent(vec_loads_here, 4),
                "#pragma unroll",
                "    for (int l = 0; l < 4; ++l) {",
                "      const int64_t c = c0 + l;",
                "      (void)c;",
                *indent(vec_body, 6),
                "    }",
                "  }",
                "} else {",
                "#pragma unroll 8",
                f"  for (int64_t c = {c_begin} + tid; c < {c_end}; c += nthr) {{",
                "    const int l = 0;",
                "    (void)l;",
                *indent(scalar_body, 4),
                "  }",
                "}",
            ]

        def row_section(scope: Scope, level: int) -> None:
            for op in k.ops:
                if op.kind == "ew" and info.row_level.get(op.out) and info.levels.get(op.out) == level:
                    scope.need(op.out)

        def element_pass(
            row_scope: Scope,
            level: int,
            c_begin: str,
            c_end: str,
            acc_map: dict[str, str],
            cache: bool = False,
        ) -> list[str]:
            reds = [r for r in info.reductions if r.level == level]
            decls = [
                f"{acc_map[r.op.out]} a_{local_var(r.op.out)} = {acc_init(r.op.fn, acc_map[r.op.out])};"
                for r in reds
            ]

            def inner(vector: bool) -> list[str]:
                sc = Scope(self.g, info.ops, scalar, element_load(vector), parent=row_scope)
                ups = [
                    acc_update(
                        r.op.fn, acc_map[r.op.out], "a_" + local_var(r.op.out), sc.need(r.op.args[0].id), "c"
                    )
                    for r in reds
                ]
                return [*sc.lines, *ups]

            return [*decls, *column_loop(inner, c_begin, c_end, cache)]

        def reduce_block(level: int, acc_map: dict[str, str]) -> list[str]:
            lines = []
            for r in info.reductions:
                if r.level != level:
                    continue
                name = "a_" + local_var(r.op.out)
                acc = acc_map[r.op.out]
                combine = acc_combine(r.op.fn, "x", "y")
                lines.append(
                    f"{name} = group_allreduce<WARP, {acc}>({name}, "
                    f"[]({acc} x, {acc} y) {{ return {combine}; }}, reinterpret_cast<{acc}*>(smem));"
                )
            return lines

        def finalize(row_scope: Scope, level: int, acc_map: dict[str, str]) -> list[str]:
            lines = []
            for r in info.reductions:
                if r.level != level:
                    continue
                name = local_var(r.op.out)
                ctype = CTYPE[self.g.values[r.op.out].dtype]
                lines.append(
                    f"const {ctype} {name} = {acc_final(r.op.fn, acc_map[r.op.out], 'a_' + name, 'cols')};"
                )
                row_scope.names[r.op.out] = name
            return lines

        def store(row_scope: Scope) -> list[str]:
            if k.root_level == "row":
                return [f"if (tid == 0) out[r] = {row_scope.need(k.root)};"]

            def inner(vector: bool) -> list[str]:
                sc = Scope(self.g, info.ops, scalar, element_load(vector), parent=row_scope)
                value = sc.need(k.root)
                if vector:
                    return [*sc.lines, f"res[l] = {value};"]
                return [*sc.lines, f"out[r * cols + c] = {value};"]

            root_ctype = CTYPE[self.g.values[k.root].dtype]
            used.clear()
            vec_body = inner(True)
            pass_used = set(used)
            store_vec = [
                "reinterpret_cast<float4*>(out + r * cols)[c0 / 4] =",
                "    make_float4(res[0], res[1], res[2], res[3]);",
            ]
            vec_loads_here = [
                f"const float4 f{i} = reinterpret_cast<const float4*>(in{i} + r * cols)[c0 / 4];"
                for i in sorted(pass_used)
            ]
            # The cached branch only where the element passes cache too (too many operands: no cache arrays).
            cached_branch: list[str] = []
            if row_cache[0]:
                cached = cached_loop(vec_body, cached_loads(pass_used), [f"{root_ctype} res[4];"], store_vec)
                cached_branch = ["if constexpr (VEC == 4 && CACHED) {", *indent(cached, 2), "} else"]
            return [
                *cached_branch,
                "if constexpr (VEC == 4) {",
                "  for (int64_t c0 = tid * 4; c0 < cols; c0 += nthr * 4) {",
                *indent(vec_loads_here, 4),
                f"    {root_ctype} res[4];",
                "#pragma unroll",
                "    for (int l = 0; l < 4; ++l) {",
                "      const int64_t c = c0 + l;",
                "      (void)c;",
                *indent(vec_body, 6),
                "    }",
                "    reinterpret_cast<float4*>(out + r * cols)[c0 / 4] =",
                "        make_float4(res[0], res[1], res[2], res[3]);",
                "  }",
                "} else {",
                "  for (int64_t c = tid; c < cols; c += nthr) {",
                "    const int l = 0;",
                "    (void)l;",
                *indent(inner(False), 4),
                "  }",
                "}",
            ]

        pair = online_softmax_pair(info)

        def online_pass(row_scope: Scope) -> list[str]:
            """A softmax's max and sum of exp(x - max) in one pass (a running max, the sum rescaled)."""
            assert pair is not None
            r1, r2 = pair

            def inner(vector: bool) -> list[str]:
                sc = Scope(self.g, info.ops, scalar, element_load(vector), parent=row_scope)
                x = sc.need(r1.op.args[0].id)
                return [*sc.lines, f"ms = maxsum_add(ms, {x});"]

            m, t = local_var(r1.op.out), local_var(r2.op.out)
            row_scope.names[r1.op.out], row_scope.names[r2.op.out] = m, t
            return [
                "MaxSum ms{-INFINITY, 0.0f};",
                *column_loop(inner, "0", "cols", True),
                "ms = group_allreduce<WARP, MaxSum>(ms, [](MaxSum x, MaxSum y) "
                "{ return maxsum_combine(x, y); }, reinterpret_cast<MaxSum*>(smem));",
                f"const float {m} = ms.m;",
                f"const float {t} = ms.s;",
            ]

        moments = None if pair is not None else moments_pair(info)

        def moments_accumulate(row_scope: Scope, c_begin: str, c_end: str, cache: bool) -> list[str]:
            """Sums of x and x^2 (double) over [c_begin, c_end) of the row, into m1 and m2."""
            assert moments is not None

            def inner(vector: bool) -> list[str]:
                sc = Scope(self.g, info.ops, scalar, element_load(vector), parent=row_scope)
                x = sc.need(moments[0].op.args[0].id)
                return [
                    *sc.lines,
                    f"{{ const double xd = static_cast<double>({x}); m1 += xd; m2 += xd * xd; }}",
                ]

            return ["double m1 = 0.0, m2 = 0.0;", *column_loop(inner, c_begin, c_end, cache)]

        def moments_pass(row_scope: Scope) -> list[str]:
            """A normalization's mean and variance in one pass (the variance as E[x^2] - E[x]^2 in double)."""
            assert moments is not None
            m, v = local_var(moments[0].op.out), local_var(moments[1].op.out)
            row_scope.names[moments[0].op.out], row_scope.names[moments[1].op.out] = m, v
            return [
                *moments_accumulate(row_scope, "0", "cols", True),
                *[
                    f"{a} = group_allreduce<WARP, double>({a}, [](double x, double y) {{ return x + y; }}, "
                    "reinterpret_cast<double*>(smem));"
                    for a in ("m1", "m2")
                ],
                *moments_finish(m, v, "m1", "m2"),
            ]

        def row_body(acc_map: dict[str, str]) -> list[str]:
            row_scope = Scope(self.g, info.ops, scalar, row_load)
            lines = bases()
            row_section(row_scope, 0)
            lines += row_scope.lines
            fused = online_pass if pair is not None else (moments_pass if moments is not None else None)
            for level in range(1, info.max_level + 1):
                row_scope.lines = []
                if fused is not None and level == 2:
                    continue  # computed with level 1
                if fused is not None and level == 1:
                    lines += fused(row_scope)
                    row_section(row_scope, 1)
                    row_section(row_scope, 2)
                    lines += row_scope.lines
                    continue
                lines += element_pass(row_scope, level, "0", "cols", acc_map, cache=row_cache[0])
                lines += reduce_block(level, acc_map)
                lines += finalize(row_scope, level, acc_map)
                row_section(row_scope, level)
                lines += row_scope.lines
            row_scope.lines = []
            tail = store(row_scope)
            return [*lines, *row_scope.lines, *tail]

        smem_bytes = 32 * 16
        main_params = self.kernel_params(info, ["const int64_t rows", "const int64_t cols"])
        body = row_body(accs)
        # Registers for the row cache: 4 float4 per cached operand, which covers a row whenever the launcher
        # gives each thread 16 columns (cols <= 16 * row_block). A deeper cache spilled to local memory on
        # sm_90 under __launch_bounds__(512) (16 float4: 468 B of spill stores; rows 3-20x slower on an H200).
        reuse = sorted(cached_ops)
        rcache = 4 if info.max_level > 0 and 0 < len(reuse) <= 2 else 0
        if not rcache and reuse:
            # Too many operands to cache: the body again without the cached branch, whose stores would
            # name arrays never declared (an error even in a discarded `if constexpr` branch).
            row_cache[0] = False
            loaded.clear()
            cached_ops.clear()
            body = row_body(accs)
            reuse = []
        caches = [f"[[maybe_unused]] float4 cache{i}[{k.name}_RCACHE];" for i in reuse] if rcache else []
        main = [
            *self.desc_struct(info),
            "",
            f"constexpr int {k.name}_RCACHE = {max(rcache, 1)};",
            f"// {k.name}: row kernel ({info.max_level} passes, a block or a warp per row): "
            f"{', '.join(k.origins)}",
            "template <int VEC, bool CACHED, bool WARP>",
            f"__global__ void __launch_bounds__({self.row_block}) {k.name}_kernel(",
            "    " + ",\n    ".join(main_params) + ") {",
            f"  __shared__ __align__(16) unsigned char smem[{smem_bytes}];",
            "  (void)smem;",
            *indent(self.scalar_setup(info), 2),
            # WARP: each warp of the block owns rows (no barrier); otherwise the block owns each row.
            "  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;",
            "  const int nthr = WARP ? 32 : blockDim.x;",
            "  const int64_t r0 = WARP",
            "      ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)",
            "      : static_cast<int64_t>(blockIdx.x);",
            "  const int64_t rstep = WARP ? static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5) : gridDim.x;",
            "  for (int64_t r = r0; r < rows; r += rstep) {",
            *indent(caches, 4),
            *indent(body, 4),
            "  }",
            "}",
        ]
        split_ok = k.root_level == "row" and info.max_level == 1 and self.variant.split != "off"
        split_code: list[str] = []
        if split_ok:
            split_code = self.row_split(
                info, element_pass, reduce_block, finalize, row_section, bases, scalar, row_load
            )
        # Few long rows with a full-size result or dependent reductions (x / ||x||, a global softmax): one
        # grid-wide split pass per reduction level, then the store pass over the whole grid.
        levels_ok = not split_ok and info.max_level > 0 and self.variant.split != "off"
        if levels_ok:
            split_code = split_levels(
                self,
                info,
                element_pass,
                reduce_block,
                row_section,
                bases,
                scalar,
                row_load,
                element_load,
                used,
                (moments, moments_accumulate) if moments is not None else None,
            )
        align = " && ".join(f"aligned16({p})" for p in [*self.contig_ptrs(info), "out"])
        vec_cond = f"{align} && cols % 4 == 0" if vec_ok else "false"
        rb = self.row_block
        row_args = ", ".join(self.call_args(info, ["rows", "cols"]))
        launcher = [
            f"static void {k.name}_launch(",
            "    " + ",\n    ".join(self.launcher_params(info, ["int64_t rows", "int64_t cols"])) + ") {",
            *indent(self.desc_fill(info), 2),
            "  if (rows == 0) return;",
            "  cudaStream_t stream = stitch::current_stream();",
            f"  const bool vec4 = {vec_cond};",
            f"  const int threads = pow2_at_least((cols + (vec4 ? 15 : 3)) / (vec4 ? 16 : 4), 32, {rb});",
        ]
        if split_ok or levels_ok:
            launcher += [
                "  const int64_t per_block = static_cast<int64_t>(threads) * (vec4 ? 16 : 4);",
                "  if (rows < 2 * sm_count() && cols >= 8 * per_block) {",
                "    const int64_t want = (4 * static_cast<int64_t>(sm_count()) + rows - 1) / rows;",
                "    const int64_t splits = std::max<int64_t>(2, std::min<int64_t>(want, cols / per_block));",
                f"    {k.name}_{'split' if split_ok else 'levels'}("
                + ", ".join(self.call_args(info, ["rows", "cols"]))
                + ", splits, threads, vec4, stream);",
                "    return;",
                "  }",
            ]

        def launches(warp: str, threads: str, blocks: str, width: str) -> list[str]:
            """The launches of one mode; `width` threads share a row (the row cache covers 16 per thread)."""
            cfg = f"<<<{blocks}, {threads}, 0, stream>>>"
            return [
                *(
                    [
                        f"  if (vec4 && cols <= static_cast<int64_t>({width}) * 4 * {k.name}_RCACHE)",
                        f"    {k.name}_kernel<4, true, {warp}>{cfg}({row_args});",
                        "  else if (vec4)",
                    ]
                    if rcache and vec_ok
                    else ["  if (vec4)"]
                ),
                f"    {k.name}_kernel<{4 if vec_ok else 1}, false, {warp}>{cfg}({row_args});",
                "  else",
                f"    {k.name}_kernel<1, false, {warp}>{cfg}({row_args});",
            ]

        # A warp per row when rows are plenty and a warp holds what a row needs: single-pass reductions of
        # any length (a stream of loads, no barrier per row), multi-pass rows a warp's registers cache.
        single_pass = info.max_level == 1 and k.root_level == "row"
        warp_cond = "" if single_pass else f" && cols <= 32 * 4 * {k.name}_RCACHE"
        launcher += [
            f"  if (rows >= 64 * static_cast<int64_t>(sm_count()){warp_cond}) {{",
            "    const int64_t wblocks =",
            "        std::min<int64_t>((rows + 7) / 8, static_cast<int64_t>(sm_count()) * 8);",
            *indent(launches("true", "256", "wblocks", "32"), 2),
            "    STITCH_LAUNCH_CHECK();",
            "    return;",
            "  }",
            "  const int64_t blocks = std::min<int64_t>(rows, static_cast<int64_t>(sm_count()) * 32);",
            *launches("false", "threads", "blocks", "threads"),
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
        return "\n".join([*main, "", *split_code, "", *launcher])

    def row_split(
        self,
        info: KernelInfo,
        element_pass: Callable[..., list[str]],
        reduce_block: Callable[[int, dict[str, str]], list[str]],
        finalize: Callable[[Scope, int, dict[str, str]], list[str]],
        row_section: Callable[[Scope, int], None],
        bases: Callable[[], list[str]],
        scalar: Callable[[Any], str],
        row_load: Callable[[str], str],
    ) -> list[str]:
        """Few long rows: stage 1 reduces chunks of each row in separate blocks, stage 2 combines them."""
        k = info.kernel
        reds = [r for r in info.reductions if r.level == 1]
        accs = {r.op.out: acc_type(r.op.fn, self.variant.acc, default_double=True) for r in reds}
        structs = (
            [f"struct {k.name}_part {{"] + [f"  {accs[r.op.out]} a{j};" for j, r in enumerate(reds)] + ["};"]
        )
        chunk_scope = Scope(self.g, info.ops, scalar, row_load)
        row_section(chunk_scope, 0)
        stage1_body = [
            "const int64_t r = blockIdx.y;",
            "const int64_t s = blockIdx.x;",
            "const int64_t chunk = ((cols + splits - 1) / splits + 3) / 4 * 4;",
            "const int64_t c_lo = s * chunk;",
            "const int64_t c_hi = std::min<int64_t>(cols, c_lo + chunk);",
            *bases(),
            *chunk_scope.lines,
            *element_pass(chunk_scope, 1, "c_lo", "c_hi", accs),
            *reduce_block(1, accs),
            "if (threadIdx.x == 0) {",
            f"  {k.name}_part p;",
            *[f"  p.a{j} = a_{local_var(r.op.out)};" for j, r in enumerate(reds)],
            "  parts[r * splits + s] = p;",
            "}",
        ]
        params = self.kernel_params(info, ["const int64_t rows", "const int64_t cols"])
        stage1 = [
            *structs,
            "",
            "template <int VEC>",
            f"__global__ void __launch_bounds__(1024) {k.name}_stage1(",
            "    "
            + ",\n    ".join([*params, f"{k.name}_part* __restrict__ parts", "const int64_t splits"])
            + ") {",
            "  __shared__ __align__(16) unsigned char smem[512];",
            *indent(BLOCK_GROUP, 2),
            *indent(self.scalar_setup(info), 2),
            *indent(stage1_body, 2),
            "}",
        ]
        final_scope = Scope(self.g, info.ops, scalar, row_load)
        row_section(final_scope, 0)
        head = list(final_scope.lines)
        final_scope.lines = []
        gather = []
        for j, r in enumerate(reds):
            name = "a_" + local_var(r.op.out)
            acc = accs[r.op.out]
            gather += [
                f"{acc} {name} = {acc_init(r.op.fn, acc)};",
                f"for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) "
                f"{name} = {acc_combine(r.op.fn, name, f'parts[r * splits + s].a{j}')};",
            ]
        fin = finalize(final_scope, 1, accs)
        row_section(final_scope, 1)
        root = final_scope.need(k.root)
        stage2_body = [
            "const int64_t r = blockIdx.x;",
            *bases(),
            *head,
            *gather,
            *reduce_block(1, accs),
            *fin,
            *final_scope.lines,
            f"if (threadIdx.x == 0) out[r] = {root};",
        ]
        stage2 = [
            f"__global__ void __launch_bounds__(256) {k.name}_stage2(",
            "    "
            + ",\n    ".join([*params, f"const {k.name}_part* __restrict__ parts", "const int64_t splits"])
            + ") {",
            "  __shared__ __align__(16) unsigned char smem[512];",
            *indent(BLOCK_GROUP, 2),
            *indent(self.scalar_setup(info), 2),
            *indent(stage2_body, 2),
            "}",
        ]
        host_params = [
            *[f"const {CTYPE[self.g.values[o.id].dtype]}* in{i}" for i, o in enumerate(info.operands)],
            f"{CTYPE[self.g.values[k.root].dtype]}* out",
            f"const {k.name}_descs& D",
            "int64_t rows",
            "int64_t cols",
            *[f"float s{i}" for i in range(len(info.scalars))],
            "int64_t splits",
            "int threads",
            "bool vec4",
            "cudaStream_t stream",
        ]
        args = self.call_args(info, ["rows", "cols"])
        joined = ", ".join(args)
        host = [
            f"static void {k.name}_split(",
            "    " + ",\n    ".join(host_params) + ") {",
            f"  stitch::Scratch scratch(static_cast<size_t>(rows * splits) * sizeof({k.name}_part), stream);",
            f"  auto* parts = static_cast<{k.name}_part*>(scratch.ptr);",
            "  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(rows));",
            "  if (vec4)",
            f"    {k.name}_stage1<4><<<grid, threads, 0, stream>>>({', '.join(args)}, parts, splits);",
            "  else",
            f"    {k.name}_stage1<1><<<grid, threads, 0, stream>>>({', '.join(args)}, parts, splits);",
            "  STITCH_LAUNCH_CHECK();",
            f"  {k.name}_stage2<<<static_cast<unsigned>(rows), 256, 0, stream>>>({joined}, parts, splits);",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
        return [*stage1, "", *stage2, "", *host]

    def row_columns(self, info: KernelInfo) -> str:
        """Reductions over leading/middle dims: tiles of adjacent outputs, the reduced extent across warps."""
        return column_kernel(self, info)

    # ---- pooling -------------------------------------------------------------------------------------------
    def pool(self, info: KernelInfo) -> str:
        from stitchcuda.coder.synth.cpu import CpuKernels

        # The window arithmetic is the CPU kernel's, run with one thread per output element.
        # Index arithmetic in I: 32-bit wherever the input and the output have fewer than 2^31 elements (the
        # window's divisions and multiplies in 64 bits made pooling compute-bound).
        body = [
            line.replace("int64_t", "I")
            for line in CpuKernels(self.p, self.variant).pool_body(info, desc="D.d")
        ]
        k = info.kernel
        pool = k.pool
        assert pool is not None
        nd = pool.attrs["nd"]
        dims = ["d", "h", "w"][3 - nd :]
        names = [f"I{d.upper()}" for d in dims] + [f"O{d.upper()}" for d in dims]
        sizes = [f"const int64_t {n}_" for n in names]
        params = self.kernel_params(info, ["const int64_t total_", *sizes])
        block = self.block
        kernel = [
            *self.desc_struct(info),
            "",
            f"// {k.name}: {pool.fn} over {', '.join(k.origins)}; one thread per output element.",
            "template <typename I>",
            f"__global__ void __launch_bounds__({block}) {k.name}_kernel(",
            "    " + ",\n    ".join(params) + ") {",
            *indent(self.scalar_setup(info), 2),
            *[f"  const I {n} = static_cast<I>({n}_);" for n in ["total", *names]],
            "  for (I o = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;",
            "       o += static_cast<I>(gridDim.x) * blockDim.x) {",
            *indent(body, 4),
            "  }",
            "}",
        ]
        lsizes = [f"int64_t I{d.upper()}" for d in dims] + [f"int64_t O{d.upper()}" for d in dims]
        csizes = [f"I{d.upper()}" for d in dims] + [f"O{d.upper()}" for d in dims]
        pool_args = ", ".join(self.call_args(info, ["total", *csizes]))
        launcher = [
            f"static void {k.name}_launch(",
            "    " + ",\n    ".join(self.launcher_params(info, ["int64_t total", *lsizes])) + ") {",
            *indent(self.desc_fill(info), 2),
            "  if (total == 0) return;",
            "  cudaStream_t stream = stitch::current_stream();",
            "  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>("
            f"(total + {block - 1}) / {block}, "
            f"static_cast<int64_t>(sm_count()) * {max(2048 // block, 1)}));",
            # The input's elements: the output's, each window's plane grown from O to I.
            "  const int64_t in_numel = total / std::max<int64_t>(1, "
            + " * ".join(f"O{d.upper()}" for d in dims)
            + ") * "
            + " * ".join(f"I{d.upper()}" for d in dims)
            + ";",
            # 2^30: o plus the grid's stride must not wrap either.
            "  if (total < (int64_t(1) << 30) && in_numel < (int64_t(1) << 31))",
            f"    {k.name}_kernel<int32_t><<<blocks, {block}, 0, stream>>>({pool_args});",
            "  else",
            f"    {k.name}_kernel<int64_t><<<blocks, {block}, 0, stream>>>({pool_args});",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
        return "\n".join([*kernel, "", *launcher])

    # ---- a pointwise kernel as the epilogue of a GEMM's or convolution's store -------------------------
    def library_epilogue(self, info: KernelInfo) -> str:
        """The kernel's expression as a functor the own GEMM or convolution kernels apply to each output
        element in their store (`epi(v, i)`: v the element, bias included, i its flat index; libops,
        convolution.py), and a launcher running that op with it. Its output is read as v, never loaded."""
        k = info.kernel
        lib = k.epilogue_of
        assert lib is not None
        general = info.general
        operand = flat_load(info)
        scope = Scope(self.g, info.ops, self.scalar_fn(info), lambda x: "v" if x == lib.out else operand(x))
        value = scope.need(k.root)
        row = (
            [
                "const I r = i / static_cast<I>(cols);",
                "const I c = i - r * static_cast<I>(cols);",
                *self.row_bases(info),
                *self.col_strides(info),
            ]
            if general
            else []
        )
        fields = [f"const {CTYPE[self.g.values[o.id].dtype]}* in{i};" for i, o in enumerate(info.operands)]
        fields += [f"{k.name}_descs D;", "int64_t cols;", *(f"float s{i};" for i in range(len(info.scalars)))]
        # A strided or broadcast operand's offset is a loop of divisions: inlined into each of the 32-64
        # stores a thread makes, it doubled nvcc's time (level-2 problem 5: 10.6 s -> 22.4 s; called, 8.4 s).
        inline = "__noinline__" if general else "__forceinline__"
        functor = [
            *self.desc_struct(info),
            "",
            f"// {k.name}: the epilogue of {lib.origin or lib.fn}'s store, over {', '.join(k.origins)}",
            f"struct {k.name}_epi {{",
            *indent(fields, 2),
            "  template <typename I>",
            f"  __device__ {inline} float operator()(float v, I i) const {{",
            *indent([*self.scalar_setup(info), *row, *scope.lines, f"return {value};"], 4),
            "  }",
            "};",
        ]
        params = self.launcher_params(info, ["int64_t n", "int64_t cols"])
        lib_params = ["const float* lx", "const float* lw", "const float* lb", "const int64_t* geom"]
        if lib.fn in convolution.CONV_FNS:
            with_ = "stitch_conv_tail" if self.variant.epilogue == "auto" else "stitch_conv_with"
            run = f"{with_}<{str(lib.fn.startswith('conv_transpose')).lower()}>"
        else:
            run = "stitch_gemm_with"
        setup = [f"e.in{i} = in{i};" for i in range(len(info.operands))]
        setup += [f"e.s{i} = s{i};" for i in range(len(info.scalars))]
        launcher = [
            f"static void {k.name}_epilogue_launch(",
            "    " + ",\n    ".join([*lib_params, *params]) + ") {",
            f"  {k.name}_epi e{{}};",
            *indent(setup, 2),
            f"  for (int j = 0; j < {len(general)}; ++j) e.D.d[j] = descs[j];",
            "  e.cols = cols;",
            "  (void)n;",
            f"  {run}(lx, lw, lb, out, geom, e);",
            "}",
        ]
        return "\n".join([*functor, "", *launcher])

    def launch(self, info: KernelInfo, host: Host) -> list[str]:
        k = info.kernel
        if k.epilogue_of is not None:
            source = self.library_epilogue(info)
        elif k.kind == "pointwise":
            source = self.pointwise(info)
        elif k.kind == "row":
            source = self.row(info)
        else:
            source = self.pool(info)
        return launch_lines(info, host, backend="cuda", entry=self.bodies.add(k.name, source))


KERNELS_FILE = "kernels.cu"
HOST_FILE = "forward.cpp"

# Declared in both translation units, defined in the host one: the kernels' file reaches PyTorch's current
# stream, its caching allocator and its error type only through these, so it includes no torch header.
BRIDGE = r"""
namespace stitch {
cudaStream_t current_stream();
[[noreturn]] void cuda_fail(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void check_fail(const char* what, const char* file, int line);
void* scratch_alloc(size_t bytes, cudaStream_t stream);
void scratch_free(void* ptr);
// Stream-ordered scratch memory from PyTorch's caching allocator, given back at the end of the scope.
struct Scratch {
  void* ptr;
  Scratch(size_t bytes, cudaStream_t stream) : ptr(scratch_alloc(bytes, stream)) {}
  ~Scratch() { scratch_free(ptr); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};
}  // namespace stitch
#define STITCH_CUDA_CHECK(expr)                                              \
  do {                                                                       \
    const cudaError_t stitch_err_ = (expr);                                  \
    if (stitch_err_ != cudaSuccess) stitch::cuda_fail(stitch_err_, #expr, __FILE__, __LINE__); \
  } while (0)
#define STITCH_LAUNCH_CHECK() STITCH_CUDA_CHECK(cudaGetLastError())
#define STITCH_CHECK(cond, what) \
  do {                           \
    if (!(cond)) stitch::check_fail(what, __FILE__, __LINE__); \
  } while (0)
"""

BRIDGE_DEFINITIONS = r"""
namespace stitch {
cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
void cuda_fail(cudaError_t err, const char* what, const char* file, int line) {
  TORCH_CHECK(false, "CUDA error: ", cudaGetErrorString(err), " in ", what, " (", file, ":", line, ")");
}
void check_fail(const char* what, const char* file, int line) {
  TORCH_CHECK(false, what, " (", file, ":", line, ")");
}
void* scratch_alloc(size_t bytes, cudaStream_t stream) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
}
void scratch_free(void* ptr) { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }
}  // namespace stitch
"""

_LAUNCHER = re.compile(r"^static void (\w+_launch)\(([^)]*)\)\s*\{", re.MULTILINE)


def launcher_exports(device_source: str) -> tuple[list[str], list[str]]:
    """(definitions for the kernels' file, declarations for the host file) of every raw-pointer launcher.

    The launchers stay internal to the kernels' file (an unnamed namespace); each gets an exported
    forwarder of the same name in namespace stitch_launch, which the host file declares and calls.
    """
    definitions, declarations = [], []
    for m in _LAUNCHER.finditer(device_source):
        name, params = m.group(1), " ".join(m.group(2).split())
        args = [re.findall(r"\w+", p)[-1] for p in params.split(",") if p.strip()]
        definitions.append(f"void {name}({params}) {{ ::{name}({', '.join(args)}); }}")
        declarations.append(f"void {name}({params});")
    return definitions, declarations


# Above this many kernels the host code (checks and launches only: no loop of the model's runs on the CPU)
# is compiled at -O1: ResNet-101's 724 launches took the host compiler 73 s at -O3, 38 s at -O1 (2 cores).
MANY_KERNELS = 64


def host_optimization(kernels: int) -> list[str]:
    if kernels <= MANY_KERNELS:
        return []
    return [
        f"// {kernels} kernels: the launch code is compiled at -O1 (its optimization cost grows with size).",
        *GCC_O1,
    ]


def emit(
    program: Program, variant: Variant, ext_name: str
) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    """({file: source}, cflags, cuda_cflags, ldflags) for the CUDA extension.

    Three translation units, compiled in parallel: kernels.cu (kernels and raw-pointer launchers, no torch
    header, so nvcc takes seconds), forward.cpp (tensor checks, allocation, library calls and forward(),
    built by the host compiler with per-operator headers) and binding.cpp (the Python binding, glue
    compiled at -O1), where one .cu with torch/extension.h took nvcc a minute.
    """
    cutlass = variant.gemm == "custom" and variant.gemm_kernel in cutlass_gemm.KERNELS
    sm90 = cutlass and variant.gemm_kernel == "cutlass_sm90"
    if variant.gemm == "custom" and variant.epilogue == "fused":
        # A CUTLASS GEMM keeps its pointwise tail as a kernel: only the convolutions take theirs inside.
        fuse_library_epilogues(program, convolution.CONV_FNS | (frozenset() if cutlass else {"linear"}))
    elif variant.gemm == "custom" and variant.epilogue == "auto":
        # Convolutions take theirs where it costs least (convolution.stitch_conv_tail); GEMMs keep kernels.
        fuse_library_epilogues(program, convolution.CONV_FNS)
    kernels = CudaKernels(program, variant)
    host = Host(program, "cuda", kernels.launch, custom_library=variant.gemm == "custom")
    body = host.body()
    ops = [s.op for s in program.steps if s.op is not None]
    layouts = cutlass_gemm.layouts_of(program.graph, ops) if cutlass else set()
    if (layouts or (sm90 and cutlass_gemm.has_gemm(ops))) and "gemm_plain" in host.helpers:
        host.helpers.add("cutlass")
    # Hopper's convolution (cutlass_conv.py) where the program runs its own convolutions.
    if variant.gemm == "custom" and variant.conv_kernel == "cutlass_sm90" and "conv" in host.helpers:
        host.helpers.add("conv_sm90")
    ret, params = host.signature()
    forward = [f"{ret} forward(", "    " + ",\n    ".join(params) + ") {", *indent(body, 2), "}"]
    device_code = "\n\n".join(
        part
        for part in [
            DEVICE_HELPERS,
            # The library kernels first: a fused epilogue's launcher calls the convolution's.
            libops.device_source(host.helpers, "cuda"),
            "\n\n".join(kernels.bodies.functions),
            rnn.cuda_device() if "lstm" in host.helpers else "",
        ]
        if part.strip()
    )
    definitions, declarations = launcher_exports(device_code)
    device = "\n".join(
        [
            f"// {ext_name}: synthesized by StitchCUDA's built-in coder (CUDA backend), the kernels.",
            "// No torch header here: forward.cpp calls the launchers below on PyTorch's current stream.",
            f'#include "{HEADER_NAME}"',
            "",
            "#include <cuda_runtime.h>",
            *(["#include <mma.h>"] if "nvcuda::wmma" in device_code else []),
            # The variant mma=simt: the own GEMM and convolution kernels without tensor cores.
            *(["#define STITCH_SIMT_ONLY 1"] if variant.mma == "simt" else []),
            "",
            "#include <algorithm>",
            "#include <cstddef>",
            "#include <cstdint>",
            BRIDGE,
            "using namespace stitch;",
            "",
            *([cutlass_gemm.DECLARATION, ""] if "cutlass" in host.helpers else []),
            *([cutlass_conv.DECLARATION, ""] if "conv_sm90" in host.helpers else []),
            "namespace {",
            device_code,
            "",
            "}  // namespace",
            "",
            "namespace stitch_launch {",
            *definitions,
            "}  // namespace stitch_launch",
            "",
        ]
    )
    helpers = "\n".join(
        [
            libops.host_source(host.helpers, "cuda"),
            rnn.cuda_host(custom=host.custom) if "lstm" in host.helpers else "",
        ]
    )
    host_code = "\n".join([helpers, *forward])
    source = "\n".join(
        [
            f"// {ext_name}: synthesized by StitchCUDA's built-in coder (CUDA backend), the host code.",
            "// One extension, one entry point; forward() launches every kernel on the caller's stream.",
            *host_optimization(len(program.kernels)),
            f'#include "{HEADER_NAME}"',
            "",
            "#include <c10/cuda/CUDACachingAllocator.h>",
            "#include <c10/cuda/CUDAGuard.h>",
            "#include <c10/cuda/CUDAStream.h>",
            "#include <cuda_runtime_api.h>",
            "#include <ATen/core/Tensor.h>",
            "",
            *operator_includes(host_code),
            "",
            "#include <algorithm>",
            "#include <tuple>",
            "#include <vector>",
            BRIDGE,
            BRIDGE_DEFINITIONS,
            "namespace stitch_launch {",
            *declarations,
            "}  // namespace stitch_launch",
            "",
            "using namespace stitch;",
            "using namespace stitch_launch;",
            "",
            "namespace {",
            helpers,
            "}  // namespace",
            "",
            *forward,
            "",
        ]
    )
    binding = binding_source(ext_name, ret, params, "fused CUDA kernels")
    # In name order, as the Coder's answer parser lists an answer's sources (the same program either way).
    files = {BINDING_FILE: binding, HOST_FILE: source, KERNELS_FILE: device}
    if "cutlass" in host.helpers:
        files[cutlass_gemm.FILE] = cutlass_gemm.source(layouts, BRIDGE, HEADER_NAME, sm90=sm90)
    if "conv_sm90" in host.helpers:
        files[cutlass_conv.FILE] = cutlass_conv.source(BRIDGE, HEADER_NAME)
    files = dict(sorted(files.items()))
    sm90_unit = ("cutlass" in host.helpers and sm90) or "conv_sm90" in host.helpers
    extra = list(cutlass_gemm.SM90_CUDA_CFLAGS) if sm90_unit else []
    return files, list(CFLAGS), [*CUDA_CFLAGS, *extra], list(LDFLAGS)


__all__ = ["emit", "tensor_var"]
