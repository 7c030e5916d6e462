"""The CPU back end: C++ kernels parallelized with at::parallel_for, inner loops left vectorizable."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from stitchcuda.coder.synth import libops, rnn
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
from stitchcuda.coder.synth.fusion import Kernel, Program
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.runtime import BINDING_FILE, HEADER_NAME, binding_source, operator_includes
from stitchcuda.coder.synth.variants import Variant

# -fno-trapping-math lets the vectorizer if-convert the branch-free math of stitch_runtime.h; it changes
# no result, only whether floating-point exception flags are raised.
CFLAGS = ["-O3", "-fno-trapping-math", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]


def param_name(param: str) -> str:
    """'const float* __restrict__ in0' -> 'in0'."""
    return param.rsplit(maxsplit=1)[-1].lstrip("*&")


def indent(lines: list[str], n: int) -> list[str]:
    pad = " " * n
    return [pad + line if line else line for line in lines]


class CpuKernels:
    def __init__(self, program: Program, variant: Variant) -> None:
        self.p = program
        self.g = program.graph
        self.variant = variant
        self.grain = int(variant.grain)
        self.bodies = KernelBodies()

    # ---- signatures ----------------------------------------------------------------------------------
    def params(self, info: KernelInfo, extra: list[str]) -> list[str]:
        k = info.kernel
        out = []
        for i, o in enumerate(info.operands):
            ctype = CTYPE[self.g.values[o.id].dtype]
            restrict = "" if o.id == k.inplace else " __restrict__"
            out.append(f"const {ctype}*{restrict} in{i}")
        root_ctype = CTYPE[self.g.values[k.root].dtype]
        out.append(f"{root_ctype}*{'' if k.inplace else ' __restrict__'} out")
        out.append("const stitch::Desc* __restrict__ desc")
        out.extend(extra)
        out.extend(f"float s{i}" for i in range(len(info.scalars)))
        return out

    def scalar_fn(self, info: KernelInfo) -> Callable[[Any], str]:
        keys = [key for _, key in info.scalars]

        def scalar(a: object) -> str:
            from stitchcuda.coder.synth.ir import Attr, Ref

            if isinstance(a, Attr):
                return f"s{keys.index('attr:' + a.path)}"
            if isinstance(a, Ref):
                return f"s{keys.index('host:' + a.id)}"
            raise Unsupported(f"scalar {a!r}")

        return scalar

    def operand_setup(self, info: KernelInfo) -> list[str]:
        lines = []
        for i, o in enumerate(info.operands):
            if o.access == "scalar":
                lines.append(f"const {CTYPE[self.g.values[o.id].dtype]} z{i} = in{i}[0];")
        return lines

    def desc_slot(self, info: KernelInfo, i: int) -> int:
        return info.general.index(i)

    # ---- pointwise -----------------------------------------------------------------------------------
    def pointwise(self, info: KernelInfo) -> str:
        k = info.kernel
        general = info.general
        scope = Scope(self.g, info.ops, self.scalar_fn(info), flat_load(info))
        result = scope.need(k.root)
        body = [*scope.lines, f"out[i] = {result};"]
        lines = self.operand_setup(info)
        for i in general:
            j = self.desc_slot(info, i)
            lines.append(f"const int64_t cs{i} = desc[{j}].nc ? desc[{j}].cstr[0] : 0;")
        if not general:
            loop = [
                "for (int64_t i = begin; i < end; ++i) {",
                *indent(body, 2),
                "}",
            ]
        else:
            bases = [
                f"const int64_t b{i} = stitch::row_off<int64_t>(desc[{self.desc_slot(info, i)}], r);"
                for i in general
            ]
            loop = [
                "int64_t i = begin;",
                "while (i < end) {",
                "  const int64_t r = i / cols;",
                "  int64_t c = i - r * cols;",
                "  const int64_t c_end = std::min<int64_t>(cols, c + (end - i));",
                *indent(bases, 2),
                "  for (; c < c_end; ++c, ++i) {",
                *indent(body, 4),
                "  }",
                "}",
            ]
        params = self.params(info, ["int64_t n", "int64_t cols"])
        # The loop lives in its own function: its pointer parameters stay __restrict__ (a lambda's
        # by-reference captures would not be, and the loop would stay scalar), and it can be cloned
        # per instruction set.
        ranged = self.function(
            f"{k.name}_range",
            ["int64_t begin", "int64_t end", *params],
            [*lines, *loop],
            "one thread's share of the elements",
            attributes="STITCH_CPU_CLONES ",
        )
        args = ", ".join(["begin", "end", *(param_name(p) for p in params)])
        call = [
            f"at::parallel_for(0, n, {self.grain}, [&](int64_t begin, int64_t end) {{",
            f"  {k.name}_range({args});",
            "});",
        ]
        outer = self.function(k.name, params, call, f"pointwise: {', '.join(k.origins)}")
        return f"{ranged}\n\n{outer}"

    def function(
        self, name: str, params: list[str], body: list[str], comment: str, attributes: str = ""
    ) -> str:
        head = f"// {name}: {comment}\n{attributes}static void {name}(\n    " + ",\n    ".join(params) + ") {"
        return "\n".join([head, *indent(body, 2), "}"])

    # ---- row kernels -----------------------------------------------------------------------------------
    def row(self, info: KernelInfo) -> str:
        k = info.kernel
        index = {o.id: i for i, o in enumerate(info.operands)}
        scalar = self.scalar_fn(info)
        trailing = k.trailing

        def element_load(ident: str) -> str:
            i = index[ident]
            acc = info.operands[i].access
            if acc == "scalar":
                return f"z{i}"
            if acc == "contig":
                return f"in{i}[r * cols + c]"
            return f"in{i}[b{i} + stitch::col_off<int64_t>(desc[{self.desc_slot(info, i)}], c)]"

        def row_load(ident: str) -> str:
            i = index[ident]
            acc = info.operands[i].access
            if acc == "scalar":
                return f"z{i}"
            if acc == "contig":
                return f"in{i}[r * cols]"
            return f"in{i}[b{i}]"

        accs = {r.op.out: acc_type(r.op.fn, self.variant.acc, default_double=True) for r in info.reductions}

        def bases() -> list[str]:
            return [
                f"const int64_t b{i} = stitch::row_off<int64_t>(desc[{self.desc_slot(info, i)}], r);"
                for i in info.general
            ]

        def row_section(scope: Scope, level: int) -> None:
            for op in k.ops:
                if op.kind == "ew" and info.row_level.get(op.out) and info.levels.get(op.out) == level:
                    scope.need(op.out)

        def element_pass(row_scope: Scope, level: int, c_begin: str, c_end: str) -> list[str]:
            reds = [r for r in info.reductions if r.level == level]
            inner = Scope(self.g, info.ops, scalar, element_load, parent=row_scope)
            updates = []
            for r in reds:
                value = inner.need(r.op.args[0].id)
                updates.append(acc_update(r.op.fn, accs[r.op.out], "a_" + local_var(r.op.out), value, "c"))
            decls = [
                f"{accs[r.op.out]} a_{local_var(r.op.out)} = {acc_init(r.op.fn, accs[r.op.out])};"
                for r in reds
            ]
            return [
                *decls,
                f"for (int64_t c = {c_begin}; c < {c_end}; ++c) {{",
                *indent([*inner.lines, *updates], 2),
                "}",
            ]

        def finalize(row_scope: Scope, level: int) -> list[str]:
            lines = []
            for r in info.reductions:
                if r.level != level:
                    continue
                name = local_var(r.op.out)
                ctype = CTYPE[self.g.values[r.op.out].dtype]
                lines.append(
                    f"const {ctype} {name} = {acc_final(r.op.fn, accs[r.op.out], 'a_' + name, 'cols')};"
                )
                row_scope.names[r.op.out] = name
            return lines

        def store(row_scope: Scope) -> list[str]:
            if k.root_level == "row":
                return [f"out[r] = {row_scope.need(k.root)};"]
            inner = Scope(self.g, info.ops, scalar, element_load, parent=row_scope)
            value = inner.need(k.root)
            target = "out[r * cols + c]" if trailing else "out[ob + stitch::col_off<int64_t>(odesc, c)]"
            return [
                "for (int64_t c = 0; c < cols; ++c) {",
                *indent([*inner.lines, f"{target} = {value};"], 2),
                "}",
            ]

        def row_body() -> list[str]:
            row_scope = Scope(self.g, info.ops, scalar, row_load)
            lines = bases()
            if not trailing and k.root_level == "full":
                lines.append("const int64_t ob = stitch::row_off<int64_t>(odesc, r);")
            row_section(row_scope, 0)
            lines += row_scope.lines
            for level in range(1, info.max_level + 1):
                row_scope.lines = []
                lines += element_pass(row_scope, level, "0", "cols")
                lines += finalize(row_scope, level)
                row_section(row_scope, level)
                lines += row_scope.lines
            row_scope.lines = []
            tail = store(row_scope)
            return [*lines, *row_scope.lines, *tail]

        grain = self.grain
        body = self.operand_setup(info)
        main = [
            f"at::parallel_for(0, rows, std::max<int64_t>(1, {grain} / std::max<int64_t>(cols, 1)), "
            "[&](int64_t r0, int64_t r1) {",
            "  for (int64_t r = r0; r < r1; ++r) {",
            *indent(row_body(), 4),
            "  }",
            "});",
        ]
        can_split = k.root_level == "row" and info.max_level == 1 and self.variant.split != "off"
        if can_split:
            body += self.split_path(info, accs, bases, row_section, element_pass, finalize, scalar, row_load)
            body += ["else {", *indent(main, 2), "}"]
        else:
            body += main
        extra = ["int64_t rows", "int64_t cols"]
        if not trailing and k.root_level == "full":
            extra.append("stitch::Desc odesc")
        params = self.params(info, extra)
        return self.function(
            k.name, params, body, f"row kernel ({info.max_level} passes): {', '.join(k.origins)}"
        )

    def split_path(
        self,
        info: KernelInfo,
        accs: dict[str, str],
        bases: Callable[[], list[str]],
        row_section: Callable[[Scope, int], None],
        element_pass: Callable[[Scope, int, str, str], list[str]],
        finalize: Callable[[Scope, int], list[str]],
        scalar: Callable[[Any], str],
        row_load: Callable[[str], str],
    ) -> list[str]:
        """Few long rows: chunks of every row reduce in parallel, then each row combines its chunks."""
        k = info.kernel
        grain = self.grain
        reds = [r for r in info.reductions if r.level == 1]
        chunk_scope = Scope(self.g, info.ops, scalar, row_load)
        row_section(chunk_scope, 0)
        part_decls = [f"std::vector<{accs[r.op.out]}> p_{local_var(r.op.out)}(rows * nchunk);" for r in reds]
        stores = [f"p_{local_var(r.op.out)}[t] = a_{local_var(r.op.out)};" for r in reds]
        chunk = [
            *bases(),
            *chunk_scope.lines,
            *element_pass(chunk_scope, 1, "ch * chunk", "std::min<int64_t>(cols, (ch + 1) * chunk)"),
            *stores,
        ]
        final_scope = Scope(self.g, info.ops, scalar, row_load)
        row_section(final_scope, 0)
        combine = []
        for r in reds:
            name = "a_" + local_var(r.op.out)
            combine.append(f"{accs[r.op.out]} {name} = p_{local_var(r.op.out)}[r * nchunk];")
            combine.append(
                f"for (int64_t ch = 1; ch < nchunk; ++ch) {name} = "
                f"{acc_combine(r.op.fn, name, f'p_{local_var(r.op.out)}[r * nchunk + ch]')};"
            )
        head_lines = list(final_scope.lines)
        final_scope.lines = []
        fin = finalize(final_scope, 1)
        row_section(final_scope, 1)
        root = final_scope.need(k.root)
        final = [*bases(), *head_lines, *combine, *fin, *final_scope.lines, f"out[r] = {root};"]
        return [
            f"if (rows < 2 * at::get_num_threads() && cols >= 4 * {grain}) {{",
            f"  const int64_t chunk = {grain};",
            "  const int64_t nchunk = (cols + chunk - 1) / chunk;",
            *indent(part_decls, 2),
            "  at::parallel_for(0, rows * nchunk, 1, [&](int64_t t0, int64_t t1) {",
            "    for (int64_t t = t0; t < t1; ++t) {",
            "      const int64_t r = t / nchunk;",
            "      const int64_t ch = t - r * nchunk;",
            *indent(chunk, 6),
            "    }",
            "  });",
            "  for (int64_t r = 0; r < rows; ++r) {",
            *indent(final, 4),
            "  }",
            "}",
        ]

    # ---- pooling -------------------------------------------------------------------------------------
    def pool_body(self, info: KernelInfo, desc: str = "desc") -> list[str]:
        """Lines computing output element `o` of a pool kernel (shared with the CUDA back end)."""
        k = info.kernel
        pool = k.pool
        assert pool is not None
        nd = pool.attrs["nd"]
        index = {(o.id, o.domain): i for i, o in enumerate(info.operands)}
        scalar = self.scalar_fn(info)
        src = pool.args[0].id
        dims = ["d", "h", "w"][3 - nd :]

        def loader(domain: str, flat: str) -> Callable[[str], str]:
            def load(ident: str) -> str:
                i = index[(ident, domain)]
                acc = info.operands[i].access
                if acc == "scalar":
                    return f"z{i}"
                if acc == "contig":
                    return f"in{i}[{flat}]"
                return f"in{i}[stitch::row_off<int64_t>({desc}[{self.desc_slot(info, i)}], {flat})]"

            return load

        inner = Scope(self.g, info.ops, scalar, loader("in", "ii"))
        value = inner.need(src)
        fn = pool.fn
        is_max = fn.startswith(("max", "adaptive_max"))
        decomp = ["int64_t t = o;"]
        for d in reversed(dims):
            decomp += [f"const int64_t o{d} = t % O{d.upper()};", f"t /= O{d.upper()};"]
        decomp.append("const int64_t nc = t;")
        window: list[str] = []
        for i, d in enumerate(dims):
            size = f"I{d.upper()}"
            if fn.startswith("adaptive"):
                window += [
                    f"const int64_t {d}0 = (o{d} * {size}) / O{d.upper()};",
                    f"const int64_t {d}1 = ((o{d} + 1) * {size} + O{d.upper()} - 1) / O{d.upper()};",
                ]
            elif is_max:
                s_, p_ = pool.attrs["stride"][i], pool.attrs["padding"][i]
                window += [f"const int64_t {d}s = o{d} * {s_} - {p_};"]
            else:
                kk, s_, p_ = (pool.attrs[a][i] for a in ("kernel", "stride", "padding"))
                window += [
                    f"int64_t {d}0 = o{d} * {s_} - {p_};",
                    f"int64_t {d}1 = {d}0 + {kk} < {size} + {p_} ? {d}0 + {kk} : {size} + {p_};",
                    f"const int64_t {d}n = {d}1 - {d}0;",
                    f"{d}0 = {d}0 > 0 ? {d}0 : 0;",
                    f"{d}1 = {d}1 < {size} ? {d}1 : {size};",
                ]
        flat = "nc"
        for d in dims:
            flat = f"({flat} * I{d.upper()} + i{d})"
        combine = "acc = (x > acc || x != x) ? x : acc;" if is_max else "acc += x;"
        body_inner = [f"const int64_t ii = {flat};", *inner.lines, f"const float x = {value};", combine]
        loops: list[str] = []
        closers: list[str] = []
        for i, d in enumerate(dims):
            size = f"I{d.upper()}"
            if is_max and not fn.startswith("adaptive"):
                kk, dl = pool.attrs["kernel"][i], pool.attrs["dilation"][i]
                loops += [
                    f"for (int64_t k{d} = 0; k{d} < {kk}; ++k{d}) {{",
                    f"  const int64_t i{d} = {d}s + k{d} * {dl};",
                    f"  if (i{d} < 0 || i{d} >= {size}) continue;",
                ]
            else:
                loops.append(f"for (int64_t i{d} = {d}0; i{d} < {d}1; ++i{d}) {{")
            closers.append("}")
        nest = [*loops, *indent(body_inner, 2 * nd), *closers]
        if is_max:
            init, final = "float acc = -INFINITY;", "const float pooled = acc;"
        else:
            if fn.startswith("adaptive"):
                count = " * ".join(f"({d}1 - {d}0)" for d in dims)
            elif pool.attrs.get("divisor_override", 0):
                count = str(pool.attrs["divisor_override"])
            elif pool.attrs.get("count_include_pad", True):
                count = " * ".join(f"{d}n" for d in dims)
            else:
                count = " * ".join(f"({d}1 - {d}0)" for d in dims)
            init, final = "float acc = 0.f;", f"const float pooled = acc / static_cast<float>({count});"
        epi = Scope(self.g, info.ops, scalar, loader("main", "o"))
        epi.names[pool.out] = "pooled"
        result = epi.need(k.root)
        return [*decomp, *window, init, *nest, final, *epi.lines, f"out[o] = {result};"]

    def pool(self, info: KernelInfo) -> str:
        k = info.kernel
        pool = k.pool
        assert pool is not None
        nd = pool.attrs["nd"]
        dims = ["d", "h", "w"][3 - nd :]
        body = self.pool_body(info)
        sizes = [f"int64_t I{d.upper()}" for d in dims] + [f"int64_t O{d.upper()}" for d in dims]
        window_size = 1
        for kk in pool.attrs.get("kernel", [2] * nd):
            window_size *= kk
        lines = [
            *self.operand_setup(info),
            f"at::parallel_for(0, total, std::max<int64_t>(1, {self.grain} / {max(window_size, 1)}), "
            "[&](int64_t begin, int64_t end) {",
            "  for (int64_t o = begin; o < end; ++o) {",
            *indent(body, 4),
            "  }",
            "});",
        ]
        params = self.params(info, ["int64_t total", *sizes])
        return self.function(k.name, params, lines, f"{pool.fn}: {', '.join(k.origins)}")

    # ---- launches ---------------------------------------------------------------------------------------
    def launch(self, info: KernelInfo, host: Host) -> list[str]:
        k = info.kernel
        if k.kind == "pointwise":
            source = self.pointwise(info)
        elif k.kind == "row":
            source = self.row(info)
        else:
            source = self.pool(info)
        return launch_lines(info, host, backend="cpu", entry=self.bodies.add(k.name, source))


def launch_lines(info: KernelInfo, host: Host, *, backend: str, entry: str) -> list[str]:
    """Host code for one kernel: domain, operand checks and descriptors, output, and the call of `entry`'s
    function (this kernel's, or that of an earlier kernel of the same body: codegen.KernelBodies)."""
    k = info.kernel
    g = host.g
    dom_lines, dom = host.domain_lines(info)
    rank = len(g.values[k.domain].shape)
    if k.kind == "pointwise":
        row_dims, col_dims = (
            f"stitch::range(0, {max(rank - 1, 0)})",
            ("{" + str(rank - 1) + "}" if rank else "{}"),
        )
    elif k.kind == "row":
        red = list(k.reduce_dims)
        keep = [d for d in range(rank) if d not in red]
        row_dims = "std::vector<int>{" + ", ".join(map(str, keep)) + "}"
        col_dims = "std::vector<int>{" + ", ".join(map(str, red)) + "}"
    else:
        row_dims, col_dims = f"stitch::range(0, {rank})", "{}"
    lines = [f"// ---- {k.name} ({k.kind}) covers {', '.join(k.origins)}", *dom_lines]
    lines += host.operand_lines(info, dom, row_dims, col_dims)
    root = g.values[k.root]
    if k.kind == "row" and k.root_level == "row":
        keepdim = len(root.shape) == rank
        shape = f"stitch::reduced({dom}, {col_dims}, {'true' if keepdim else 'false'})"
    else:
        shape = dom
    lines += host.output_lines(info, shape)
    ptrs = [host.ptr(info, i) for i in range(len(info.operands))]
    out_ptr = f"{tensor_var(k.root)}.data_ptr<{CTYPE[root.dtype]}>()"
    desc = f"D_{k.name}.data()" if info.general else "nullptr"
    scalars = [f"static_cast<float>({expr})" for expr, _ in info.scalars]
    if k.kind == "pointwise":
        extra = [f"{tensor_var(k.root)}.numel()", f"({rank} ? {dom}.back() : 1)"]
    elif k.kind == "row":
        extra = [f"stitch::prod({dom}, {row_dims})", f"stitch::prod({dom}, {col_dims})"]
        if not k.trailing and k.root_level == "full":
            extra.append(f"stitch::make_desc({tensor_var(k.root)}, {dom}, {row_dims}, {col_dims})")
    else:
        pool = k.pool
        assert pool is not None
        nd = pool.attrs["nd"]
        rank_in = len(g.values[pool.args[0].id].shape)
        extra = [f"{tensor_var(k.root)}.numel()"]
        extra += [f"SI_{k.name}[{rank_in - nd + i}]" for i in range(nd)]
        extra += [f"{dom}[{rank_in - nd + i}]" for i in range(nd)]
    args = [*ptrs, out_ptr, desc, *extra, *scalars]
    if k.epilogue_of is not None:
        return library_epilogue_lines(k, host, lines, entry, args)
    if backend == "cpu":
        lines.append(f"{entry}({', '.join(args)});")
    else:
        lines.append(f"{entry}_launch({', '.join(args)});")
    return lines


# The own kernels an epilogue can be fused into: host call -> its preparation (a struct with the operands, the
# geometry and the output allocated; convolution.HOST_PREPARE, libops.CUSTOM_WRAPPERS).
PREPARED = {
    "stitch_conv(": ("StitchConv", "stitch_conv_prepare("),
    "stitch_linear(": ("StitchGemm", "stitch_linear_prepare("),
}


def library_epilogue_lines(k: Kernel, host: Host, lines: list[str], entry: str, args: list[str]) -> list[str]:
    """A pointwise kernel fused into the store of the GEMM or convolution it reads
    (fusion.fuse_library_epilogues): that op is prepared here (operands, geometry, its output allocated), the
    kernel's lines read the output through the prepared call, and one launch runs the op with the kernel as
    its epilogue."""
    op = k.epilogue_of
    assert op is not None
    expr = host.lib_expr(op)
    head = expr[: expr.index("(") + 1]
    if head not in PREPARED:
        raise Unsupported(f"{op.origin}: an epilogue fused into {head[:-1]}")
    struct, prepare = PREPARED[head]
    call = f"LP_{k.name}"
    raw = re.compile(rf"\b{re.escape(tensor_var(op.out))}\b")
    body = [raw.sub(f"{call}.out", line) for line in lines]
    into = host.into_args(k.root)
    if into:
        # The output is the convolution's slice of a concatenation, written in place: used as it is.
        expr = f"{expr[:-1]}{into})"
        body = [line.replace(f"stitch_dense({call}.out)", f"{call}.out") for line in body]
    lib_args = [
        f"{call}.x.data_ptr<float>()",
        f"{call}.w.data_ptr<float>()",
        f"{call}.bias_ptr()",
        f"{call}.geom",
    ]
    return [
        body[0],
        f"{struct} {call} = {prepare}{expr[len(head) :]};",
        *body[1:],
        f"{entry}_epilogue_launch({', '.join(lib_args + args)});",
    ]


def emit(program: Program, variant: Variant, ext_name: str) -> tuple[dict[str, str], list[str], list[str]]:
    """({file: source}, cflags, ldflags) for the CPU extension: forward.cpp (kernels and forward()) and
    binding.cpp (its Python binding), compiled in parallel."""
    kernels = CpuKernels(program, variant)
    host = Host(program, "cpu", kernels.launch, custom_library=variant.gemm == "custom")
    body = host.body()
    ret, params = host.signature()
    forward = [f"{ret} forward(", "    " + ",\n    ".join(params) + ") {", *indent(body, 2), "}"]
    helpers = libops.helper_source(host.helpers, "cpu")
    lstm = rnn.cpu_helper(custom=host.custom) if "lstm" in host.helpers else ""
    body_text = "\n".join([*kernels.bodies.functions, helpers, lstm, *forward])
    source = "\n".join(
        [
            f"// {ext_name}: synthesized by StitchCUDA's built-in coder (CPU backend).",
            "// One extension, one entry point; every custom kernel below is called from forward().",
            f'#include "{HEADER_NAME}"',
            "",
            "#include <ATen/Parallel.h>",
            "#include <ATen/core/Tensor.h>",
            "",
            *operator_includes(body_text),
            "",
            "#include <algorithm>",
            "#include <tuple>",
            "",
            "using namespace stitch;",
            "",
            "namespace {",
            "",
            "\n\n".join(kernels.bodies.functions),
            helpers,
            lstm,
            "",
            "}  // namespace",
            "",
            *forward,
            "",
        ]
    )
    binding = binding_source(ext_name, ret, params, "fused CPU kernels")
    # In name order, as the Coder's answer parser lists an answer's sources (the same program either way).
    return {BINDING_FILE: binding, "forward.cpp": source}, list(CFLAGS), list(LDFLAGS)


def check_tensor_var(ident: str) -> str:
    return tensor_var(ident)
