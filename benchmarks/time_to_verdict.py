"""Time to verdict per problem from the logs `stitchcuda bench` keeps (one per problem, run with
STITCH_LOG_LEVEL=INFO), as a markdown table with the median.

    python benchmarks/time_to_verdict.py BENCH_OUT [BENCH_OUT ...]

Time to verdict is the candidate's build plus the Verifier's verify stage (reference wait or run, candidate
run, evaluation), as the verdict's own stage seconds give it; the wait for the GPU slot behind other problems
is not in it. `reference ahead` is the run of the reference that started when the plan was ready (empty where
the reference ran inside the verify stage), `job` the problem's whole wall time in the bench.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

_BUILD = re.compile(r"build [0-9a-f]+: ok in ([0-9.]+) s")
_VERDICT = re.compile(r"verdict \S+: (\w+)(.*) \(([0-9.]+) s: ([^)]*)\)")
_SPEEDUPS = re.compile(r"([0-9.]+)x \([^)]*\) vs eager(?:, ([0-9.]+)x \([^)]*\) vs torch.compile)?")
_AHEAD = re.compile(r"reference ready ahead of verification in ([0-9.]+) s")
_END = re.compile(r"^\s*([0-9.]+)s\s+(?:succeeded|failed)", re.MULTILINE)


def row(log: Path) -> dict[str, object] | None:
    text = log.read_text(errors="replace")
    verdict = _VERDICT.search(text)
    if verdict is None:
        return None
    stages = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", verdict.group(4))}
    speedups = _SPEEDUPS.search(verdict.group(2))
    build = _BUILD.search(text)
    ahead = _AHEAD.search(text)
    end = _END.findall(text)
    build_s = float(build.group(1)) if build else 0.0
    return {
        "problem": log.stem,
        "verdict": verdict.group(1),
        "vs_eager": speedups.group(1) if speedups else "",
        "vs_compile": (speedups.group(2) or "") if speedups else "",
        "build_s": build_s,
        "verify_s": float(verdict.group(3)),
        "ttv_s": round(build_s + float(verdict.group(3)), 1),
        "reference_s": stages.get("reference", 0.0),
        "run_s": stages.get("run", 0.0),
        "compare_s": stages.get("compare", 0.0),
        "ahead_s": ahead.group(1) if ahead else "",
        "job_s": end[-1] if end else "",
    }


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = [r for out in sys.argv[1:] for log in sorted(Path(out).rglob("logs/**/*.log")) if (r := row(log))]
    if not rows:
        sys.exit("no verdict in the logs under " + " ".join(sys.argv[1:]))
    head = list(rows[0])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in head) + " |")
    ttv = [float(str(r["ttv_s"])) for r in rows]
    print(f"\nmedian time to verdict {statistics.median(ttv):.1f} s over {len(rows)} verdicts")


if __name__ == "__main__":
    main()
