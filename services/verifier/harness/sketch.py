"""Summaries of outputs too large to keep whole (stdlib + torch only; the runners and the parent share it).

A KernelBench level-1 output can be 6 GiB: the parent cannot hold the float64 ground truth of every
input set, nor every output a candidate sends. For such an output the reference runner sends a summary
of its ground truth, and the parent reduces each candidate output to the same summary on arrival and
drops it. A summary keeps:

- the values at a secret random sample of positions (the positions come from the reference runner,
  drawn from a seed the candidate never sees) and the first and last `edge` values exactly;
- the L2 norm of every one of `blocks` contiguous blocks, the global norm and peak of the finite values;
- the counts of NaN, +Inf and -Inf.

What it proves: the sample estimates the relative L2 error and bounds the max error where it looked;
the block norms catch any error that changes the energy of a region (a zeroed or skipped tile, a lost
tail), with no false alarm possible, since | ||c_b|| - ||t_b|| | <= ||c_b - t_b|| for every block;
head and tail catch boundary bugs. What it gives up: an energy-preserving error confined to fewer
positions than the sample is likely to hit (about numel / samples of them) can pass.
"""

from __future__ import annotations

from typing import Any, TypeGuard

MARK = "summary"
CHUNK = 1 << 25  # elements converted to float64 at a time
SUB = 1024  # elements per float32 partial norm (see _fast_norms)


def wanted(t: Any, min_numel: int) -> bool:
    import torch

    return (
        min_numel > 0
        and isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.numel() >= max(min_numel, 4)
    )


def positions(numel: int, samples: int, seed: int) -> Any:
    """Sorted sample positions (repeats allowed) drawn from `seed`."""
    import torch

    gen = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randint(0, numel, (min(samples, numel),), generator=gen).sort().values


