"""`python -m stitchcuda.coder`: a Celery worker for the Coder's queues, configured by the environment."""

from __future__ import annotations

import sys

from stitchcuda.coder import tasks
from stitchcuda.shared.celery_app import worker_main
from stitchcuda.shared.transport import CODER


def main(argv: list[str] | None = None) -> int:
    return worker_main("coder", [CODER], argv, runtime=tasks.runtime, build=tasks.build_runtime)


if __name__ == "__main__":
    sys.exit(main())
