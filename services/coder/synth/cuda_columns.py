"""CUDA reductions over leading or middle dims (the reduced positions are strided in memory): each block
covers a tile of 32 adjacent output positions and splits the reduced extent across its warps, so every
load of a warp reads 32 adjacent elements; with few outputs, a second grid dimension splits the reduced
extent across blocks and a combine kernel finishes each output from their partial accumulators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stitchcuda.coder.synth.codegen import (
    CTYPE,
    KernelInfo,
    Scope,
    acc_combine,
    acc_final,
    acc_init,
    acc_type,
    acc_update,
    local_var,
)
from stitchcuda.coder.synth.cpu import indent

if TYPE_CHECKING:
    from stitchcuda.coder.synth.cuda import CudaKernels

# Output positions per block (one warp's width: a warp's load covers 32 adjacent positions).
TILE = 32
# Most warps per block along the reduced extent; the shared buffer holds one accumulator per thread.
MAX_WARPS = 16
# Elements of a column each thread keeps in registers between passes (columns up to CACHE * MAX_WARPS),
# for at most MAX_CACHED operands.
CACHE = 16
MAX_CACHED = 3
SMEM_BYTES = TILE * MAX_WARPS * 16


def column_kernel(ks: CudaKernels, info: KernelInfo) -> str:
    k = info.kernel
    g = ks.g
    index = {o.id: i for i, o in enumerate(info.operands)}
    scalar = ks.scalar_fn(info)

    def col_off(i: int, c: str) -> str:
        # SIMPLE: every strided operand has at most one column segment of unit divisor (one reduced dim, or
        # reduced dims that merge), so a position's offset is one multiply; the host checks it per launch.
        return f"(SIMPLE ? {c} * cs{i} : stitch::col_off<int64_t>(D.d[{ks.slot(info, i)}], {c}))"

    def element_load(ident: str) -> str:
        i = index[ident]
        if info.operands[i].access == "scalar":
            return f"z{i}"
        return f"in{i}[b{i} + {col_off(i, 'c')}]"

    def row_load(ident: str) -> str:
        i = index[ident]
        if info.operands[i].access == "scalar":
            return f"z{i}"
        return f"in{i}[b{i}]"

    # Sums and products accumulate in double (per thread, then across warps and blocks): a column of 10^6
    # positions stays within fp32 rounding of the exact result. Memory-bound, so the FP64 adds cost nothing.
    accs = {r.op.out: acc_type(r.op.fn, ks.variant.acc, default_double=True) for r in info.reductions}
    setup = [
        "const int tx = threadIdx.x & 31;",
        "const int ty = threadIdx.x >> 5;",
        "const int ny = blockDim.x >> 5;",
        f"const int64_t r = static_cast<int64_t>(blockIdx.x) * {TILE} + tx;",
        "const bool live = r < rows;",
        # Lanes past the last output read a valid position and join every barrier; they store nothing.
        "const int64_t rr = live ? r : rows - 1;",
        "const int64_t chunk = (cols + gridDim.y - 1) / gridDim.y;",
        "const int64_t c_lo = static_cast<int64_t>(blockIdx.y) * chunk;",
        "const int64_t c_hi = std::min<int64_t>(cols, c_lo + chunk);",
    ]
    for i in info.general:
        slot = ks.slot(info, i)
        setup += [
            f"const int64_t b{i} = stitch::row_off<int64_t>(D.d[{slot}], rr);",
            f"const int64_t cs{i} = D.d[{slot}].nc ? D.d[{slot}].cstr[0] : 0;",
            f"(void)cs{i};",
        ]
    full = k.root_level == "full"
    if full:
        setup += [
            "const int64_t ob = stitch::row_off<int64_t>(odesc, rr);",
            "const int64_t ocs = odesc.nc ? odesc.cstr[0] : 0;",
        ]

    def row_section(scope: Scope, level: int) -> None:
        for op in k.ops:
            if op.kind == "ew" and info.row_level.get(op.out) and info.levels.get(op.out) == level:
                scope.need(op.out)

    def combine_warps(level: int) -> list[str]:
        """Every thread of a column ends with the column's combined accumulator (same order everywhere)."""
        lines = []
        for red in info.reductions:
            if red.level != level:
                continue
            name, acc = "a_" + local_var(red.op.out), accs[red.op.out]
            lines += [
                "{",
                f"  {acc}* sh = reinterpret_cast<{acc}*>(smem);",
                "  __syncthreads();",
                f"  sh[threadIdx.x] = {name};",
                "  __syncthreads();",
                f"  {name} = sh[tx];",
                f"  for (int w = 1; w < ny; ++w) {name} = {acc_combine(red.op.fn, name, 'sh[w * 32 + tx]')};",
                "}",
            ]
        return lines

    def finalize(scope: Scope, level: int) -> list[str]:
        lines = []
        for red in info.reductions:
            if red.level != level:
                continue
            name = local_var(red.op.out)
            ctype = CTYPE[g.values[red.op.out].dtype]
            lines.append(
                f"const {ctype} {name} = {acc_final(red.op.fn, accs[red.op.out], 'a_' + name, 'cols')};"
            )
            scope.names[red.op.out] = name
        return lines

    reds1 = [red for red in info.reductions if red.level == 1]
    split_ok = k.root_level == "row" and info.max_level == 1 and ks.variant.split != "off"
    # Several passes over each column (a softmax, a norm's division): short columns stay in registers.
    multi = info.max_level > 1 or full

    def emit_body(cache: bool) -> tuple[list[str], set[int]]:
        """The kernel's body; with `cache`, also the operands the CACHED form keeps in registers."""
        filled: set[int] = set()

        def loop(build: Callable[[Callable[[str], str]], list[str]], begin: str, end: str) -> list[str]:
            plain = [
                # Unrolled: several independent loads of each thread in flight.
                "#pragma unroll 8",
                f"for (int64_t c = {begin} + ty; c < {end}; c += ny) {{",
                *indent(build(element_load), 2),
                "}",
            ]
            if not cache:
                return plain
            used: set[int] = set()

            def cache_load(ident: str) -> str:
                i = index[ident]
                if info.operands[i].access == "scalar":
                    return f"z{i}"
                used.add(i)
                return f"cache{i}[j]"

            lines = build(cache_load)
            fills = [f"cache{i}[j] = in{i}[b{i} + {col_off(i, 'c')}];" for i in sorted(used - filled)]
            filled.update(used)
            return [
                "if constexpr (CACHED) {",
                "#pragma unroll",
                f"  for (int j = 0; j < {CACHE}; ++j) {{",
                "    const int64_t c = ty + static_cast<int64_t>(j) * ny;",
                "    if (c < cols) {",
                *indent([*fills, *lines], 6),
                "    }",
                "  }",
                "} else {",
                *indent(plain, 2),
                "}",
            ]

        row_scope = Scope(g, info.ops, scalar, row_load)
        body = list(setup)
        row_section(row_scope, 0)
        body += row_scope.lines
        for level in range(1, info.max_level + 1):
            row_scope.lines = []
            reds = [red for red in info.reductions if red.level == level]

            def accumulate(load: Callable[[str], str], reds: list[Any] = reds) -> list[str]:
                sc = Scope(g, info.ops, scalar, load, parent=row_scope)
                ups = [
                    acc_update(
                        red.op.fn,
                        accs[red.op.out],
                        "a_" + local_var(red.op.out),
                        sc.need(red.op.args[0].id),
                        "c",
                    )
                    for red in reds
                ]
                return [*sc.lines, *ups]

            body += [
                f"{accs[red.op.out]} a_{local_var(red.op.out)} = {acc_init(red.op.fn, accs[red.op.out])};"
                for red in reds
            ]
            body += [*loop(accumulate, "c_lo", "c_hi"), *combine_warps(level)]
            if level == 1 and split_ok:
                body += [
                    "if (parts != nullptr) {",
                    "  if (ty == 0 && live) {",
                    f"    {k.name}_part p;",
                    *[f"    p.a{j} = a_{local_var(red.op.out)};" for j, red in enumerate(reds1)],
                    "    parts[static_cast<int64_t>(blockIdx.y) * rows + r] = p;",
                    "  }",
                    "  return;",
                    "}",
                ]
            body += finalize(row_scope, level)
            row_section(row_scope, level)
            body += row_scope.lines
        row_scope.lines = []
        if full:

            def store(load: Callable[[str], str]) -> list[str]:
                sc = Scope(g, info.ops, scalar, load, parent=row_scope)
                value = sc.need(k.root)
                target = "out[ob + (SIMPLE ? c * ocs : stitch::col_off<int64_t>(odesc, c))]"
                return [*sc.lines, f"if (live) {target} = {value};"]

            body += loop(store, "0", "cols")
        else:
            value = row_scope.need(k.root)
            body += [*row_scope.lines, f"if (ty == 0 && live) out[r] = {value};"]
        return body, filled

    body, filled = emit_body(multi)
    if len(filled) > MAX_CACHED:
        multi = False
        body, filled = emit_body(False)
    caches = [
        f"[[maybe_unused]] {CTYPE[g.values[info.operands[i].id].dtype]} cache{i}[{CACHE}];"
        for i in sorted(filled)
    ]
    body = [*caches, *body]

    extra = ["const int64_t rows", "const int64_t cols"] + (["const stitch::Desc odesc"] if full else [])
    part_param = [f"{k.name}_part* __restrict__ parts"] if split_ok else []
    params = ks.kernel_params(info, extra) + part_param
    structs = (
        [
            f"struct {k.name}_part {{",
            *[f"  {accs[red.op.out]} a{j};" for j, red in enumerate(reds1)],
            "};",
            "",
        ]
        if split_ok
        else []
    )
    kernel = [
        *ks.desc_struct(info),
        "",
        *structs,
        f"// {k.name}: reduction over leading/middle dims ({info.max_level} passes), {TILE} outputs a block,",
        f"// the reduced extent split across its warps: {', '.join(k.origins)}",
        "template <bool SIMPLE, bool CACHED>",
        f"__global__ void __launch_bounds__({TILE * MAX_WARPS}) {k.name}_kernel(",
        "    " + ",\n    ".join(params) + ") {",
        f"  __shared__ __align__(16) unsigned char smem[{SMEM_BYTES}];",
        *indent(ks.scalar_setup(info), 2),
        *indent(body, 2),
        "}",
    ]
    stage2 = combine_kernel(ks, info, accs, row_load, row_section) if split_ok else []

    general_simple = [
        f"(D.d[{j}].nc == 0 || (D.d[{j}].nc == 1 && D.d[{j}].cdiv[0] == 1 && D.d[{j}].cmod[0] == 0))"
        for j in range(len(info.general))
    ]
    if full:
        general_simple.append(
            "(odesc.nc == 0 || (odesc.nc == 1 && odesc.cdiv[0] == 1 && odesc.cmod[0] == 0))"
        )
    lextra = ["int64_t rows", "int64_t cols"] + (["stitch::Desc odesc"] if full else [])
    args = ks.call_args(info, ["rows", "cols"] + (["odesc"] if full else []))
    launch_args = ", ".join(args + (["parts"] if split_ok else []))
    launcher = [
        f"static void {k.name}_launch(",
        "    " + ",\n    ".join(ks.launcher_params(info, lextra)) + ") {",
        *indent(ks.desc_fill(info), 2),
        "  if (rows == 0) return;",
        "  cudaStream_t stream = stitch::current_stream();",
        f"  const bool simple = {' && '.join(general_simple) or 'true'};",
        # At least 16 positions per warp before adding warps, 8 warps a block; a cached column takes up to
        # MAX_WARPS warps of CACHE positions each.
        f"  const bool cached = {'true' if multi else 'false'} && cols <= {CACHE * MAX_WARPS};",
        f"  const int ny = cached ? pow2_at_least((cols + {CACHE - 1}) / {CACHE}, 1, {MAX_WARPS})",
        f"                        : pow2_at_least(cols / 16, 1, {MAX_WARPS // 2});",
        f"  const int64_t tiles = (rows + {TILE - 1}) / {TILE};",
        "  int64_t splits = 1;",
    ]
    if split_ok:
        launcher += [
            "  // Fewer warps than the GPU keeps resident: split the reduced extent across blocks too.",
            "  const int64_t resident = static_cast<int64_t>(sm_count()) * 64;",
            "  if (tiles * ny < resident / 2)",
            "    splits = std::max<int64_t>(",
            "        1, std::min<int64_t>({(resident + tiles * ny - 1) / (tiles * ny), cols / (16 * ny),",
            "                              int64_t(65535)}));",
        ]
    plain = ", ".join(args + (["nullptr"] if split_ok else []))
    launcher += [
        "  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));",
    ]
    if split_ok:
        launcher += [
            "  if (splits > 1) {",
            f"    const size_t bytes = static_cast<size_t>(rows * splits) * sizeof({k.name}_part);",
            "    stitch::Scratch scratch(bytes, stream);",
            f"    auto* parts = static_cast<{k.name}_part*>(scratch.ptr);",
            "    if (simple)",
            f"      {k.name}_kernel<true, false><<<grid, ny * 32, 0, stream>>>({launch_args});",
            "    else",
            f"      {k.name}_kernel<false, false><<<grid, ny * 32, 0, stream>>>({launch_args});",
            "    STITCH_LAUNCH_CHECK();",
            f"    {k.name}_combine<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>("
            + ", ".join(args)
            + ", parts, splits);",
            "    STITCH_LAUNCH_CHECK();",
            "    return;",
            "  }",
        ]
    cfg = f"<<<grid, ny * 32, 0, stream>>>({plain});"
    if multi:
        launcher += [
            "  if (cached && simple)",
            f"    {k.name}_kernel<true, true>{cfg}",
            "  else if (cached)",
            f"    {k.name}_kernel<false, true>{cfg}",
            "  else if (simple)",
        ]
    else:
        launcher.append("  if (simple)")
    launcher += [
        f"    {k.name}_kernel<true, false>{cfg}",
        "  else",
        f"    {k.name}_kernel<false, false>{cfg}",
        "  STITCH_LAUNCH_CHECK();",
    ]
    launcher.append("}")
    return "\n".join([*kernel, "", *stage2, "", *launcher])


