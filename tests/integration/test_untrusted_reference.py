"""A user's reference is untrusted code: in the Coder's trace, as in the Planner and the Verifier, it
cannot reach the network (the platform's Redis), write outside its own folder, read the service's
secrets, leave a process behind, run forever or take the host's memory. Real Redis at 127.0.0.1:6379,
real bubblewrap, the real embedded `stitchcuda optimize` (tests/e2e has the same hostile reference
submitted to the deployed platform)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchcuda.coder.synth.trace import TraceError, run_trace
from stitchcuda.shared.isolation import Isolation, bwrap_works
from tests.integration.hostile import MODEL, end_lingering, hostile, lingering

redis = pytest.importorskip("redis")

# A credential the service holds, in its environment and in a file of its own: the reference must not read it.
CANARY = f"canary-{uuid.uuid4().hex}"


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
        env={**os.environ, "STITCH_HOME": str(tmp_path / "home"), "STITCH_S3_SECRET_KEY": CANARY},
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


@pytest.fixture
def probe(client: redis.Redis, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """The Redis key, the outside file and the process token of one hostile run; cleaned up after."""
    key, marker, token = f"stitch-test-{uuid.uuid4().hex}", tmp_path / "marker", uuid.uuid4().hex
    yield key, marker, token
    end_lingering(token)
    client.delete(key, f"{key}:lingered")


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    """A credential file of the service's (its S3 server's, say), readable by the service's user only."""
    path = tmp_path / "s3.json"
    path.write_text(f'{{"secretKey": "{CANARY}"}}')
    path.chmod(0o600)
    return path


def assert_contained(client: redis.Redis, probe: tuple[str, Path, str]) -> None:
    key, marker, token = probe
    assert client.get(key) is None and client.get(f"{key}:lingered") is None
    assert not marker.exists() and not Path(f"{marker}.lingered").exists()
    assert lingering(token) == [], "a process the reference started outlived its run"


def test_the_hostile_reference_itself_does_all_of_it_unsandboxed(
    client: redis.Redis, probe: tuple[str, Path, str], credentials: Path, tmp_path: Path
) -> None:
    # The control: run as plain Python, the same code reads the credential file, sets the key, writes
    # the file, leaves its process behind and reports what it read.
    key, marker, token = probe
    script = tmp_path / "ref.py"
    script.write_text(hostile(key, marker, token, [credentials]))
    with (tmp_path / "stderr").open("wb") as stderr:  # a file: the lingering child keeps a pipe open
        done = subprocess.run([sys.executable, str(script)], stderr=stderr, timeout=60, check=False)
    assert done.returncode != 0 and CANARY in (tmp_path / "stderr").read_text()
    assert CANARY in (client.get(key) or b"").decode() and CANARY in marker.read_text()
    assert lingering(token), "the control leaves a process behind"


def test_the_coders_trace_cannot_reach_redis_read_secrets_write_outside_or_linger(
    client: redis.Redis, sandboxed: None, probe: tuple[str, Path, str], credentials: Path, tmp_path: Path
) -> None:
    # The trace runs in a process that holds a credential in its environment, as a Coder worker does.
    reference = tmp_path / "hostile.py"
    reference.write_text(hostile(*probe, [credentials]))
    code = (
        "import sys; from stitchcuda.coder.synth.synthesizer import Synthesizer; "
        "print('nodes', len(Synthesizer().trace(open(sys.argv[1]).read()).nodes))"
    )
    env = {**os.environ, "STITCH_S3_SECRET_KEY": CANARY}
    done = subprocess.run(
        [sys.executable, "-c", code, str(reference)], env=env, capture_output=True, text=True, timeout=300
    )
    # The reference still traces: it read no secret, and only its side effects are gone.
    assert done.returncode == 0 and "nodes" in done.stdout, done.stderr[-3000:]
    assert CANARY not in done.stdout + done.stderr
    assert_contained(client, probe)


def test_a_reference_that_never_returns_is_stopped_at_its_deadline() -> None:
    source = "while True:\n    pass\n" + MODEL
    with pytest.raises(TraceError, match="longer than 3 s"):
        run_trace(source, timeout_s=3.0)


def test_a_reference_that_allocates_without_limit_is_stopped_by_the_memory_limit() -> None:
    source = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 28))\n" + MODEL
    with pytest.raises(TraceError, match="out of memory"):
        run_trace(source, timeout_s=60.0, isolation=Isolation(memory_mb=1024))


@pytest.mark.slow
def test_embedded_optimize_keeps_the_reference_away_from_redis_secrets_and_the_host(
    client: redis.Redis, sandboxed: None, probe: tuple[str, Path, str], credentials: Path, tmp_path: Path
) -> None:
    done = optimize(tmp_path, "hostile.py", hostile(*probe, [credentials]), rounds=0, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert CANARY not in done.stdout + done.stderr
    assert_contained(client, probe)


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
