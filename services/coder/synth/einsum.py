"""torch.einsum of two operands as one batched GEMM of the synthesizer's own kernel (variant gemm=custom).

Each label of the equation is a batch label (both operands and the output), an M label (the first operand
and the output), an N label (the second operand and the output) or a K label (both operands, summed). The
operands are permuted to [batch, M, K] and [batch, K, N] and flattened, and the [batch, M, N] product is
viewed with the labels' sizes and permuted to the output's order. Traces, diagonals and labels summed in
one operand only have no GEMM form: those equations stay unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchcuda.coder.synth.ir import Unsupported

HOST = r"""
// einsum of two operands as a batched GEMM: the operands permuted to [batch..., M..., K...] and
// [batch..., K..., N...] (the grouping of the equation's labels is decided at synthesis), the product
// [batch..., M..., N...] permuted to the output's label order.
at::Tensor stitch_einsum_gemm(const at::Tensor& a, const at::Tensor& b, const std::vector<int64_t>& perm_a,
                              const std::vector<int64_t>& perm_b, int64_t nbatch, int64_t nm, int64_t nn,
                              const std::vector<int64_t>& perm_out) {
  const at::Tensor ap = a.permute(perm_a), bp = b.permute(perm_b);
  const int64_t nk = ap.dim() - nbatch - nm;
  TORCH_CHECK(bp.dim() == nbatch + nk + nn, "einsum: operand ranks");
  std::vector<int64_t> sizes;
  int64_t batch = 1, M = 1, K = 1, N = 1;
  for (int64_t d = 0; d < nbatch; ++d) {
    TORCH_CHECK(ap.size(d) == bp.size(d), "einsum: batch label sizes differ");
    batch *= ap.size(d);
    sizes.push_back(ap.size(d));
  }
  for (int64_t d = nbatch; d < nbatch + nm; ++d) {
    M *= ap.size(d);
    sizes.push_back(ap.size(d));
  }
  for (int64_t d = 0; d < nk; ++d) {
    TORCH_CHECK(ap.size(nbatch + nm + d) == bp.size(nbatch + d), "einsum: summed label sizes differ");
    K *= ap.size(nbatch + nm + d);
  }
  for (int64_t d = nbatch + nk; d < bp.dim(); ++d) {
    N *= bp.size(d);
    sizes.push_back(bp.size(d));
  }
  const at::Tensor C =
      stitch_bgemm(stitch_reshape(ap, {batch, M, K}), stitch_reshape(bp, {batch, K, N}), c10::nullopt);
  return C.view(sizes).permute(perm_out);
}
"""


@dataclass(frozen=True)
class EinsumGemm:
    """How a two-operand einsum maps to stitch_einsum_gemm's arguments."""

    perm_a: list[int]
    perm_b: list[int]
    nbatch: int
    nm: int
    nn: int
    perm_out: list[int]


def _expand(spec: str, rank: int, fresh: str) -> str:
    """The labels of one operand or output, '...' replaced by the trailing `rank`-dependent fresh labels."""
    if "..." not in spec:
        if len(spec) != rank:
            raise Unsupported(f"einsum: {spec!r} does not match an operand of rank {rank}")
        return spec
    covered = rank - (len(spec) - 3)
    if covered < 0:
        raise Unsupported(f"einsum: {spec!r} has more labels than its operand's rank {rank}")
    return spec.replace("...", fresh[len(fresh) - covered :] if covered else "")


def plan(equation: str, shapes: list[tuple[int, ...]]) -> EinsumGemm:
    """The GEMM form of `equation` over operands of the traced `shapes`, or Unsupported where it has none."""
    eq = equation.replace(" ", "")
    ranks = [len(s) for s in shapes]
    if len(ranks) != 2:
        raise Unsupported(f"einsum {equation!r}: {len(ranks)} operands (the GEMM form takes two)")
    lhs, _, rhs = eq.partition("->")
    specs = lhs.split(",")
    if len(specs) != 2:
        raise Unsupported(f"einsum {equation!r}: equation and operands disagree")
    used = set(eq) - {".", ",", "-", ">"}
    pool = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used)
    ellipsis = max((r - (len(s) - 3) for s, r in zip(specs, ranks, strict=True) if "..." in s), default=0)
    fresh = pool[: max(ellipsis, 0)]
    a, b = (_expand(s, r, fresh) for s, r in zip(specs, ranks, strict=True))
    if "->" in eq:
        out = rhs.replace("...", fresh)
    else:  # implicit output: the broadcast dims, then the labels seen once, in alphabetical order
        out = fresh + "".join(sorted(c for c in set(a + b) - set(fresh) if (a + b).count(c) == 1))
    for spec in (a, b, out):
        if len(set(spec)) != len(spec):
            raise Unsupported(f"einsum {equation!r}: a repeated label (a diagonal) has no GEMM form")
    if set(out) - set(a) - set(b):
        raise Unsupported(f"einsum {equation!r}: an output label found in no operand")
    if (set(a) ^ set(b)) - set(out):
        raise Unsupported(f"einsum {equation!r}: a label summed within one operand has no GEMM form")
    sizes = [dict(zip(spec, shape, strict=True)) for spec, shape in zip((a, b), shapes, strict=True)]
    if any(sizes[0][c] != sizes[1][c] for c in set(a) & set(b)):
        raise Unsupported(f"einsum {equation!r}: a label broadcast from size 1 has no GEMM form")
    batch = [c for c in out if c in a and c in b]
    m = [c for c in out if c in a and c not in b]
    n = [c for c in out if c in b and c not in a]
    k = [c for c in a if c in b and c not in out]
    product = batch + m + n
    return EinsumGemm(
        perm_a=[a.index(c) for c in batch + m + k],
        perm_b=[b.index(c) for c in batch + k + n],
        nbatch=len(batch),
        nm=len(m),
        nn=len(n),
        perm_out=[product.index(c) for c in out],
    )