def combine_kernel(
    ks: CudaKernels,
    info: KernelInfo,
    accs: dict[str, str],
    load: Callable[[str], str],
    section: Callable[[Scope, int], None],
) -> list[str]:
    """One thread per output: combines the splits' partial accumulators in order and writes the output."""
    k = info.kernel
    g = ks.g
    scalar = ks.scalar_fn(info)
    reds = [red for red in info.reductions if red.level == 1]
    scope = Scope(g, info.ops, scalar, load)
    lines = [
        "const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;",
        "if (r >= rows) return;",
        *[
            f"const int64_t b{i} = stitch::row_off<int64_t>(D.d[{ks.slot(info, i)}], r);"
            for i in info.general
        ],
    ]
    section(scope, 0)
    lines += scope.lines
    scope.lines = []
    for j, red in enumerate(reds):
        name, acc = "a_" + local_var(red.op.out), accs[red.op.out]
        lines += [
            f"{acc} {name} = parts[r].a{j};",
            f"for (int64_t s = 1; s < splits; ++s) "
            f"{name} = {acc_combine(red.op.fn, name, f'parts[s * rows + r].a{j}')};",
        ]
    for red in reds:
        name = local_var(red.op.out)
        ctype = CTYPE[g.values[red.op.out].dtype]
        lines.append(f"const {ctype} {name} = {acc_final(red.op.fn, accs[red.op.out], 'a_' + name, 'cols')};")
        scope.names[red.op.out] = name
    section(scope, 1)
    value = scope.need(k.root)
    lines += [*scope.lines, f"out[r] = {value};"]
    params = ks.kernel_params(info, ["const int64_t rows", "const int64_t cols"])
    return [
        f"__global__ void __launch_bounds__(256) {k.name}_combine(",
        "    "
        + ",\n    ".join([*params, f"const {k.name}_part* __restrict__ parts", "const int64_t splits"])
        + ") {",
        *indent(ks.scalar_setup(info), 2),
        *indent(lines, 2),
        "}",
    ]
