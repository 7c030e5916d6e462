"""Graph rewrites that turn the idioms of reverse and exclusive scans into one scan op (one kernel pass).

    flip(scan(flip(x, d), d), d)                 -> scan(x, d, reverse)
    cumsum(x, d) - x                             -> scan(x, d, exclusive)
    cat([fill_like(.., identity), scan(x, d)[.., :-1]], d)  -> scan(x, d, exclusive)

The values a rewrite bypasses must have no other reader; they are dropped with their ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stitchcuda.coder.synth.ir import EW, FLIP, LIB, SCAN, VIEW, Const, Graph, Op, Ref

IDENTITY = {"sum": 0.0, "prod": 1.0}


def fold_scans(g: Graph) -> None:
    users = g.consumers()

    def private(ident: str) -> bool:
        return len(users.get(ident, [])) == 1 and ident not in g.outputs and ident not in g.writebacks

    dropped: set[str] = set()
    for op in g.ops:
        if op.out in dropped:
            continue
        if op.kind == LIB and op.fn == "cat" and len(op.args) == 2:
            dropped |= _exclusive_cat(g, op, private)
            continue
        src = g.producer.get(op.args[0].id) if op.args and isinstance(op.args[0], Ref) else None
        if src is None or src.kind != SCAN or not private(src.out):
            continue
        first = g.producer.get(src.args[0].id)
        if op.kind == FLIP and first is not None and _mirrors(op, src, first) and private(first.out):
            _become_scan(op, src, first.args[0], reverse=not src.attrs["reverse"])
            dropped |= {src.out, first.out}
        elif op.kind == EW and op.fn == "sub" and op.args == [Ref(src.out), src.args[0]] and _plain(src):
            _become_scan(op, src, src.args[0], exclusive=True)
            dropped.add(src.out)
    g.ops = [op for op in g.ops if op.out not in dropped]
    for ident in dropped:
        del g.values[ident], g.producer[ident]


def _become_scan(op: Op, scan: Op, x: Any, **flags: bool) -> None:
    op.kind, op.fn, op.args = SCAN, scan.fn, [x]
    op.attrs = {**scan.attrs, **flags}


def _plain(scan: Op) -> bool:
    return not scan.attrs["exclusive"] and not scan.attrs["reverse"]


def _mirrors(outer: Op, scan: Op, inner: Op) -> bool:
    """outer and inner flip exactly the scan's dim."""
    dims = [scan.attrs["dim"]]
    return inner.kind == FLIP and inner.attrs["dims"] == dims and outer.attrs["dims"] == dims


def _exclusive_cat(g: Graph, cat: Op, private: Callable[[str], bool]) -> set[str]:
    """cat([identity fill, scan[:-1]]) along the scan's dim: the values bypassed, or none if no match."""
    fill, head = (g.producer.get(a.id) if isinstance(a, Ref) else None for a in cat.args)
    if fill is None or head is None or head.kind != VIEW or head.fn != "index":
        return set()
    scan = g.producer.get(head.args[0].id)
    if scan is None or scan.kind != SCAN or not _plain(scan):
        return set()
    d = scan.attrs["dim"]
    shape = g.values[scan.out].shape
    constant = _fill_value(g, fill)
    if cat.attrs["dim"] != d or constant != IDENTITY[scan.fn] or g.values[cat.out].shape != shape:
        return set()
    if not _drops_last(head.attrs["index"], shape, d):
        return set()
    bypassed = [fill.out, head.out, scan.out, fill.args[0].id]
    if not all(private(v) for v in bypassed):
        return set()
    _become_scan(cat, scan, scan.args[0], exclusive=True)
    return set(bypassed)


def _fill_value(g: Graph, fill: Op) -> float | None:
    """The constant of a zeros_like/ones_like (a one-element constant expanded), else None."""
    if fill.kind != VIEW or fill.fn != "expand_as" or not isinstance(fill.args[0], Ref):
        return None
    one = g.producer.get(fill.args[0].id)
    if one is None or one.kind != EW or one.fn != "identity" or not isinstance(one.args[0], Const):
        return None
    return float(one.args[0].value)


def _drops_last(items: list[Any], shape: tuple[int, ...], d: int) -> bool:
    """The index is `[:-1]` along dim d and whole along every other dim."""
    if any(not (isinstance(it, tuple) and it and it[0] in ("slice", "ellipsis")) for it in items):
        return False  # integer indices and None (new dims) change the rank
    slices = [it for it in items if it[0] == "slice"]
    if sum(it[0] == "ellipsis" for it in items) > 1 or len(slices) > len(shape):
        return False
    at = next((i for i, it in enumerate(items) if it[0] == "ellipsis"), len(items))
    full = ("slice", None, None, None)
    expanded = [*items[:at], *[full] * (len(shape) - len(slices)), *items[at + 1 :]]
    for dim, (_, start, stop, step) in enumerate(expanded):
        if _const(start, 0) != 0 or _const(step, 1) != 1:
            return False
        end = _const(stop, shape[dim])
        if end is None or (end not in (-1, shape[dim] - 1) if dim == d else end < shape[dim]):
            return False
    return True


def _const(value: Any, default: int) -> int | None:
    """A slice bound as an int (None: the default); None for a bound known only at run time."""
    if value is None:
        return default
    if isinstance(value, Const) and isinstance(value.value, int) and not isinstance(value.value, bool):
        return value.value
    return None
