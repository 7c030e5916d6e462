"""`python -m stitchcuda.verifier [--queues ...]`: a Celery worker for the Verifier's queues."""

from __future__ import annotations

import sys

from stitchcuda.shared.celery_app import worker_main
from stitchcuda.shared.transport import VERIFIER_BUILD, VERIFIER_CPU
from stitchcuda.verifier import tasks


def main(argv: list[str] | None = None) -> int:
    return worker_main(
        "verifier", [VERIFIER_BUILD, VERIFIER_CPU], argv, runtime=tasks.runtime, build=tasks.build_runtime
    )


if __name__ == "__main__":
    sys.exit(main())
