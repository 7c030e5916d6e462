"""CUDA row kernels for few long rows whose result is a whole-row pass or needs dependent reductions
(x / ||x||, a softmax over everything): each reduction level is a grid-wide two-stage tree (blocks reduce
chunks of a row into partial accumulators, one block per row combines them in order), the finished row
values wait in scratch memory, and a last grid-wide pass writes the output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stitchcuda.coder.synth.codegen import (
    CTYPE,
    KernelInfo,
    Reduction,
    Scope,
    acc_combine,
    acc_final,
    acc_init,
    acc_type,
    local_var,
)
from stitchcuda.coder.synth.cpu import indent
from stitchcuda.coder.synth.cuda_patterns import moments_finish

# The row helpers' names for a kernel whose whole block works on one row.
BLOCK_GROUP = [
    "constexpr bool WARP = false;",
    "const int tid = threadIdx.x;",
    "const int nthr = blockDim.x;",
    "(void)tid; (void)nthr;",
]

if TYPE_CHECKING:
    from stitchcuda.coder.synth.cuda import CudaKernels


def split_levels(
    ks: CudaKernels,
    info: KernelInfo,
    element_pass: Callable[..., list[str]],
    reduce_block: Callable[[int, dict[str, str]], list[str]],
    row_section: Callable[[Scope, int], None],
    bases: Callable[[], list[str]],
    scalar: Callable[[Any], str],
    row_load: Callable[[str], str],
    element_load: Callable[[bool], Callable[[str], str]],
    used: set[int],
    moments: tuple[tuple[Reduction, Reduction], Callable[[Scope, str, str, bool], list[str]]] | None = None,
) -> list[str]:
    """With `moments` (a mean and a variance of levels 1 and 2, and the code summing x and x^2), level 1's
    passes compute both and level 2 has none."""
    k = info.kernel
    g = ks.g
    name = k.name
    levels = [lv for lv in range(1, info.max_level + 1) if not (moments and lv == 2)]
    # Double sums across the chunks and the combine: a sum over 10^9 elements keeps fp32 accuracy.
    accs = {r.op.out: acc_type(r.op.fn, ks.variant.acc, default_double=True) for r in info.reductions}
    slot = {red.op.out: j for j, red in enumerate(info.reductions)}
    structs = [
        f"struct {name}_rowv {{",
        *[f"  {CTYPE[g.values[red.op.out].dtype]} v{j};" for j, red in enumerate(info.reductions)],
        "};",
    ]
    for level in levels:
        reds = [
            red for red in info.reductions if red.level in ((1, 2) if moments and level == 1 else (level,))
        ]
        structs += [
            f"struct {name}_part{level} {{",
            *[f"  {accs[red.op.out]} a{slot[red.op.out]};" for red in reds],
            "};",
        ]

    def restore(scope: Scope, upto: int) -> list[str]:
        """The row's values of levels 0..upto, the reductions read back from scratch."""
        row_section(scope, 0)
        lines, scope.lines = scope.lines, []
        for level in range(1, upto + 1):
            for red in info.reductions:
                if red.level == level:
                    value = local_var(red.op.out)
                    ctype = CTYPE[g.values[red.op.out].dtype]
                    lines.append(f"const {ctype} {value} = rowv[r].v{slot[red.op.out]};")
                    scope.names[red.op.out] = value
            row_section(scope, level)
            lines += scope.lines
            scope.lines = []
        return lines

    chunk = [
        "const int64_t r = blockIdx.y;",
        "const int64_t s = blockIdx.x;",
        "const int64_t chunk = ((cols + splits - 1) / splits + 3) / 4 * 4;",
        "const int64_t c_lo = s * chunk;",
        "const int64_t c_hi = std::min<int64_t>(cols, c_lo + chunk);",
        "(void)c_lo; (void)c_hi;",
    ]
    params = ks.kernel_params(info, ["const int64_t rows", "const int64_t cols"])
    kernels: list[str] = []

    def sum_all(names: list[str]) -> list[str]:
        return [
            f"{a} = group_allreduce<WARP, double>({a}, [](double x, double y) {{ return x + y; }}, "
            "reinterpret_cast<double*>(smem));"
            for a in names
        ]

    for level in levels:
        reds = [red for red in info.reductions if red.level == level]
        scope = Scope(g, info.ops, scalar, row_load)
        body = [*chunk, *bases(), *restore(scope, level - 1)]
        if moments and level == 1:
            (r1, r2), accumulate = moments
            body += [*accumulate(scope, "c_lo", "c_hi", False), *sum_all(["m1", "m2"])]
            stores = [f"  p.a{slot[r1.op.out]} = m1;", f"  p.a{slot[r2.op.out]} = m2;"]
        else:
            body += element_pass(scope, level, "c_lo", "c_hi", accs)
            body += reduce_block(level, accs)
            stores = [f"  p.a{slot[red.op.out]} = a_{local_var(red.op.out)};" for red in reds]
        body += [
            "if (threadIdx.x == 0) {",
            f"  {name}_part{level} p;",
            *stores,
            "  parts[r * splits + s] = p;",
            "}",
        ]
        kernels += [
            "template <int VEC>",
            f"__global__ void __launch_bounds__(1024) {name}_pass{level}(",
            "    "
            + ",\n    ".join(
                [
                    *params,
                    f"const {name}_rowv* __restrict__ rowv",
                    f"{name}_part{level}* __restrict__ parts",
                    "const int64_t splits",
                ]
            )
            + ") {",
            "  __shared__ __align__(16) unsigned char smem[512];",
            *indent(BLOCK_GROUP, 2),
            "  (void)rowv;",
            *indent(ks.scalar_setup(info), 2),
            *indent(body, 2),
            "}",
            "",
        ]
        if moments and level == 1:
            (r1, r2), _ = moments
            j1, j2 = slot[r1.op.out], slot[r2.op.out]
            combine = [
                "double m1 = 0.0, m2 = 0.0;",
                "for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) {",
                f"  m1 += parts[r * splits + s].a{j1};",
                f"  m2 += parts[r * splits + s].a{j2};",
                "}",
                *sum_all(["m1", "m2"]),
                "if (threadIdx.x == 0) {",
                *indent(moments_finish("mean_", "var_f", "m1", "m2"), 2),
                f"  rowv[r].v{j1} = mean_;",
                f"  rowv[r].v{j2} = var_f;",
                "}",
            ]
        else:
            combine = []
        gather = []
        for red in reds:
            acc, a = accs[red.op.out], "a_" + local_var(red.op.out)
            gather += [
                f"{acc} {a} = {acc_init(red.op.fn, acc)};",
                f"for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) "
                f"{a} = {acc_combine(red.op.fn, a, f'parts[r * splits + s].a{slot[red.op.out]}')};",
            ]
        write = [
            f"  rowv[r].v{slot[red.op.out]} = "
            f"{acc_final(red.op.fn, accs[red.op.out], 'a_' + local_var(red.op.out), 'cols')};"
            for red in reds
        ]
        kernels += [
            f"__global__ void __launch_bounds__(256) {name}_combine{level}(",
            "    "
            + ",\n    ".join(
                [
                    *params,
                    f"{name}_rowv* __restrict__ rowv",
                    f"const {name}_part{level}* __restrict__ parts",
                    "const int64_t splits",
                ]
            )
            + ") {",
            "  __shared__ __align__(16) unsigned char smem[512];",
            *indent(BLOCK_GROUP, 2),
            "  const int64_t r = blockIdx.x;",
            *indent(
                combine or [*gather, *reduce_block(level, accs), "if (threadIdx.x == 0) {", *write, "}"], 2
            ),
            "}",
            "",
        ]
    kernels += final_kernel(ks, info, restore, bases, scalar, row_load, element_load, used, chunk, params)
    host = host_function(ks, info, levels)
    return [*structs, "", *kernels, "", *host]


