"""Fusion groups: an anchor op (GEMM, conv, reduction, norm, softmax, pool...) with its elementwise
prologue and epilogue, attention chains, and elementwise chains; every compute node in exactly one group.

The greedy rule keeps the group graph acyclic: a node joins a group only through the group's tail, and only
when the tail's data goes nowhere else, so no member but the tail is ever read outside its group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stitchcuda.planner.graph import OUTPUT, Graph, Node

ANCHOR_KINDS = frozenset(
    {"reduction", "softmax", "norm", "gemm", "conv", "pool", "attention", "rnn", "opaque"}
)
# Anchors that can take an elementwise prologue in the same kernel (GEMM/conv stay library calls: cuBLAS
# and cuDNN cannot apply a prologue, so an elementwise producer of a GEMM stays its own kernel).
PROLOGUE_ANCHORS = frozenset({"reduction", "softmax", "norm", "pool"})
LIBRARY_KINDS = frozenset({"gemm", "conv", "rnn"})
BATCHED_GEMMS = frozenset({"matmul", "bmm", "einsum", "baddbmm"})


class CycleError(ValueError):
    """Groups whose data dependencies form a cycle: no kernel order can run them."""


@dataclass
class Group:
    nodes: list[str]
    kind: str
    anchor: str = ""
    library_call: bool = False
    open: bool = True
    pattern: str = ""
    notes: list[str] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)  # inference batch norms folded into the anchor's weights
    id: str = ""

    @property
    def tail(self) -> str:
        return self.nodes[-1]


class Fuser:
    def __init__(self, graph: Graph, *, library_gemm: bool = True) -> None:
        self.graph = graph
        self.library_gemm = library_gemm
        self.groups: list[Group] = []
        self.group_of: dict[str, Group] = {}

    # ------------------------------------------------------------------ helpers
    def _new(self, node: Node) -> Group:
        kind = node.kind
        group = Group(nodes=[], kind=kind, anchor=node.name if kind in ANCHOR_KINDS else "")
        group.library_call = self.library_gemm and kind in LIBRARY_KINDS
        group.open = kind != "opaque"
        self.groups.append(group)
        return group

    def _add(self, group: Group, node: Node) -> None:
        group.nodes.append(node.name)
        self.group_of[node.name] = group

    def _sole_reader(self, producer: Node, reader: Node) -> bool:
        return self.graph.consumers(producer) == {reader.name}

    def _joinable_tail(self, node: Node, *, unanchored: bool = False) -> Group | None:
        """The group whose tail produces `node`'s data for `node` alone, if any."""
        for p in self.graph.producers(node):
            group = self.group_of.get(p.name)
            if group is None or not group.open or group.tail != p.name or not self._sole_reader(p, node):
                continue
            if unanchored and group.anchor:
                continue
            return group
        return None

    def _foldable_norm(self, node: Node) -> bool:
        if node.target != "batch_norm" or node.info.module is None:
            return False
        return node.info.module.constants.get("training") == "False"

    # ------------------------------------------------------------------ patterns
    def _attention_chain(self, softmax: Node) -> list[Node] | None:
        """matmul -> [elementwise scale/mask] -> softmax -> [dropout] -> matmul, each link read only once."""
        graph = self.graph
        before: list[Node] = []
        cur = softmax
        while True:
            producers = graph.producers(cur)
            if len(producers) != 1 or not self._sole_reader(producers[0], cur):
                return None
            p = producers[0]
            if p.kind == "gemm" and p.target in BATCHED_GEMMS:
                before.insert(0, p)
                break
            if p.kind != "elementwise":
                return None
            before.insert(0, p)
            cur = p
        after: list[Node] = []
        cur = softmax
        while True:
            readers = graph.consumers(cur)
            if len(readers) != 1 or OUTPUT in readers:
                return None
            c = graph.node(next(iter(readers)))
            producers = graph.producers(c)
            if c.kind == "gemm" and c.target in BATCHED_GEMMS and producers and producers[0] is cur:
                after.append(c)
                break
            if c.kind != "elementwise" or [p.name for p in producers] != [cur.name]:
                return None
            after.append(c)
            cur = c
        chain = [*before, softmax, *after]
        return None if any(n.name in self.group_of for n in chain) else chain

    def _patterns(self) -> None:
        for node in self.graph.compute_nodes():
            if node.kind != "softmax" or node.name in self.group_of:
                continue
            chain = self._attention_chain(node)
            if chain is None:
                continue
            group = Group(nodes=[], kind="attention", anchor=node.name, pattern="attention")
            group.notes.append(
                "attention written out: fuse QK^T, scaling/masking, softmax and the product with V in one "
                "flash-attention kernel (online softmax); the score matrix is never written to memory"
            )
            self.groups.append(group)
            for member in chain:
                self._add(group, member)

    # ------------------------------------------------------------------ main pass
    def run(self) -> list[Group]:
        self._patterns()
        for node in self.graph.compute_nodes():
            if node.name in self.group_of:
                continue
            group: Group | None = None
            if node.kind == "elementwise":
                group = self._joinable_tail(node)
            elif self._foldable_norm(node):
                group = self._joinable_tail(node)
                if group is not None and group.kind in ("conv", "gemm"):
                    group.folded.append(node.name)
                    group.notes.append(
                        f"inference batch norm {node.name} folded into the {group.kind} at init"
                    )
                else:
                    group = None
            elif node.kind in PROLOGUE_ANCHORS:
                group = self._joinable_tail(node, unanchored=True)
                if group is not None:
                    group.anchor, group.kind = node.name, node.kind
            if group is None:
                group = self._new(node)
            self._add(group, node)
        self._attach_non_compute()
        return self._ordered()

    def _attach_non_compute(self) -> None:
        """Layout ops, shape arithmetic and parameter reads join a neighbour: first reader, else producer."""
        graph = self.graph
        pending = [n for n in graph.nodes if not n.compute and n.kind in ("layout", "host", "param")]
        for node in reversed(pending):
            readers = sorted(graph.users_of(node), key=lambda u: u.index)
            group = next((self.group_of[u.name] for u in readers if u.name in self.group_of), None)
            if group is not None:
                self._add(group, node)
        for node in pending:
            if node.name in self.group_of:
                continue
            group = next(
                (self.group_of[p.name] for p in graph.inputs_of(node) if p.name in self.group_of), None
            )
            if group is None:
                group = next((g for g in self.groups if g.kind == "layout"), None)
                if group is None:
                    group = Group(nodes=[], kind="layout", open=False)
                    group.notes.append(
                        "data movement only (views and copies the program returns); no arithmetic"
                    )
                    self.groups.append(group)
            self._add(group, node)
        index = {n.name: n.index for n in graph.nodes}
        for group in self.groups:
            group.nodes.sort(key=index.__getitem__)

    def dependencies(self, group: Group) -> list[Group]:
        """Groups whose computed data this group reads (views of program inputs create no dependency)."""
        deps: list[Group] = []
        for name in group.nodes:
            node = self.graph.node(name)
            sources = self.graph.producers(node) if node.compute else []
            for p in sources:
                g = self.group_of.get(p.name)
                if g is not None and g is not group and g not in deps:
                    deps.append(g)
        return deps

    @classmethod
    def from_groups(cls, graph: Graph, groups: list[Group], *, library_gemm: bool = True) -> Fuser:
        """Adopts groups made elsewhere (an LLM's answer); raises CycleError if they depend on each other."""
        fuser = cls(graph, library_gemm=library_gemm)
        for group in groups:
            fuser.groups.append(group)
            for name in group.nodes:
                fuser.group_of[name] = group
        fuser._attach_non_compute()
        fuser._ordered(strict=True)
        return fuser

    def _ordered(self, *, strict: bool = False) -> list[Group]:
        """Groups in a topological order of their data dependencies (ties: first node first)."""
        index = {n.name: n.index for n in self.graph.nodes}
        remaining = sorted(self.groups, key=lambda g: index[g.nodes[0]])
        deps = {id(g): self.dependencies(g) for g in remaining}
        ordered: list[Group] = []
        placed: set[int] = set()
        while remaining:
            ready = next((g for g in remaining if all(id(d) in placed for d in deps[id(g)])), None)
            if ready is None:  # cannot happen with tail-only joins; groups from elsewhere may cycle
                if strict:
                    names = ", ".join("+".join(g.nodes[:3]) for g in remaining[:4])
                    raise CycleError(f"subtasks depend on each other in a cycle: {names}")
                ready = remaining[0]
            remaining.remove(ready)
            placed.add(id(ready))
            ordered.append(ready)
        for i, group in enumerate(ordered, start=1):
            group.id = f"st{i}"
        self.groups = ordered
        return ordered


def fuse(graph: Graph, *, library_gemm: bool = True) -> tuple[list[Group], Fuser]:
    fuser = Fuser(graph, library_gemm=library_gemm)
    return fuser.run(), fuser
