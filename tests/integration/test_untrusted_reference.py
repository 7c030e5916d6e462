"""A user's reference is untrusted code: in the Coder's trace, as in the Planner and the Verifier, it
cannot reach the network (the platform's Redis), write outside its own folder, run forever or take the
host's memory. Real Redis at 127.0.0.1:6379, real bubblewrap, the real embedded `stitchcuda optimize`."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stitchcuda.coder.synth.synthesizer import Synthesizer
from stitchcuda.coder.synth.trace import TraceError, run_trace
from stitchcuda.shared.isolation import Isolation, bwrap_works

redis = pytest.importorskip("redis")

MODEL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
"""


def hostile(key: str, marker: Path) -> str:
    """A reference whose import-time code tries Redis and a file outside its folder, then behaves."""
    return (
        "import socket\n"
        "try:\n"
        "    s = socket.create_connection(('127.0.0.1', 6379), timeout=2)\n"
        f"    s.sendall(b'*3\\r\\n$3\\r\\nSET\\r\\n${len(key)}\\r\\n{key}\\r\\n$5\\r\\nowned\\r\\n')\n"
        "    s.recv(16)\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        f"    open({str(marker)!r}, 'w').write('owned')\n"
        "except OSError:\n"
        "    pass\n" + MODEL
    )


def optimize(
    tmp_path: Path, name: str, source: str, *, rounds: int, timeout: float
) -> subprocess.CompletedProcess[str]:
    """The embedded `stitchcuda optimize` on `source` (CPU), in its own home under `tmp_path`."""
    problem = tmp_path / name
    problem.write_text(source)
    cmd = [sys.executable, "-m", "stitchcuda.cli", "optimize", str(problem), "--device", "cpu"]
    return subprocess.run(
        [*cmd, "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "STITCH_HOME": str(tmp_path / "home")},
        cwd=tmp_path,
        check=False,
    )


@pytest.fixture
def client() -> redis.Redis:
    c = redis.Redis(host="127.0.0.1", port=6379)
    try:
        c.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    return c


@pytest.fixture
def sandboxed() -> None:
    if not bwrap_works(False):
        pytest.skip("bubblewrap cannot start a sandbox on this machine")


def test_the_hostile_reference_itself_reaches_redis_unsandboxed(client: redis.Redis, tmp_path: Path) -> None:
    # The control: run as plain Python, the same code does set the key and write the file.
    key, marker = f"stitch-test-{uuid.uuid4().hex}", tmp_path / "marker"
    script = tmp_path / "ref.py"
    script.write_text(hostile(key, marker))
    subprocess.run([sys.executable, str(script)], check=True, timeout=60)
    try:
        assert client.get(key) == b"owned" and marker.read_text() == "owned"
    finally:
        client.delete(key)


def test_the_coders_trace_cannot_reach_redis_or_write_outside(
    client: redis.Redis, sandboxed: None, tmp_path: Path
) -> None:
    key, marker = f"stitch-test-{uuid.uuid4().hex}", tmp_path / "marker"
    trace = Synthesizer().trace(hostile(key, marker))
    assert trace.nodes  # the reference still traces: only its side effects are gone
    assert client.get(key) is None
    assert not marker.exists()


def test_a_reference_that_never_returns_is_stopped_at_its_deadline() -> None:
    source = "while True:\n    pass\n" + MODEL
    with pytest.raises(TraceError, match="longer than 3 s"):
        run_trace(source, timeout_s=3.0)


def test_a_reference_that_allocates_without_limit_is_stopped_by_the_memory_limit() -> None:
    source = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 28))\n" + MODEL
    with pytest.raises(TraceError, match="out of memory"):
        run_trace(source, timeout_s=60.0, isolation=Isolation(memory_mb=1024))


@pytest.mark.slow
def test_embedded_optimize_keeps_the_reference_away_from_redis(
    client: redis.Redis, sandboxed: None, tmp_path: Path
) -> None:
    key, marker = f"stitch-test-{uuid.uuid4().hex}", tmp_path / "marker"
    done = optimize(tmp_path, "hostile.py", hostile(key, marker), rounds=0, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert client.get(key) is None
    assert not marker.exists()


LOOPING = MODEL.replace(
    "        return torch.relu(x) * 2.0", "        while True:\n            x = x + 1\n        return x"
)


@pytest.mark.slow
def test_embedded_optimize_of_a_reference_that_loops_forever_ends_within_a_minute(tmp_path: Path) -> None:
    done = optimize(tmp_path, "looping.py", LOOPING, rounds=2, timeout=300)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0
    assert "it loops or hangs" in output and "(error code reference_timeout)" in output, output[-2000:]
    assert "coding" not in output  # nothing downstream ran the reference again
