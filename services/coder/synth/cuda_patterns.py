"""Reduction pairs a row kernel can compute in one pass instead of two: a softmax's maximum with its sum of
exp(x - max) (a running maximum), and a normalization's mean with its mean squared deviation (sums of x and
x^2 in double, whose difference keeps fp32 accuracy for any row a float32 tensor holds)."""

from __future__ import annotations

from stitchcuda.coder.synth.codegen import KernelInfo, Reduction
from stitchcuda.coder.synth.ir import Const, Ref


def _levels(info: KernelInfo) -> tuple[Reduction, Reduction] | None:
    """The only reduction of level 1 and the only one of level 2 (of a kernel with two levels or more)."""
    lv1 = [r for r in info.reductions if r.level == 1]
    lv2 = [r for r in info.reductions if r.level == 2]
    if len(lv1) != 1 or len(lv2) != 1:
        return None
    r1 = lv1[0]
    # The first reduction's argument must vary along the row (a row value would not be seen by the pass).
    if not isinstance(r1.op.args[0], Ref) or info.row_level.get(r1.op.args[0].id, False):
        return None
    return r1, lv2[0]


def _deviation_of(info: KernelInfo, ident: str, r1: Reduction) -> bool:
    """Is `ident` x - r1 with x the argument of r1?"""
    sub = info.ops.get(ident)
    return (
        sub is not None
        and sub.kind == "ew"
        and sub.fn == "sub"
        and sub.args == [r1.op.args[0], Ref(r1.op.out)]
    )


def online_softmax_pair(info: KernelInfo) -> tuple[Reduction, Reduction] | None:
    """(max, sum): level 1 is amax(x) alone, level 2 sum(exp(x - max)) alone."""
    pair = _levels(info)
    if pair is None or pair[0].op.fn != "amax" or pair[1].op.fn != "sum":
        return None
    r1, r2 = pair
    arg = r2.op.args[0]
    exp = info.ops.get(arg.id) if isinstance(arg, Ref) else None
    if exp is None or exp.kind != "ew" or exp.fn != "exp" or not isinstance(exp.args[0], Ref):
        return None
    return pair if _deviation_of(info, exp.args[0].id, r1) else None


def moments_pair(info: KernelInfo) -> tuple[Reduction, Reduction] | None:
    """(mean, variance): level 1 is mean(x) alone, level 2 mean((x - mean)^2) alone (LayerNorm, GroupNorm)."""
    pair = _levels(info)
    if pair is None or pair[0].op.fn != "mean" or pair[1].op.fn != "mean":
        return None
    r1, r2 = pair
    arg = r2.op.args[0]
    sq = info.ops.get(arg.id) if isinstance(arg, Ref) else None
    if sq is None or sq.kind != "ew" or not sq.args or not isinstance(sq.args[0], Ref):
        return None
    squared = (
        (sq.fn == "mul" and sq.args[0] == sq.args[1])
        or sq.fn == "square"
        or (sq.fn == "pow" and isinstance(sq.args[1], Const) and float(sq.args[1].value) == 2.0)
    )
    return pair if squared and _deviation_of(info, sq.args[0].id, r1) else None


def moments_finish(mean: str, var: str, s1: str, s2: str) -> list[str]:
    """The mean and the (biased) variance of a row from its sums of x and x^2; NaN stays NaN."""
    return [
        f"const double mu_ = {s1} / static_cast<double>(cols);",
        f"const double var_ = {s2} / static_cast<double>(cols) - mu_ * mu_;",
        f"const float {mean} = static_cast<float>(mu_);",
        f"const float {var} = static_cast<float>(var_ < 0.0 ? 0.0 : var_);",
    ]
