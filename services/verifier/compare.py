"""Correctness in the trusted parent (D3): candidate outputs against float64 ground truth.

The tolerance comes from the float32 reference's own error against float64: rel_L2 <= max(floor,
factor * err_ref32) and the same for the relative max error, so precision downgrades and near-zero
outputs are caught while honest float32 rounding passes. Comparisons are written `ok = err <= tol`,
so a NaN error is a failure. NaN/Inf must sit where the float32 reference has them; dtype and shape
must match exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from stitchcuda.verifier.harness import sketch

# Extra slack when the problem declares that reduced precision is allowed (policy.allowed_precision).
PRECISION_FLOOR = {"tf32": 5e-3, "fp16": 5e-3, "float16": 5e-3, "bf16": 3e-2, "bfloat16": 3e-2}


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float
    rel_max: float
    ref_err_l2: float
    ref_err_max: float


@dataclass
class OutputCheck:
    ok: bool
    rule: str = ""
    detail: str = ""
    rel_l2: float = 0.0
    rel_max: float = 0.0
    max_abs: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class SetCheck:
    ok: bool
    outputs: list[OutputCheck]

    @property
    def worst(self) -> OutputCheck:
        failing = [o for o in self.outputs if not o.ok]
        if failing:
            return failing[0]
        return max(self.outputs, key=lambda o: o.rel_l2, default=OutputCheck(ok=True))


def all_finite(x: torch.Tensor) -> bool:
    """Whether every element is finite. A NaN or an infinity makes the sum non-finite, so a finite sum
    proves it in one pass with no mask (and no conversion: a float64 sum of float32 costs 25x); a sum that
    overflows falls back to the exact test."""
    if x.is_complex():
        return bool(torch.isfinite(x).all())
    if not x.is_floating_point():
        return True
    if math.isfinite(float(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def _finite_pair(c: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if all_finite(c) and all_finite(t):
        return c, t  # the common case: no masked copies
    mask = torch.isfinite(c) & torch.isfinite(t)
    return c[mask], t[mask]


# Elements per step of `errors`: the float64 temporaries of one step stay in cache and are reused, where
# whole-output temporaries were fresh pages (a 32 MiB output took 0.37 s to check; chunked, see the tests).
ERROR_CHUNK = 1 << 18


def errors(candidate: torch.Tensor, target: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2, max error relative to max |target|, max absolute error) over finite positions,
    accumulated in float64 over chunks of the flattened outputs."""
    cand, targ = candidate.detach().reshape(-1), target.detach().reshape(-1)
    sq_diff = sq_target = 0.0
    max_abs = peak = 0.0
    finite = 0
    for lo in range(0, targ.numel(), ERROR_CHUNK):
        c = cand[lo : lo + ERROR_CHUNK]
        # A real candidate stays in its dtype: the subtraction below computes in float64 by promotion,
        # without a converted copy (a complex one is converted as before, to its real part).
        c, t = _finite_pair(c.double() if c.is_complex() else c, targ[lo : lo + ERROR_CHUNK].double())
        if t.numel() == 0:
            continue
        finite += t.numel()
        diff = t - c  # float64, a new tensor (c may be the caller's own float64 output)
        low, high = torch.aminmax(diff)
        max_abs = max(max_abs, -float(low), float(high))
        sq_diff += float(torch.dot(diff, diff))
        sq_target += float(torch.dot(t, t))
        low, high = torch.aminmax(t)
        peak = max(peak, -float(low), float(high))
    if finite == 0:
        return 0.0, 0.0, 0.0
    norm_t = math.sqrt(sq_target)
    rel_l2 = math.sqrt(sq_diff) / norm_t if norm_t > 0 else max_abs
    rel_max = max_abs / peak if peak > 0 else max_abs
    return rel_l2, rel_max, max_abs


def tolerances(
    references: list[tuple[list[Any], list[Any] | None]],
    *,
    floor: float,
    max_floor: float,
    factor: float,
    precision: str = "",
) -> list[Tolerance]:
    """One tolerance per output, from the worst float32-vs-float64 error over every reference set."""
    if not references:
        return []
    count = len(references[0][0])
    extra = PRECISION_FLOOR.get(precision.lower(), 0.0)
    out = []
    for i in range(count):
        err_l2, err_max = 0.0, 0.0
        measured = False
        for ref32, ref64 in references:
            a = ref32[i] if i < len(ref32) else None
            b = ref64[i] if ref64 is not None and i < len(ref64) else None
            if sketch.is_summary(a):  # the runner measured a large output's own error exactly
                err_l2, err_max = max(err_l2, float(a["err_l2"])), max(err_max, float(a["err_max"]))
                measured = measured or bool(a.get("measured", True))
            elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point():
                l2, mx, _ = errors(a, b)
                err_l2, err_max = max(err_l2, l2), max(err_max, mx)
                measured = True
        # No float64 twin (a random reference): the target is the reference's own float32 result, whose
        # rounding error is unknown. It is taken to be at the floor, so the tolerance is what a reference
        # with a twin and that error gets: `factor` times it. Doubled floors were not enough on a GPU: an
        # honest LSTM with random initial states and dropout came 1.5e-5 to 7.7e-5 from cuDNN's float32
        # result (H100, stops 31-32); a wrong program's error is 1e-3 and up.
        unmeasured = 1.0 if measured else factor
        out.append(
            Tolerance(
                rel_l2=max(unmeasured * floor, extra, factor * err_l2),
                rel_max=max(unmeasured * max_floor, 10 * extra, factor * err_max),
                ref_err_l2=err_l2,
                ref_err_max=err_max,
            )
        )
    return out


