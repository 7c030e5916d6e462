"""`stitchcuda bench` as a user runs it: the real loop on a folder of suite problems, killed and resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROBLEMS, REPO

pytestmark = pytest.mark.slow

# The two quickest suite problems on a CPU (one build each; the build cache is shared across the runs below).
NAMES = ("01_elementwise_chain", "02_swish_clamp")


def bench_cmd(suite: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stitchcuda.cli",
        "bench",
        str(suite),
        "--device",
        "cpu",
        "--rounds",
        "0",
        "--out",
        str(out),
        *extra,
    ]


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "STITCH_HOME": str(home)}


def table(out: Path) -> list[tuple[str, str, bool]]:
    data = json.loads((out / "results.json").read_text())
    return [(r["level"], r["problem"], r["verified"]) for r in data["rows"]]


def test_bench_resumes_after_a_kill_with_the_same_table(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in NAMES:
        (suite / f"{name}.py").write_text((PROBLEMS / f"{name}.py").read_text())
    env = env_for(tmp_path / "home")
    out = tmp_path / "resumed"
    first = out / "problems" / "suite" / f"{NAMES[0]}.json"

    proc = subprocess.Popen(
        bench_cmd(suite, out), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 400
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first problem's result was not written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = first.read_text()
    assert not (out / "problems" / "suite" / f"{NAMES[1]}.json").exists()
    time.sleep(2)  # the orphaned worker notices its bench is gone and stops without writing a result
    assert not (out / "problems" / "suite" / f"{NAMES[1]}.json").exists()

    resumed = subprocess.run(
        bench_cmd(suite, out), cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode in (0, 1), resumed.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert (data["skipped"], data["ran"], data["complete"]) == (1, 1, True)
    assert first.read_text() == kept  # the finished problem was not run again

    fresh_out = tmp_path / "fresh"
    fresh = subprocess.run(
        bench_cmd(suite, fresh_out, "--jobs", "2"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fresh.returncode in (0, 1), fresh.stderr[-3000:]
    assert table(out) == table(fresh_out)
    assert [r[1] for r in table(out)] == list(NAMES)
    assert resumed.returncode == (0 if all(r[2] for r in table(out)) else 1)

    row = json.loads(first.read_text())
    assert row["settings"] == {"device": "cpu", "rounds": 0, "policy": "strict", "backend": "builtin"}
    if row["verified"]:
        assert row["speedup_vs_eager"] > 0 and row["custom_share"] is not None and row["rounds"] == 1
    else:
        assert row["reason"]
    summary = data["summary"]["overall"]
    assert summary["problems"] == 2 and summary["fast_p"]["eager"]["0"] == summary["verified_rate"]
    page = (out / "report.html").read_text()
    assert (
        page.count("<svg") == 2
        and "polyline" in page
        and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    )


def test_bench_usage_errors_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, tmp_path / "missing"):
        proc = subprocess.run(
            bench_cmd(target, tmp_path / "out"),
            cwd=REPO,
            env=env_for(tmp_path / "home"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert "error:" in proc.stderr