def final_kernel(
    ks: CudaKernels,
    info: KernelInfo,
    restore: Callable[[Scope, int], list[str]],
    bases: Callable[[], list[str]],
    scalar: Callable[[Any], str],
    row_load: Callable[[str], str],
    element_load: Callable[[bool], Callable[[str], str]],
    used: set[int],
    chunk: list[str],
    params: list[str],
) -> list[str]:
    k = info.kernel
    g = ks.g
    name = k.name
    scope = Scope(g, info.ops, scalar, row_load)
    if k.root_level == "row":
        restored = restore(scope, info.max_level)
        value = scope.need(k.root)
        return [
            f"__global__ void __launch_bounds__(256) {name}_store(",
            "    " + ",\n    ".join([*params, f"const {name}_rowv* __restrict__ rowv"]) + ") {",
            *indent(ks.scalar_setup(info), 2),
            "  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;",
            "  if (r >= rows) return;",
            *indent([*bases(), *restored, *scope.lines, f"out[r] = {value};"], 2),
            "}",
        ]
    restored = restore(scope, info.max_level)

    def element(vector: bool) -> tuple[list[str], str]:
        inner = Scope(g, info.ops, scalar, element_load(vector), parent=scope)
        value = inner.need(k.root)
        return inner.lines, value

    used.clear()
    vec_lines, vec_value = element(True)
    vec_loads = [
        f"const float4 f{i} = reinterpret_cast<const float4*>(in{i} + r * cols)[c0 / 4];"
        for i in sorted(used)
    ]
    lines, value = element(False)
    root_ctype = CTYPE[g.values[k.root].dtype]
    body = [
        *chunk,
        *bases(),
        *restored,
        "if constexpr (VEC == 4) {",
        "  for (int64_t c0 = c_lo + threadIdx.x * 4; c0 < c_hi; c0 += blockDim.x * 4) {",
        *indent(vec_loads, 4),
        f"    {root_ctype} res[4];",
        "#pragma unroll",
        "    for (int l = 0; l < 4; ++l) {",
        "      const int64_t c = c0 + l;",
        "      (void)c;",
        *indent([*vec_lines, f"res[l] = {vec_value};"], 6),
        "    }",
        "    reinterpret_cast<float4*>(out + r * cols)[c0 / 4] =",
        "        make_float4(res[0], res[1], res[2], res[3]);",
        "  }",
        "} else {",
        "  for (int64_t c = c_lo + threadIdx.x; c < c_hi; c += blockDim.x) {",
        "    const int l = 0;",
        "    (void)l;",
        *indent([*lines, f"out[r * cols + c] = {value};"], 4),
        "  }",
        "}",
    ]
    return [
        "template <int VEC>",
        f"__global__ void __launch_bounds__(1024) {name}_store(",
        "    "
        + ",\n    ".join([*params, f"const {name}_rowv* __restrict__ rowv", "const int64_t splits"])
        + ") {",
        *indent(ks.scalar_setup(info), 2),
        *indent(body, 2),
        "}",
    ]