def _describe_index(flat_index: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return "()"
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index //= dim if dim else 1
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


def _nonfinite_mismatch(c: torch.Tensor, r: torch.Tensor) -> str:
    if all_finite(c) and all_finite(r):
        return ""
    checks = [
        ("NaN", torch.isnan(c), torch.isnan(r)),
        ("+Inf", torch.isposinf(c), torch.isposinf(r)),
        ("-Inf", torch.isneginf(c), torch.isneginf(r)),
    ]
    for label, cm, rm in checks:
        extra = int((cm & ~rm).sum())
        missing = int((rm & ~cm).sum())
        if extra:
            return f"{extra} {label} value(s) where the reference has none"
        if missing:
            return f"{missing} {label} value(s) of the reference are missing"
    return ""


def check_output(candidate: Any, ref32: Any, ref64: Any, tol: Tolerance) -> OutputCheck:
    if sketch.is_summary(ref32):
        return check_summary(candidate, ref32, tol)
    if not isinstance(ref32, torch.Tensor):
        if isinstance(candidate, torch.Tensor):
            return OutputCheck(
                False, "D3.type", f"returned a tensor where the reference returns {type(ref32).__name__}"
            )
        if isinstance(ref32, float) and isinstance(candidate, int | float):
            err = abs(float(candidate) - ref32) / max(abs(ref32), 1e-30)
            ok = err <= tol.rel_l2
            return OutputCheck(
                ok, "" if ok else "D3.mismatch", "" if ok else f"{candidate!r} != {ref32!r}", err, err
            )
        ok = candidate == ref32
        return OutputCheck(bool(ok), "" if ok else "D3.mismatch", "" if ok else f"{candidate!r} != {ref32!r}")
    if not isinstance(candidate, torch.Tensor):
        return OutputCheck(False, "D3.type", f"returned {type(candidate).__name__}, expected a tensor")
    if candidate.dtype != ref32.dtype:
        return OutputCheck(False, "D3.dtype", f"dtype {candidate.dtype}, expected {ref32.dtype}")
    if tuple(candidate.shape) != tuple(ref32.shape):
        return OutputCheck(
            False, "D3.shape", f"shape {tuple(candidate.shape)}, expected {tuple(ref32.shape)}"
        )
    if not ref32.is_floating_point() and not ref32.is_complex():
        bad = int((candidate != ref32).sum())
        ok = bad == 0
        return OutputCheck(
            ok, "" if ok else "D3.mismatch", "" if ok else f"{bad} of {ref32.numel()} values differ"
        )
    nonfinite = _nonfinite_mismatch(candidate, ref32)
    if nonfinite:
        return OutputCheck(False, "D3.nonfinite", nonfinite)
    target = (ref64 if isinstance(ref64, torch.Tensor) and ref64.shape == ref32.shape else ref32).double()
    # Where float64 is non-finite but float32 is finite (or the other way), float32 is the target.
    if not all_finite(target):
        target = torch.where(torch.isfinite(target), target, ref32.double())
    rel_l2, rel_max, max_abs = errors(candidate, target)
    ok = rel_l2 <= tol.rel_l2 and rel_max <= tol.rel_max
    result = OutputCheck(ok, rel_l2=rel_l2, rel_max=rel_max, max_abs=max_abs)
    if not ok:
        result.rule = "D3.mismatch"
        result.stats = mismatch_stats(candidate, target, tol)
        result.detail = (
            f"rel L2 {rel_l2:.3e} (tol {tol.rel_l2:.1e}), rel max {rel_max:.3e} (tol {tol.rel_max:.1e}); "
            f"{result.stats.get('bad', 0)} of {candidate.numel()} elements off, worst at "
            f"{result.stats.get('worst_index')}: got {result.stats.get('got')}, "
            f"expected {result.stats.get('expected')}"
        )
    return result


def check_summary(candidate: Any, ref: dict[str, Any], tol: Tolerance) -> OutputCheck:
    """A large output, reduced on arrival, against the summary of its float64 target (harness.sketch):
    the sampled relative L2 error and the block-energy error (a lower bound of the true relative L2)
    against the L2 tolerance, the max error over the sampled and edge positions against the max one."""
    expected_shape = tuple(int(d) for d in ref["shape"])
    if isinstance(candidate, torch.Tensor):  # not reduced: it is not the reference's size
        if str(candidate.dtype) != ref["dtype"]:
            return OutputCheck(False, "D3.dtype", f"dtype {candidate.dtype}, expected {ref['dtype']}")
        return OutputCheck(False, "D3.shape", f"shape {tuple(candidate.shape)}, expected {expected_shape}")
    if not sketch.is_summary(candidate):
        return OutputCheck(False, "D3.type", f"returned {type(candidate).__name__}, expected a tensor")
    if candidate["dtype"] != ref["dtype"]:
        return OutputCheck(False, "D3.dtype", f"dtype {candidate['dtype']}, expected {ref['dtype']}")
    shape = tuple(int(d) for d in candidate["shape"])
    if shape != expected_shape:
        return OutputCheck(False, "D3.shape", f"shape {shape}, expected {expected_shape}")
    for key, label in (("nan", "NaN"), ("posinf", "+Inf"), ("neginf", "-Inf")):
        have, expect = int(candidate[key]), int(ref[key])
        if have > expect:
            return OutputCheck(
                False, "D3.nonfinite", f"{have - expect} {label} value(s) where the reference has none"
            )
        if have < expect:
            return OutputCheck(
                False, "D3.nonfinite", f"{expect - have} {label} value(s) of the reference are missing"
            )
    c_s, r32_s, t_s = candidate["samples"], ref["samples32"], ref["samples"]
    if (
        not (torch.isnan(c_s) == torch.isnan(r32_s)).all()
        or not (torch.isinf(c_s) == torch.isinf(r32_s)).all()
    ):
        return OutputCheck(
            False, "D3.nonfinite", "NaN/Inf at positions where the reference has finite values"
        )
    n = int(ref["numel"])
    edge = len(ref["head"])
    positions = torch.cat([ref["idx"], torch.arange(edge), torch.arange(n - edge, n)])
    got = torch.cat([c_s, candidate["head"], candidate["tail"]])
    want = torch.cat([t_s, ref["head"], ref["tail"]])
    keep = torch.isfinite(got) & torch.isfinite(want)
    diff = torch.where(keep, got - want, torch.zeros(()).double()).abs()
    sample_diff = diff[: len(t_s)]
    sample_norm = float(torch.linalg.vector_norm(torch.where(keep[: len(t_s)], t_s, 0.0)))
    sampled_l2 = (
        float(torch.linalg.vector_norm(sample_diff)) / sample_norm
        if sample_norm > 0
        else float(sample_diff.max())
    )
    norm = float(ref["norm"])
    energy_gap = float(torch.linalg.vector_norm(candidate["block_norms"] - ref["block_norms"]))
    energy_l2 = energy_gap / norm if norm > 0 else energy_gap
    max_abs = float(diff.max()) if diff.numel() else 0.0
    peak = float(ref["peak"])
    rel_max = max_abs / peak if peak > 0 else max_abs
    rel_l2 = max(sampled_l2, energy_l2)
    ok = rel_l2 <= tol.rel_l2 and rel_max <= tol.rel_max
    result = OutputCheck(ok, rel_l2=rel_l2, rel_max=rel_max, max_abs=max_abs)
    if not ok:
        worst = int(torch.argmax(diff))
        bad = int((diff > tol.rel_max * max(peak, 1e-30)).sum())
        where = _describe_index(int(positions[worst]), expected_shape)
        result.rule = "D3.mismatch"
        result.stats = {
            "bad": bad,
            "checked": int(diff.numel()),
            "worst_index": where,
            "got": float(f"{float(got[worst]):.6g}"),
            "expected": float(f"{float(want[worst]):.6g}"),
            "sampled_rel_l2": sampled_l2,
            "block_energy_rel_l2": energy_l2,
        }
        result.detail = (
            f"rel L2 {rel_l2:.3e} (tol {tol.rel_l2:.1e}; {sampled_l2:.3e} over {len(t_s)} sampled elements, "
            f"{energy_l2:.3e} from the norms of {len(ref['block_norms'])} blocks), rel max {rel_max:.3e} "
            f"(tol {tol.rel_max:.1e}); {bad} of {diff.numel()} checked elements off, worst at {where}: "
            f"got {result.stats['got']}, expected {result.stats['expected']}"
        )
    return result


def mismatch_stats(candidate: torch.Tensor, target: torch.Tensor, tol: Tolerance) -> dict[str, Any]:
    c = candidate.detach().double().reshape(-1)
    t = target.detach().double().reshape(-1)
    diff = (c - t).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    peak = float(t[torch.isfinite(t)].abs().max()) if bool(torch.isfinite(t).any()) else 1.0
    bad_mask = diff > tol.rel_max * max(peak, 1e-30)
    worst = int(torch.argmax(torch.nan_to_num(diff, posinf=1e300)))
    first_bad = int(torch.nonzero(bad_mask)[0]) if bool(bad_mask.any()) else worst
    shape = tuple(candidate.shape)
    return {
        "bad": int(bad_mask.sum()),
        "fraction": float(bad_mask.float().mean()) if c.numel() else 0.0,
        "worst_index": _describe_index(worst, shape),
        "first_bad_index": _describe_index(first_bad, shape),
        "got": float(f"{float(c[worst]):.6g}"),
        "expected": float(f"{float(t[worst]):.6g}"),
        "candidate_norm": float(torch.linalg.vector_norm(torch.nan_to_num(c))),
        "reference_norm": float(torch.linalg.vector_norm(torch.nan_to_num(t))),
    }


def check_set(
    candidate: list[Any], ref32: list[Any], ref64: list[Any] | None, tols: list[Tolerance]
) -> SetCheck:
    if len(candidate) != len(ref32):
        detail = f"returned {len(candidate)} output(s), the reference returns {len(ref32)}"
        return SetCheck(False, [OutputCheck(False, "D3.structure", detail)])
    checks = []
    for i, (c, r) in enumerate(zip(candidate, ref32, strict=True)):
        r64 = ref64[i] if ref64 is not None and i < len(ref64) else None
        tol = tols[i] if i < len(tols) else Tolerance(1e-5, 1e-4, 0.0, 0.0)
        checks.append(check_output(c, r, r64, tol))
    return SetCheck(all(o.ok for o in checks), checks)


def null_model_warnings(
    references: list[tuple[list[Any], list[Any] | None]], tols: list[Tolerance]
) -> list[str]:
    """Problem-level D3 checks: a constant would pass, or the reference ignores its inputs."""
    warnings: list[str] = []
    if not references:
        return warnings
    for i, tol in enumerate(tols):
        first = references[0][1][i] if references[0][1] is not None else references[0][0][i]
        if sketch.is_summary(references[0][0][i]):
            summary_null_model(i, [r[0][i] for r in references], tol, warnings)
            continue
        if not isinstance(first, torch.Tensor) or not first.is_floating_point() or first.numel() < 2:
            continue
        t = first.double()
        finite = t[torch.isfinite(t)]
        if finite.numel() == 0:
            continue
        constant = torch.full_like(t, float(finite.mean()))
        l2, mx, _ = errors(constant, t)
        if l2 <= tol.rel_l2 and mx <= tol.rel_max:
            warnings.append(f"output {i}: a constant ({float(finite.mean()):.4g}) would pass the tolerance")
        others = [r for r in references[1:] if isinstance(r[0][i], torch.Tensor)]
        if others and all(
            r[0][i].shape == references[0][0][i].shape
            and errors(r[0][i], references[0][0][i])[0] <= tol.rel_l2
            for r in others
        ):
            warnings.append(f"output {i}: the reference gives the same output for different inputs")
    return warnings


def summary_null_model(i: int, summaries: list[Any], tol: Tolerance, warnings: list[str]) -> None:
    """The null-model checks of a large output, on the sampled values."""
    t = summaries[0]["samples"]
    finite = t[torch.isfinite(t)]
    if finite.numel() < 2:
        return
    constant = torch.full_like(t, float(finite.mean()))
    l2, mx, _ = errors(constant, t)
    if l2 <= tol.rel_l2 and mx <= tol.rel_max:
        warnings.append(f"output {i}: a constant ({float(finite.mean()):.4g}) would pass the tolerance")
    others = [s for s in summaries[1:] if sketch.is_summary(s) and s["numel"] == summaries[0]["numel"]]
    if others and all(errors(s["samples"], t)[0] <= tol.rel_l2 for s in others):
        warnings.append(f"output {i}: the reference gives the same output for different inputs")


def _same(a: Any, b: Any) -> bool:
    if sketch.is_summary(a) and sketch.is_summary(b):
        return all(_same(a[k], b[k]) for k in ("samples", "head", "tail", "block_norms"))
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())


def identical_outputs(outputs: list[list[Any]]) -> bool:
    """True when every list holds bitwise-identical tensors (a candidate ignoring its inputs)."""
    if len(outputs) < 2:
        return False
    first = outputs[0]
    for other in outputs[1:]:
        if len(other) != len(first):
            return False
        for a, b in zip(first, other, strict=True):
            if not _same(a, b):
                return False
    return True
