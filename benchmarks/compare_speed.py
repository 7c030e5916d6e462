"""The Verifier's output comparison (the verdict's `compare` stage) against the whole-array version it
replaced, side by side on one machine, at a KernelBench level-2 output size.

    python benchmarks/compare_speed.py [--rows 1024] [--cols 8192] [--sets 13] [--repeat 3]

Per input set the Verifier checks one output against its float64 ground truth (`compare.check_output`) and,
once per reference, derives the tolerances from the float32-vs-float64 error (`compare.tolerances`). The
whole-array version made float64 temporaries of the whole output and a boolean mask per finiteness test.
Prints seconds for all sets, best of --repeat, and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchcuda.verifier import compare


def whole_array_errors(candidate: torch.Tensor, target: torch.Tensor) -> tuple[float, float, float]:
    c, t = candidate.double().reshape(-1), target.double().reshape(-1)
    fc, ft = torch.isfinite(c), torch.isfinite(t)
    if not (bool(fc.all()) and bool(ft.all())):
        c, t = c[fc & ft], t[fc & ft]
    diff = c - t
    max_abs = float(diff.abs().max())
    norm_t = float(torch.linalg.vector_norm(t))
    rel_l2 = float(torch.linalg.vector_norm(diff)) / norm_t if norm_t > 0 else max_abs
    return rel_l2, max_abs / float(t.abs().max()), max_abs


def whole_array_check(candidate: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor) -> float:
    assert bool(torch.isfinite(candidate).all()) and bool(torch.isfinite(ref32).all())
    target = ref64.double()
    assert bool(torch.isfinite(target).all())
    return whole_array_errors(candidate, target)[0]


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--sets", type=int, default=13)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    ref64 = [torch.randn(args.rows, args.cols, dtype=torch.float64) for _ in range(args.sets)]
    ref32 = [r.float() for r in ref64]
    cands = [r + 1e-7 * torch.randn_like(r) for r in ref32]
    tol = compare.Tolerance(1e-4, 1e-3, 0.0, 0.0)
    refs = [([a], [b]) for a, b in zip(ref32, ref64, strict=True)]

    def now_check() -> None:
        for c, a, b in zip(cands, ref32, ref64, strict=True):
            assert compare.check_output(c, a, b, tol).ok

    def old_check() -> None:
        for c, a, b in zip(cands, ref32, ref64, strict=True):
            assert whole_array_check(c, a, b) <= tol.rel_l2

    def now_tol() -> None:
        compare.tolerances(refs, floor=1e-5, max_floor=1e-4, factor=10.0)

    def old_tol() -> None:
        for a, b in refs:
            whole_array_errors(a[0], b[0])

    mib = args.rows * args.cols * 4 / (1 << 20)
    print(f"{args.sets} sets of one {args.rows}x{args.cols} float32 output ({mib:.0f} MiB each), "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    for label, new, old in (("check outputs", now_check, old_check), ("tolerances", now_tol, old_tol)):
        t_new, t_old = best(new, args.repeat), best(old, args.repeat)
        print(f"{label:14s} chunked {t_new:7.3f} s   whole-array {t_old:7.3f} s   {t_old / t_new:5.1f}x")


if __name__ == "__main__":
    main()
