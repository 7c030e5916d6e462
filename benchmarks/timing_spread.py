"""The same candidate verified N times through the Verifier: how much its time and its speedup move.

Issue 18's P6: one program, verified twice, must report speedups within 2 % of each other on the H200
and within 10 % on a quiet CPU. Every verification goes through VerifierService.verify (the product's
path: sandboxed runners, the node's reference store, interleaved rounds), with the default settings
unless --cached asks for the old way (the candidate timed alone against the reference run's baseline),
which shows what interleaving buys on the same machine.

    python benchmarks/timing_spread.py --device cpu --runs 12
    python benchmarks/timing_spread.py --device cpu --runs 12 --cached      # the baseline for comparison
    python benchmarks/timing_spread.py --device cuda --runs 12              # on the H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_throughput import REFERENCE, Case, kernelbench_file

from stitchcuda.shared.candidate import from_kernelbench_source
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.settings import VerifierSettings


def spread(values: list[float]) -> dict[str, float]:
    """(max - min) / median, the largest relative difference between any two runs (max / min - 1),
    and the median and standard deviation."""
    if not values:
        return {"median": 0.0, "spread": 0.0, "max_pair": 0.0, "stdev_pct": 0.0}
    mid = statistics.median(values)
    lo, hi = min(values), max(values)
    return {
        "median": mid,
        "spread": (hi - lo) / mid if mid else 0.0,
        "max_pair": hi / lo - 1 if lo > 0 else 0.0,
        "stdev_pct": 100 * statistics.pstdev(values) / mid if mid else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cached", action="store_true", help="time the candidate alone (no interleaving)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--json", type=Path, help="also write the runs and summary here")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="timing-spread-"))
    settings = VerifierSettings(home=home, interleave=not args.cached, compile_baseline=not args.no_compile)  # type: ignore[call-arg]
    service = VerifierService(settings)
    source = kernelbench_file(Case("honest-v0", 0, "honest", True), args.device)
    candidate = from_kernelbench_source(source, backend=args.device)
    reference = REFERENCE.read_text()
    runs: list[dict[str, Any]] = []
    mode = "cached baseline" if args.cached else "interleaved"
    print(f"{REFERENCE.name} on {args.device}, {args.runs} verifications of one candidate ({mode})")
    print(
        f"{'run':>3} {'cand ms':>9} {'eager ms':>9} {'vs eager':>9} {'interval':>13} {'rounds':>6} {'s':>5}"
    )
    try:
        for i in range(args.runs):
            started = time.monotonic()
            verdict = service.verify(reference, candidate, device=args.device)
            t = verdict.timing
            if not verdict.accepted:
                print(f"{i:>3} rejected: {verdict.reason}")
                return 1
            row = {
                "candidate_ms": t.median_ms,
                "eager_ms": t.eager_ms,
                "speedup_vs_eager": t.speedup_vs_eager,
                "low": t.speedup_vs_eager_low,
                "high": t.speedup_vs_eager_high,
                "speedup_vs_compile": t.speedup_vs_compile,
                "rounds": t.rounds,
                "noisy": t.noisy,
                "eager_source": t.eager_source,
                "seconds": time.monotonic() - started,
            }
            runs.append(row)
            interval = f"{row['low']:.3f}-{row['high']:.3f}" if row["high"] > 0 else "-"
            print(
                f"{i:>3} {row['candidate_ms']:>9.4f} {row['eager_ms']:>9.4f} "
                f"{row['speedup_vs_eager']:>8.3f}x "
                f"{interval:>13} {row['rounds']:>6} {row['seconds']:>5.1f}"
                + (" noisy" if row["noisy"] else "")
            )
    finally:
        service.close()
    # The first verification also built the extension and ran the reference; all count the same here.
    summary = {
        name: spread([float(r[name]) for r in runs])
        for name in ("candidate_ms", "eager_ms", "speedup_vs_eager", "speedup_vs_compile")
    }
    summary["noisy_runs"] = {"count": float(sum(1 for r in runs if r["noisy"]))}
    inside = sum(1 for r in runs if r["low"] <= summary["speedup_vs_eager"]["median"] <= r["high"])
    print()
    for name in ("candidate_ms", "eager_ms", "speedup_vs_eager", "speedup_vs_compile"):
        s = summary[name]
        print(
            f"{name:>19}: median {s['median']:.4f}  (max-min)/median {100 * s['spread']:5.1f} %  "
            f"max/min-1 {100 * s['max_pair']:5.1f} %  stdev {s['stdev_pct']:4.1f} %"
        )
    print(
        f"runs whose interval holds the median speedup: {inside} of {len(runs)}; "
        f"noisy runs: {summary['noisy_runs']['count']:.0f}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"mode": mode, "device": args.device, "runs": runs, "summary": summary}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