def summarize(t: Any, idx: Any, blocks: int, edge: int) -> dict[str, Any]:
    """The summary of tensor `t` (any device) at sample positions `idx`; CPU tensors and numbers only."""
    import torch

    flat = t.detach().reshape(-1)
    n = flat.numel()
    blocks = max(1, min(blocks, n))
    edge = max(min(edge, n // 2), 0)
    per = n // blocks
    body = flat[: per * blocks].view(blocks, per)
    norms = torch.empty(blocks, dtype=torch.float64)
    counts = {"nan": 0, "posinf": 0, "neginf": 0}
    peak = 0.0
    rows = max(1, CHUNK // max(per, 1))
    for r0 in range(0, blocks, rows):
        part = body[r0 : r0 + rows]
        fast = _fast_norms(part)
        if fast is not None:  # every value finite: no masks, no float64 copy
            norms[r0 : r0 + rows], part_peak = fast
            peak = max(peak, part_peak)
            continue
        part = _finite(part, counts)
        norms[r0 : r0 + rows] = torch.linalg.vector_norm(part, dim=1, dtype=torch.float64).cpu()
        if part.numel():
            peak = max(peak, float(part.abs().max()))
    rest = _finite(flat[per * blocks :].double(), counts)
    if rest.numel():
        peak = max(peak, float(rest.abs().max()))
    norm = float(torch.sqrt(norms.square().sum() + rest.square().sum().cpu()))
    return {
        "kind": MARK,
        "shape": list(t.shape),
        "dtype": str(t.dtype),
        "numel": n,
        "samples": flat[idx.to(flat.device)].double().cpu(),
        # Copies, not views: a view of a float64 CPU tensor would carry (and keep) its whole storage.
        "head": flat[:edge].double().cpu().clone(),
        "tail": flat[n - edge :].double().cpu().clone(),
        "block_norms": norms,
        "norm": norm,
        "peak": peak,
        **counts,
    }


def _fast_norms(part: Any) -> tuple[Any, float] | None:
    """The float64 L2 norms of the rows of `part` and its peak |value|, or None if a value is not finite.

    The parent summarises every large output a candidate sends (twelve per verification, GiBs each), so
    this is on the time to verdict. A float32 row is reduced as float32 norms of SUB-element pieces
    combined in float64: the pieces' error is ~1e-8 relative (a float64 copy is 10-25x slower, one
    float32 norm of a long row is 1e-2 off). A NaN/Inf value, or a float32 square that overflows, makes
    a norm non-finite: the caller then takes the exact path that counts and masks them."""
    import torch

    if part.numel() == 0:
        return None
    whole = part.shape[1] // SUB * SUB if part.dtype != torch.float64 else 0
    if whole:
        squares = torch.linalg.vector_norm(part[:, :whole].unflatten(1, (-1, SUB)), dim=2).double()
        sq = squares.square().sum(dim=1)
        if whole < part.shape[1]:
            sq += torch.linalg.vector_norm(part[:, whole:], dim=1, dtype=torch.float64).square()
        norms = sq.sqrt()
    else:
        norms = torch.linalg.vector_norm(part, dim=1, dtype=torch.float64)
    if not bool(torch.isfinite(norms).all()):
        return None
    low, high = torch.aminmax(part)
    return norms.cpu(), max(-float(low), float(high))


def _finite(part: Any, counts: dict[str, int]) -> Any:
    """`part` with NaN/Inf replaced by zeros, adding them to `counts`; `part` itself when all finite."""
    import torch

    if bool(torch.isfinite(part).all()):
        return part
    counts["nan"] += int(torch.isnan(part).sum())
    counts["posinf"] += int(torch.isposinf(part).sum())
    counts["neginf"] += int(torch.isneginf(part).sum())
    return torch.where(torch.isfinite(part), part, torch.zeros((), dtype=part.dtype, device=part.device))


def is_summary(x: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(x, dict) and x.get("kind") == MARK


def reference_summary(ref32: Any, ref64: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The summary of one large reference output: its float64 target, where float32 has NaN/Inf, the
    sample positions, and the float32 result's own exact error against float64 (the tolerance's base)."""
    import torch

    idx = positions(ref32.numel(), int(spec["samples"]), int(spec["seed"]))
    target = ref32
    err_l2 = err_max = 0.0
    measured = isinstance(ref64, torch.Tensor) and ref64.shape == ref32.shape
    if measured:
        # In place: where float64 overflowed, float32's value is the target (no full-size float64
        # temporaries: at level-1 sizes each would be 14 GiB on the GPU).
        if ref64.device != ref32.device:  # float64 computed on the CPU: summarise there
            ref32 = ref32.to(ref64.device)
        target = ref64
        bad = ~torch.isfinite(target)
        if bool(bad.any()):
            target[bad] = ref32[bad].double()
        del bad
        err_l2, err_max = errors(ref32, target)
    out = summarize(target, idx, int(spec["blocks"]), int(spec["edge"]))
    own = summarize(ref32, idx, 1, 0)
    out.update(
        dtype=str(ref32.dtype),
        idx=idx,
        samples32=own["samples"],
        nan=own["nan"],
        posinf=own["posinf"],
        neginf=own["neginf"],
        err_l2=err_l2,
        err_max=err_max,
        measured=measured,  # whether err_* are measured against float64 (a random reference has no twin)
    )
    return out


def errors(a: Any, b: Any) -> tuple[float, float]:
    """Exact relative L2 and relative max error of `a` against `b` over finite positions, in chunks."""
    import torch

    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    sq_diff = sq_ref = 0.0
    max_diff = peak = 0.0
    for i in range(0, fa.numel(), CHUNK):
        x, y = fa[i : i + CHUNK].double(), fb[i : i + CHUNK].double()
        keep = torch.isfinite(x) & torch.isfinite(y)
        d = torch.where(keep, x - y, torch.zeros((), dtype=x.dtype, device=x.device))
        y = torch.where(keep, y, torch.zeros((), dtype=y.dtype, device=y.device))
        sq_diff += float(d.square().sum())
        sq_ref += float(y.square().sum())
        if d.numel():
            max_diff = max(max_diff, float(d.abs().max()))
            peak = max(peak, float(y.abs().max()))
    l2 = (sq_diff**0.5) / (sq_ref**0.5) if sq_ref > 0 else sq_diff**0.5
    return l2, (max_diff / peak if peak > 0 else max_diff)
