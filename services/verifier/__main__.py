"""`python -m stitchcuda.verifier [--queues ...]`: the Verifier's Celery worker (configured by env).

`python -m stitchcuda.verifier verify REFERENCE.py CANDIDATE [--device ...] [--json]` prints one verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:
        from stitchcuda.verifier.cli import main as verify_main

        return int(verify_main(argv[1:]) or 0)
    from stitchcuda.shared.celery_app import worker_main
    from stitchcuda.shared.transport import VERIFIER_BUILD, VERIFIER_CPU
    from stitchcuda.verifier import tasks

    return worker_main(
        "verifier", [VERIFIER_BUILD, VERIFIER_CPU], argv, runtime=tasks.runtime, build=tasks.build_runtime
    )


if __name__ == "__main__":
    sys.exit(main())
