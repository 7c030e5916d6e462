"""Cold and warm time to verdict of one candidate through the Verifier's own path, in one process.

    python benchmarks/warm_verify.py REFERENCE.py CANDIDATE_DIR [--device cuda] [--times 3] [--policy library]

The first verification is cold (build, reference run, a runner started for it); the next ones are warm, as an
optimize round of the same job is: the build is cached, the reference's results are reused and the runner
is a standby started after the previous run. Prints one line per verification with its stage seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.verifier.service import VerifierService


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--policy", default="", help="kernel policy (strict or library; default: settings)")
    args = parser.parse_args()
    service = VerifierService()
    policy = verify_pb2.VerifyPolicy(kernel_policy=args.policy)
    try:
        for i in range(args.times):
            started = time.monotonic()
            verdict = service.verify_dir(args.reference, args.candidate, device=args.device, policy=policy)
            wall = time.monotonic() - started
            stages = " ".join(f"{k} {v:.2f}" for k, v in sorted(verdict.stage_seconds.items()))
            kind = "cold" if i == 0 else "warm"
            print(f"{kind} {i}: {wall:.2f} s  {verdict.reason}  [{stages}]", flush=True)
            if i < args.times - 1:
                service.candidates.settle()  # the next run's standby is ready, as between two rounds
    finally:
        service.close()


if __name__ == "__main__":
    main()
