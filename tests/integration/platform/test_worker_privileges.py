"""A worker started as root says so in one line of its own, not in Celery's SecurityWarning page."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.integration.platform.harness import REDIS_URL, SECRET, Proc, wait_for

pytestmark = pytest.mark.integration


def test_a_worker_names_a_root_user_once_and_celery_stays_quiet(redis_db: object, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "STITCH_ENVIRONMENT": "test",
        "STITCH_JOB_STORE": "redis",
        "STITCH_REDIS_URL": REDIS_URL,
        "STITCH_ARTIFACT_STORE": "local",
        "STITCH_HOME": str(tmp_path / "home"),
        "STITCH_SECRET_KEY": SECRET,
        "STITCH_METRICS_PORT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    proc = Proc("planner", [sys.executable, "-m", "stitchcuda.planner"], env, tmp_path / "planner.log")
    proc.start()
    try:
        wait_for(lambda: "ready." in proc.tail(400) or not proc.alive(), 90, "the planner worker")
        assert proc.alive(), proc.tail()
    finally:
        proc.stop()
    log = proc.tail(400)
    assert "SecurityWarning" not in log and "superuser" not in log, log
    root_lines = [line for line in log.splitlines() if "runs as root" in line]
    assert len(root_lines) == (1 if os.geteuid() == 0 else 0), log
    if root_lines:
        assert root_lines[0].startswith("WARNING stitchcuda.celery: planner worker runs as root")
