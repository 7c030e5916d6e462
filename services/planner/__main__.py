"""`python -m stitchcuda.planner`: a Celery worker for the Planner's queues, configured by the environment."""

from __future__ import annotations

import sys

from stitchcuda.planner import tasks
from stitchcuda.shared.celery_app import worker_main
from stitchcuda.shared.transport import PLANNER


def main(argv: list[str] | None = None) -> int:
    return worker_main("planner", [PLANNER], argv, runtime=tasks.runtime, build=tasks.build_runtime)


if __name__ == "__main__":
    sys.exit(main())
