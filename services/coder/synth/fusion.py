"""Kernel formation: which values are materialized, and which ops each custom kernel computes.

Elementwise ops are inlined into the kernel of the materialized value that consumes them (recomputed
per element, never stored). A reduction is fused with the elementwise ops around it into one *row
kernel* that makes one pass per dependent reduction level over each row (softmax: max, then sum,
then the normalized write); a pooling window op takes its elementwise producers as a prologue and
its consumers as an epilogue. Library calls (GEMM, conv) and views stay host-side steps; the
elementwise ops after a library call become its epilogue kernel, written in place where possible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.coder.synth.ir import (
    EW,
    HOST,
    INPUT,
    LIB,
    PARAM,
    POOL,
    REDUCE,
    VIEW,
    Attr,
    Const,
    Graph,
    Op,
    Ref,
    Unsupported,
    Value,
    broadcast_shapes,
    contiguous_strides,
    reduced_shape,
)
from stitchcuda.coder.synth.variants import Variant

ANCHORS = (REDUCE, POOL)


@dataclass
class Operand:
    """A materialized tensor a kernel reads."""

    id: str
    # contig: same shape as the domain and contiguous (flat index); scalar: one element; general: strided
    # or broadcast, addressed through a runtime descriptor.
    access: str
    # "main": the kernel's iteration domain; "in": the input window domain of a pool kernel.
    domain: str = "main"


@dataclass
class Kernel:
    name: str
    # pointwise | row | pool
    kind: str
    root: str
    # The value whose shape is the iteration domain (the root, the reduction input, the pool output).
    domain: str
    ops: list[Op]
    operands: list[Operand]
    # Row kernels: reduced dims of the domain, and whether they are the trailing dims.
    reduce_dims: tuple[int, ...] = ()
    trailing: bool = True
    # Row kernels: is the root written per element (full) or once per row (row)?
    root_level: str = "full"
    pool: Op | None = None
    # Operand whose buffer the output reuses (an epilogue written in place over a library result).
    inplace: str = ""
    # Fx node names of the reference this kernel covers.
    origins: list[str] = field(default_factory=list)
    # A pointwise kernel over an own GEMM's or convolution's output (CUDA): that op, launched here with this
    # kernel as its store's epilogue (fuse_library_epilogues).
    epilogue_of: Op | None = None


@dataclass
class Step:
    """One step of the host program: a host-side op or a kernel launch."""

    op: Op | None = None
    kernel: Kernel | None = None


@dataclass
class Program:
    graph: Graph
    steps: list[Step]
    kernels: list[Kernel]
    attrs: list[Attr]


def _fresh(graph: Graph, base: str) -> str:
    i = 0
    while f"{base}_{i}" in graph.values:
        i += 1
    return f"{base}_{i}"


def prepare(graph: Graph, variant: Variant) -> Graph:
    """Variant-dependent rewrites: where biases go, and copies for outputs that alias inputs."""
    ops: list[Op] = []
    rename: dict[str, str] = {}
    for op in graph.ops:
        op.args = [Ref(rename.get(a.id, a.id)) if isinstance(a, Ref) else a for a in op.args]
        split_linear = (
            op.kind == LIB and op.fn == "linear" and op.attrs.get("bias") and variant.gemm_bias == "epilogue"
        )
        # The own convolution kernels add the bias in their store, for free (variant gemm=custom).
        split_conv = (
            op.kind == LIB
            and op.fn.startswith("conv")
            and op.attrs.get("bias")
            and variant.conv_bias == "epilogue"
            and variant.gemm != "custom"
        )
        if split_linear or split_conv:
            out_value = graph.values[op.out]
            raw = _fresh(graph, op.out + "_nobias")
            graph.values[raw] = Value(raw, "tensor", out_value.shape, contiguous_strides(out_value.shape))
            bias = op.args[-1]
            lib = Op(LIB, op.fn, raw, op.args[:-1], dict(op.attrs, bias=False), origin=op.origin)
            ops.append(lib)
            graph.producer[raw] = lib
            if split_conv:
                c = graph.values[bias.id].shape[0]
                view_shape = (c,) + (1,) * (len(out_value.shape) - 2)
                vid = _fresh(graph, op.out + "_bias")
                graph.values[vid] = Value(vid, "tensor", view_shape, contiguous_strides(view_shape))
                dyn = [-1] + [1] * (len(out_value.shape) - 2)
                view = Op(VIEW, "reshape", vid, [bias], {"shape": dyn}, origin=op.origin)
                ops.append(view)
                graph.producer[vid] = view
                bias = Ref(vid)
            add = Op(EW, "add", op.out, [Ref(raw), bias], origin=op.origin)
            ops.append(add)
            graph.producer[op.out] = add
            continue
        ops.append(op)
    graph.ops = ops
    # An output that is an input, a parameter or a view of one would alias memory the caller owns.
    for i, out in enumerate(graph.outputs):
        if _aliases_caller_memory(graph, out):
            copy = _fresh(graph, out + "_copy")
            v = graph.values[out]
            graph.values[copy] = Value(copy, "tensor", v.shape, contiguous_strides(v.shape), v.dtype)
            op = Op(EW, "identity", copy, [Ref(out)], origin=graph.producer[out].origin)
            graph.ops.append(op)
            graph.producer[copy] = op
            graph.outputs[i] = copy
    _drop_dead(graph)
    return graph


def _drop_dead(graph: Graph) -> None:
    """Drops the kernel ops no output needs: torch.max(x, dim)[0] traces the indices too (a second pass)."""
    needed = set(graph.outputs) | set(graph.writebacks) | set(graph.writebacks.values())
    kept: list[Op] = []
    for op in reversed(graph.ops):
        droppable = op.kind in (EW, REDUCE, POOL) or (op.kind == HOST and op.fn == "tuple")
        if droppable and op.out not in needed:
            continue
        needed.update(op.refs())
        kept.append(op)
    graph.ops = kept[::-1]


def _aliases_caller_memory(graph: Graph, ident: str) -> bool:
    op = graph.producer[ident]
    if op.kind in (INPUT, PARAM):
        return True
    if op.kind == VIEW:
        return _aliases_caller_memory(graph, op.args[0].id)
    return False


def plan_subtask_of(plan: plan_pb2.Plan | None) -> dict[str, str]:
    """fx node name -> plan subtask id (empty when the plan has no subtasks)."""
    owner: dict[str, str] = {}
    if plan is None:
        return owner
    for st in plan.subtasks:
        for node in st.ops:
            owner.setdefault(node.name, st.id)
    return owner


class Fuser:
    def __init__(self, graph: Graph, variant: Variant, plan: plan_pb2.Plan | None) -> None:
        self.g = graph
        self.variant = variant
        self.users = graph.consumers()
        self.owner = plan_subtask_of(plan) if variant.fusion == "plan" else {}
        self.order = {op.out: i for i, op in enumerate(graph.ops)}
        self.materialized: set[str] = set()

    # ---- which values live in memory ---------------------------------------------------------------
    def initial_materialized(self) -> set[str]:
        m: set[str] = set(self.g.outputs) | set(self.g.writebacks)
        for op in self.g.ops:
            if op.kind in (INPUT, PARAM, VIEW, LIB, HOST) or op.kind not in (EW, REDUCE, POOL):
                m.add(op.out)
                continue
            if self.variant.fusion == "none":
                m.add(op.out)
                continue
            for user in self.users.get(op.out, []):
                if user.kind == EW:
                    if self.owner and self.owner.get(user.origin, "") != self.owner.get(op.origin, ""):
                        m.add(op.out)
                    continue
                if user.kind in (REDUCE, POOL) and op.kind == EW:
                    if self.owner and self.owner.get(user.origin, "") != self.owner.get(op.origin, ""):
                        m.add(op.out)
                    continue
                m.add(op.out)
        return m

    def closure(
        self, roots: list[str], stop: set[str], *, top: bool = True
    ) -> tuple[list[str], list[str], list[str]]:
        """Inlined elementwise values, anchor values (reductions/pools) and operand values under roots.

        With top=True the roots themselves are computed (they are what the kernel writes); with
        top=False a root that is materialized or an anchor is only read.
        """
        inlined: list[str] = []
        anchors: list[str] = []
        operands: list[str] = []
        seen: set[str] = set()

        def visit(ident: str, top: bool) -> None:
            if ident in seen:
                return
            seen.add(ident)
            op = self.g.producer[ident]
            value = self.g.values[ident]
            if not top and (ident in self.materialized or ident in stop):
                if value.kind == "tensor":
                    operands.append(ident)
                return
            if op.kind == EW or top:
                if op.kind == EW:
                    for r in op.refs():
                        visit(r, False)
                    inlined.append(ident)
                return
            if op.kind in ANCHORS:
                anchors.append(ident)
                return
            if value.kind == "tensor":
                operands.append(ident)

        for r in roots:
            visit(r, top)
        return inlined, anchors, operands

    def domain_of(self, reduce_value: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        op = self.g.producer[reduce_value]
        return self.g.values[op.args[0].id].shape, tuple(op.attrs["dims"])

    def row_group(self, root: str) -> tuple[list[str], set[str]] | None:
        """The reductions a row kernel for `root` absorbs, and the anchors it cannot (to materialize)."""
        root_op = self.g.producer[root]
        if root_op.kind == REDUCE:
            key = self.domain_of(root)
            reductions = [root]
            frontier = [root_op.args[0].id]
            first = False
        else:
            _, anchors, _ = self.closure([root], set())
            reds = [a for a in anchors if self.g.producer[a].kind == REDUCE]
            if not reds:
                return None
            root_shape = self.g.values[root].shape
            key = self.domain_of(reds[0])
            shape, dims = key
            full = root_shape == shape
            keep_shape = reduced_shape(shape, dims, True)
            row = root_shape in (keep_shape, reduced_shape(shape, dims, False))
            if not (full or row):
                return None
            reductions = []
            frontier = [root]
            first = True
        rejected: set[str] = set()
        while frontier:
            ident = frontier.pop()
            _, anchors, _ = self.closure([ident], set(reductions), top=first)
            first = False
            for a in anchors:
                if a in reductions or a in rejected:
                    continue
                if (
                    self.g.producer[a].kind == REDUCE
                    and self.domain_of(a) == key
                    and a not in self.materialized
                ):
                    reductions.append(a)
                    frontier.append(self.g.producer[a].args[0].id)
                else:
                    rejected.add(a)
        if reductions and not self._fits_domain(root, reductions, key[0]):
            return None
        return reductions, rejected

    def _fits_domain(self, root: str, reductions: list[str], shape: tuple[int, ...]) -> bool:
        """Every tensor the row kernel would read must broadcast to its domain (a squeezed row-shaped
        value does not: it is read by a separate kernel instead)."""
        stop = set(reductions)
        roots = [root] if root not in stop else []
        operands = self.closure(roots, stop - {root})[2] if roots else []
        for r in reductions:
            operands += self.closure([self.g.producer[r].args[0].id], stop, top=False)[2]
        for o in operands:
            if o in stop:
                continue
            try:
                if broadcast_shapes(self.g.values[o].shape, shape) != shape:
                    return False
            except Unsupported:
                return False
        return True

    def pool_group(self, root: str) -> tuple[str | None, set[str]]:
        root_op = self.g.producer[root]
        if root_op.kind == POOL:
            _, anchors, _ = self.closure([root_op.args[0].id], set(), top=False)
            return root, set(anchors)
        _, anchors, _ = self.closure([root], set())
        pools = [
            a
            for a in anchors
            if self.g.producer[a].kind == POOL and self.g.values[a].shape == self.g.values[root].shape
        ]
        if len(pools) != 1 or any(self.g.producer[a].kind == REDUCE for a in anchors):
            return None, set(anchors)
        pool = pools[0]
        _, inner, _ = self.closure([self.g.producer[pool].args[0].id], set(), top=False)
        return pool, {a for a in anchors if a != pool} | set(inner)

    def roots(self) -> list[str]:
        return sorted(
            (v for v in self.materialized if self.g.producer[v].kind in (EW, REDUCE, POOL)),
            key=lambda v: self.order[v],
        )

    def settle(self) -> None:
        """Grows the materialized set until every anchor is either absorbed or materialized."""
        self.materialized = self.initial_materialized()
        changed = True
        while changed:
            changed = False
            for root in self.roots():
                for extra in self.unabsorbed(root):
                    if extra not in self.materialized:
                        self.materialized.add(extra)
                        changed = True

    def unabsorbed(self, root: str) -> set[str]:
        op = self.g.producer[root]
        if op.kind == POOL:
            return self.pool_group(root)[1]
        _, anchors, _ = self.closure([root], set())
        if op.kind == REDUCE or any(self.g.producer[a].kind == REDUCE for a in anchors):
            group = self.row_group(root)
            if group is None:
                return set(anchors)
            return group[1]
        if any(self.g.producer[a].kind == POOL for a in anchors):
            return self.pool_group(root)[1]
        return set(anchors)

    # ---- kernels -------------------------------------------------------------------------------------
    def access(self, ident: str, domain_shape: tuple[int, ...], *, row_trailing: bool = True) -> str:
        v = self.g.values[ident]
        if v.numel == 1:
            return "scalar"
        if v.shape == domain_shape and v.contiguous and row_trailing:
            return "contig"
        return "general"

    def build(self) -> list[Kernel]:
        self.settle()
        kernels: list[Kernel] = []
        for root in self.roots():
            kernels.append(self.kernel_for(root, f"k{len(kernels)}"))
        return kernels

    def kernel_for(self, root: str, name: str) -> Kernel:
        op = self.g.producer[root]
        root_value = self.g.values[root]
        if root_value.dtype not in ("float32", "int64", "bool"):
            raise Unsupported(f"{root}: cannot materialize a {root_value.dtype} tensor")
        _, anchors, _ = self.closure([root], set())
        if op.kind == POOL or (op.kind == EW and any(self.g.producer[a].kind == POOL for a in anchors)):
            pool, _ = self.pool_group(root)
            if pool is not None:
                return self.pool_kernel(root, pool, name)
        if op.kind == REDUCE or any(self.g.producer[a].kind == REDUCE for a in anchors):
            group = self.row_group(root)
            if group is not None and group[0]:
                return self.row_kernel(root, group[0], name)
            if op.kind == REDUCE:
                raise Unsupported(f"{root}: reduction could not be scheduled")
        return self.pointwise_kernel(root, name)

    def ops_of(self, idents: list[str]) -> list[Op]:
        return [self.g.producer[i] for i in sorted(set(idents), key=lambda v: self.order[v])]

    def pointwise_kernel(self, root: str, name: str) -> Kernel:
        inlined, _, operands = self.closure([root], set())
        shape = self.g.values[root].shape
        ops = self.ops_of(inlined)
        kernel = Kernel(
            name,
            "pointwise",
            root,
            root,
            ops,
            [Operand(o, self.access(o, shape)) for o in dict.fromkeys(operands)],
            origins=sorted({op.origin for op in ops}),
        )
        kernel.inplace = self.inplace_candidate(kernel)
        return kernel

    def inplace_candidate(self, kernel: Kernel) -> str:
        buffer = self.g.writebacks.get(kernel.root)
        if buffer is not None:
            # Model state updated in place: the kernel reads and writes the same element of the buffer.
            if not any(o.id == buffer and o.access == "contig" for o in kernel.operands):
                raise Unsupported(
                    f"{kernel.root}: the update of {buffer} does not read it element for element"
                )
            return buffer
        root = self.g.values[kernel.root]
        if root.dtype != "float32":
            return ""
        inside = {op.out for op in kernel.ops}
        for operand in kernel.operands:
            src = self.g.producer[operand.id]
            if src.kind != LIB or operand.access != "contig" or operand.id in self.g.outputs:
                continue
            users = self.users.get(operand.id, [])
            if users and all(u.out in inside for u in users) and self.g.values[operand.id].dtype == "float32":
                return operand.id
        return ""

    def row_kernel(self, root: str, reductions: list[str], name: str) -> Kernel:
        shape, dims = self.domain_of(reductions[0])
        stop = set(reductions)
        inlined, _, operands = self.closure([root], stop - {root})
        members = set(inlined)
        for r in reductions:
            sub, _, more = self.closure([self.g.producer[r].args[0].id], stop, top=False)
            members |= set(sub)
            operands += more
        members |= set(reductions)
        ops = self.ops_of(list(members))
        rank = len(shape)
        trailing = dims == tuple(range(rank - len(dims), rank))
        operand_ids = [o for o in dict.fromkeys(operands) if o not in members]
        for o in operand_ids:
            broadcast_shapes(self.g.values[o].shape, shape)
        root_value = self.g.values[root]
        level = "full" if root_value.shape == shape else "row"
        return Kernel(
            name,
            "row",
            root,
            self.g.producer[reductions[0]].args[0].id,
            ops,
            [Operand(o, self.access(o, shape, row_trailing=trailing)) for o in operand_ids],
            reduce_dims=dims,
            trailing=trailing,
            root_level=level,
            origins=sorted({op.origin for op in ops}),
        )

    def pool_kernel(self, root: str, pool: str, name: str) -> Kernel:
        pool_op = self.g.producer[pool]
        src = pool_op.args[0].id
        in_shape = self.g.values[src].shape
        out_shape = self.g.values[pool].shape
        pro_inlined, _, pro_operands = self.closure([src], set(), top=False)
        epi_inlined: list[str] = []
        epi_operands: list[str] = []
        if root != pool:
            epi_inlined, _, epi_operands = self.closure([root], {pool})
            epi_operands = [o for o in epi_operands if o != pool]
        operands = [Operand(o, self.access(o, in_shape), "in") for o in dict.fromkeys(pro_operands)]
        operands += [Operand(o, self.access(o, out_shape), "main") for o in dict.fromkeys(epi_operands)]
        ops = self.ops_of([*pro_inlined, pool, *epi_inlined])
        return Kernel(
            name,
            "pool",
            root,
            pool,
            ops,
            operands,
            pool=pool_op,
            origins=sorted({op.origin for op in ops}),
        )


def collect_attrs(graph: Graph) -> list[Attr]:
    seen: dict[str, Attr] = {}
    for op in graph.ops:
        for a in [*op.args, *op.attrs.values()]:
            if isinstance(a, Attr):
                seen.setdefault(a.path, a)
    return list(seen.values())


def schedule(graph: Graph, variant: Variant, plan: plan_pb2.Plan | None = None) -> Program:
    graph = prepare(graph, variant)
    fuser = Fuser(graph, variant, plan)
    kernels = fuser.build()
    by_root = {k.root: k for k in kernels}
    steps: list[Step] = []
    for op in graph.ops:
        if op.out in by_root:
            steps.append(Step(kernel=by_root[op.out]))
        elif op.kind in (VIEW, LIB, HOST) or op.kind not in (EW, REDUCE, POOL, INPUT, PARAM):
            steps.append(Step(op=op))
    _check_inplace(steps, graph)
    return Program(graph, steps, kernels, collect_attrs(graph))


def _reads(step: Step) -> list[str]:
    if step.kernel is not None:
        return [o.id for o in step.kernel.operands]
    return step.op.refs() if step.op is not None else []


def _check_inplace(steps: list[Step], graph: Graph) -> None:
    """An epilogue may overwrite a library result only if nothing later still reads that buffer.

    State writebacks are exempt: a later reader of the buffer must see the update, as in the reference.
    """
    for i, step in enumerate(steps):
        k = step.kernel
        if k is None or not k.inplace or k.root in graph.writebacks:
            continue
        for later in steps[i + 1 :]:
            if k.inplace in _reads(later):
                k.inplace = ""
                break


def fuse_library_epilogues(program: Program, fns: frozenset[str]) -> None:
    """Moves each own GEMM or convolution (an op of `fns`) whose output only a pointwise kernel written in
    place over it reads into that kernel's step, as the kernel's epilogue: the library kernel's store computes
    the pointwise kernel's expression, so its output is written once and never read back.

    The kernel must read the output element for element (a contiguous operand) and be its only reader; no
    step between the two may write into an existing buffer (an in-place kernel, a state update), since the
    GEMM or convolution now reads its operands at the later step.
    """
    graph, steps = program.graph, program.steps
    for i, step in enumerate(steps):
        op = step.op
        if op is None or op.kind != LIB or op.fn not in fns or graph.values[op.out].dtype != "float32":
            continue
        if op.out in graph.outputs or op.out in graph.writebacks.values():
            continue
        readers = [j for j in range(i + 1, len(steps)) if op.out in _reads(steps[j])]
        if len(readers) != 1:
            continue
        k = steps[readers[0]].kernel
        if k is None or k.kind != "pointwise" or k.inplace != op.out or k.epilogue_of is not None:
            continue
        if graph.values[k.root].dtype != "float32":
            continue
        if any(o.id == op.out and (o.access != "contig" or o.domain != "main") for o in k.operands):
            continue
        between = steps[i + 1 : readers[0]]
        if any(
            s.kernel is not None and (s.kernel.inplace or s.kernel.root in graph.writebacks) for s in between
        ):
            continue
        k.epilogue_of = op
        steps[i] = Step()


__all__ = ["Const", "Kernel", "Operand", "Program", "Step", "fuse_library_epilogues", "schedule"]