def host_function(ks: CudaKernels, info: KernelInfo, levels: list[int]) -> list[str]:
    k = info.kernel
    g = ks.g
    name = k.name
    host_params = [
        *[f"const {CTYPE[g.values[o.id].dtype]}* in{i}" for i, o in enumerate(info.operands)],
        f"{CTYPE[g.values[k.root].dtype]}* out",
        f"const {name}_descs& D",
        "int64_t rows",
        "int64_t cols",
        *[f"float s{i}" for i in range(len(info.scalars))],
        "int64_t splits",
        "int threads",
        "bool vec4",
        "cudaStream_t stream",
    ]
    args = ", ".join(ks.call_args(info, ["rows", "cols"]))
    vec_ok = ks.vectorizable(info)

    def grid_launch(kernel: str, extra: str) -> list[str]:
        if not vec_ok:
            return [f"{kernel}<1><<<grid, threads, 0, stream>>>({args}, {extra});"]
        return [
            "if (vec4)",
            f"  {kernel}<4><<<grid, threads, 0, stream>>>({args}, {extra});",
            "else",
            f"  {kernel}<1><<<grid, threads, 0, stream>>>({args}, {extra});",
        ]

    body = [
        f"stitch::Scratch row_scratch(static_cast<size_t>(rows) * sizeof({name}_rowv), stream);",
        f"auto* rowv = static_cast<{name}_rowv*>(row_scratch.ptr);",
        "const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(rows));",
    ]
    for level in levels:
        part = f"{name}_part{level}"
        body += [
            "{",
            f"  stitch::Scratch scratch(static_cast<size_t>(rows * splits) * sizeof({part}), stream);",
            f"  auto* parts = static_cast<{part}*>(scratch.ptr);",
            *indent(grid_launch(f"{name}_pass{level}", "rowv, parts, splits"), 2),
            "  STITCH_LAUNCH_CHECK();",
            f"  {name}_combine{level}<<<static_cast<unsigned>(rows), 256, 0, stream>>>(",
            f"      {args}, rowv, parts, splits);",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
    if k.root_level == "row":
        body.append(
            f"{name}_store<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>({args}, rowv);"
        )
    else:
        body += grid_launch(f"{name}_store", "rowv, splits")
    body.append("STITCH_LAUNCH_CHECK();")
    return [
        f"static void {name}_levels(",
        "    " + ",\n    ".join(host_params) + ") {",
        *indent(body, 2),
        "}",
    ]
