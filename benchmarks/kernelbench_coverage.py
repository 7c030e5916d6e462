"""Which KernelBench problems the built-in Coder writes a CUDA program for, under each kernel policy, and
whether the Verifier's static checks accept each program under that policy (no GPU needed).

    python benchmarks/kernelbench_coverage.py ../shared/kernelbench [--levels level1 level2]

Prints, per level and policy: programs written, rejected by the static checks, and the reasons the others
were not written (grouped); the last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time
from pathlib import Path

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy
from stitchcuda.verifier.static import scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--levels", nargs="*", default=["level1", "level2"])
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="trace each reference in its own sandboxed process, as the product does (always for level 3, "
        "whose whole models can end the benchmark's own process)",
    )
    args = parser.parse_args()
    summary: dict[str, dict[str, dict[str, int]]] = {}
    for level in args.levels:
        isolated = args.isolated or level == "level3"
        # Public benchmark references, read as data; the product always traces in a sandbox.
        synth = Synthesizer(in_process=not isolated)
        problems = sorted((args.root / level).glob("*.py"))
        started = time.monotonic()
        written = dict.fromkeys((STRICT, LIBRARY), 0)
        rejected = dict.fromkeys((STRICT, LIBRARY), 0)
        reasons = {name: collections.Counter[str]() for name in (STRICT, LIBRARY)}
        for path in problems:
            source = path.read_text()
            for name in (STRICT, LIBRARY):  # both policies in a row: the second reuses the trace
                policy = KernelPolicy(name)
                try:
                    synthesis = synth.synthesize(
                        source, None, variant=Variant(), device="cuda", policy=policy
                    )
                except Unsupported as exc:
                    reasons[name][re.sub(r"^[\w.]+: ", "", str(exc)).split("\n")[0][:90]] += 1
                    continue
                except Exception as exc:  # a reference the tracer cannot follow
                    reasons[name][f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"] += 1
                    continue
                written[name] += 1
                findings = scan(to_candidate(synthesis), source, (), policy)
                if any(f.severity == verify_pb2.SEVERITY_REJECT for f in findings):
                    rejected[name] += 1
                    print(f"  REJECTED {path.stem} [{name}]")
        took = time.monotonic() - started
        for name in (STRICT, LIBRARY):
            print(f"{level} {name}: {written[name]}/{len(problems)} written, {rejected[name]} rejected")
            for reason, count in reasons[name].most_common():
                print(f"    {count:3d}  {reason}")
            summary.setdefault(level, {})[name] = {
                "problems": len(problems),
                "written": written[name],
                "rejected": rejected[name],
            }
        print(f"{level}: {took:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
